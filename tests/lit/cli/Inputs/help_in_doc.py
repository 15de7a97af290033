#!/usr/bin/env python3
"""help_in_doc.py MOEC CLI_MD: every command listed by `moec --help` has a
section in docs/cli.md holding its `moec CMD --help` verbatim, which lists
every option the parser takes for it (an option of the table that the help
omits would be accepted silently)."""
import re
import subprocess
import sys

moec, doc = sys.argv[1:3]
text = open(doc).read()
usage = subprocess.run([moec, "--help"], stdout=subprocess.PIPE, check=True).stdout.decode()
cmds = re.findall(r"^  (\S+) ", usage.split("commands:")[1], re.M)
assert len(cmds) == 7, cmds
for c in cmds:
    h = subprocess.run([moec, c, "--help"], stdout=subprocess.PIPE, check=True).stdout.decode()
    assert f"## moec {c}\n\n```text\n{h}```\n" in text, f"moec {c} --help differs from docs/cli.md"
    for opt in re.findall(r"^  (-[-a-z]+)", h, re.M):
        if opt == "--help":
            continue
        # the parser takes each listed option for this command (it may then
        # fail for other reasons, but not as 'does not apply' or 'unknown')
        p = subprocess.run([moec, c, opt, "x", "-"], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE)
        err = p.stderr.decode()
        assert "does not apply to moec" not in err and "unknown option" not in err, (c, opt, err)
print(f"help_in_doc: {len(cmds)} commands")
