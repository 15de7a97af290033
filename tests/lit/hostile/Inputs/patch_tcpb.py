"""Replace bytes OLD by NEW (same length) in a .tcpb and recompute its CRC-32
(bytes 16..19: the CRC of everything from offset 24), so that the change gets
past the checksum to the string checks."""
import struct, sys, zlib

path, old, new = sys.argv[1], sys.argv[2].encode(), sys.argv[3].encode().decode("unicode_escape").encode("latin-1")
assert len(old) == len(new)
b = bytearray(open(path, "rb").read())
i = b.find(old)
assert i > 0, old
b[i:i + len(old)] = new
b[16:20] = struct.pack("<I", zlib.crc32(bytes(b[24:])) & 0xffffffff)
open(path, "wb").write(bytes(b))
