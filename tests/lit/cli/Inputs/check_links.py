#!/usr/bin/env python3
"""check_links.py SRCROOT: every relative link of the repository's Markdown
(README.md, docs/, and the other *.md files outside build trees) resolves:
[text](path) and ![alt](path) name an existing file or directory, a #anchor
names a heading of its file, and a path written as text that starts with ./
or ../ exists. Absolute paths into the machine that wrote a document
(/work/..., /home/..., /root/...) are refused: docs cite only the repository."""
import os
import re
import sys

root = os.path.abspath(sys.argv[1])
skip_dirs = {"Output", "node_modules", "__pycache__"}


def markdown_files():
    for d, dirs, files in os.walk(root):
        dirs[:] = [x for x in dirs if not x.startswith(".") and not x.startswith("build") and x not in skip_dirs]
        for f in files:
            if f.endswith(".md"):
                yield os.path.join(d, f)


def slug(heading):
    s = re.sub(r"[^\w\- ]", "", heading.strip().lower().replace("`", ""))
    return s.replace(" ", "-")


def anchors(path):
    text = open(path, encoding="utf-8").read()
    text = re.sub(r"```.*?```", "", text, flags=re.S)
    return {slug(m.group(1)) for m in re.finditer(r"^#+\s+(.*)$", text, re.M)}


bad, nlinks, nfiles = [], 0, 0
for md in markdown_files():
    nfiles += 1
    rel = os.path.relpath(md, root)
    text = open(md, encoding="utf-8").read()
    prose = re.sub(r"```.*?```", lambda m: "\n" * m.group(0).count("\n"), text, flags=re.S)
    for lineno, line in enumerate(prose.splitlines(), 1):
        for m in re.finditer(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)", line):
            target = m.group(1)
            if re.match(r"^[a-z]+:", target):
                continue
            nlinks += 1
            path, _, anchor = target.partition("#")
            dest = os.path.normpath(os.path.join(os.path.dirname(md), path)) if path else md
            if not os.path.exists(dest):
                bad.append(f"{rel}:{lineno}: link to '{target}': no such file")
            elif anchor and dest.endswith(".md") and anchor not in anchors(dest):
                bad.append(f"{rel}:{lineno}: link to '{target}': no heading '#{anchor}'")
        for m in re.finditer(r"(?<![\w/.])(\.\.?/[\w./-]+)", line):
            nlinks += 1
            path = m.group(1).rstrip(".")
            if not os.path.exists(os.path.normpath(os.path.join(os.path.dirname(md), path))):
                bad.append(f"{rel}:{lineno}: path '{path}' does not exist")
        for m in re.finditer(r"(?<![\w.])(/(?:work|home|root)/[\w./-]+)", line):
            bad.append(f"{rel}:{lineno}: '{m.group(1)}' is a path outside the repository")
for b in bad:
    print(b)
print(f"check_links: {nfiles} files, {nlinks} relative links and paths, {len(bad)} broken")
sys.exit(1 if bad else 0)
