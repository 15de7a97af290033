"""Set the label (bucket T, u32) of bucket I of a bucketed .tcpb to VALUE and
recompute the index checksum (bytes 16..19: the CRC-32 of the bucket index and
section sizes), so that the forged label gets past the checksum to the check
against the program's T. Layout: backend-tcp/isa/bundle.c (header 24 bytes; n at
12, m at 20; n entries of 28 bytes, the first u32 the label; m u64 sizes).

usage: bundle_label.py IN OUT I VALUE"""
import struct, sys, zlib

src, dst, i, value = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
b = bytearray(open(src, "rb").read())
n, m = struct.unpack_from("<I", b, 12)[0], struct.unpack_from("<I", b, 20)[0]
assert 0 <= i < n
struct.pack_into("<I", b, 24 + 28 * i, value)
end = 24 + 28 * n + 8 * m
struct.pack_into("<I", b, 16, zlib.crc32(bytes(b[24:end])) & 0xffffffff)
open(dst, "wb").write(bytes(b))
