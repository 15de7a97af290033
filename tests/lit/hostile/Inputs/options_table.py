"""Every option/command/target/input combination that the option table
(`moec help --option-table`, cli/options.def) says does not apply is
an error naming the option, before anything is written:
  - an option of another command (`does not apply to moec CMD`);
  - for each command, target (host, tcp) and kind of FILE (.moe, textual IR,
    .tcpb) the command takes: an option whose target or input kinds exclude
    it, or that needs an option not given;
  - an option given with one it excludes (both named).
The base command lines succeed alone (so an error comes from the option). Each
case must exit 1, its first error line must name the option, and no output
file may appear. Prints the number of cases.

usage: options_table.py MOEC WORKDIR FIXTURES_HF"""
import os, subprocess, sys

moec, work, hf = sys.argv[1:4]
os.makedirs(work, exist_ok=True)
cfg = os.path.join(hf, "mixtral", "config.json")
W = os.path.join(hf, "mixtral", "model.safetensors")
X = os.path.join(hf, "mixtral", "x_float32_T5.npy")
moe, moeir, tcpb = (os.path.join(work, n) for n in ("m.moe", "m.moeir", "m.tcpb"))
outdir = os.path.join(work, "out")
os.makedirs(outdir, exist_ok=True)


def moec_run(args):
    return subprocess.run([moec] + args, capture_output=True, text=True, timeout=60)


def must(args):
    p = moec_run(args)
    assert p.returncode == 0, (args, p.stderr)


must(["import-hf", cfg, "--tokens", "5", "-o", moe])
must(["ir", moe, "-o", moeir])
must(["compile", moe, "-o", tcpb])

rows = []
for line in moec_run(["help", "--option-table"]).stdout.splitlines():
    name, meta, cmds, only, inputs, needs, excl = line.split("\t")
    rows.append(dict(name=name, meta=None if meta == "-" else meta, cmds=cmds.split(","),
                     only=None if only == "-" else only, inputs=inputs.split(","),
                     needs=None if needs == "-" else needs, excludes=[] if excl == "-" else excl.split(",")))
assert len(rows) > 40, len(rows)
COMMANDS = ["check", "ir", "stats", "compile", "run", "import-hf", "passes"]
FILES = {"moe": moe, "ir": moeir, "tcpb": tcpb}
OUT = lambda n: os.path.join(outdir, n)


def base(cmd, kind, target):
    """A command line that succeeds alone, and the option names it already holds."""
    f = FILES.get(kind)
    if cmd == "check":
        return [cmd, f], set()
    if cmd == "ir":
        return [cmd, f], set()
    if cmd == "stats":
        return [cmd, f, "--target=" + target], {"--target"}
    if cmd == "compile":
        return [cmd, f, "-o", OUT("o.tcpb" if target == "tcp" else "o.c")], {"-o"}
    if cmd == "run":
        t = [] if kind == "tcpb" else ["--target=" + target]
        return [cmd, f, "--weights", W, "--input", X, "-o", OUT("y.npy")] + t, {"--weights", "--input", "-o",
                                                                             "--target"}
    if cmd == "import-hf":
        return [cmd, cfg, "-o", OUT("i.moe")], {"-o"}
    return [cmd], set()


def combos(cmd):
    """(kind, target) pairs the command takes."""
    if cmd in ("check",):
        return [("moe", None), ("ir", None), ("tcpb", None)]
    if cmd == "ir":
        return [("moe", None), ("ir", None)]
    if cmd in ("stats", "compile"):
        return [(k, t) for k in ("moe", "ir") for t in ("host", "tcp")]
    if cmd == "run":
        return [(k, t) for k in ("moe", "ir") for t in ("host", "tcp")] + [("tcpb", "tcp")]
    if cmd == "import-hf":
        return [(None, None)]
    return [(None, None)]


VALUES = {"N": "2", "T": "5", "B": "8", "P": "host", "NAME|all": "all", "NAME=VALUE": "T=5", "T1,T2,...": "1,4",
          "D0,D1,...": "0,0,0,0,1,1,1,1", "FILE.json": None, "FILE": None, "y.npy": None}


def value(r):
    m = r["meta"]
    if m is None:
        return [r["name"]]
    if m in ("FILE.json", "FILE", "y.npy", "OUT", "FILE.moe"):
        return [r["name"], OUT("v" + r["name"].strip("-") + ".json")]
    if m in VALUES:
        return [r["name"], VALUES[m]]
    if "|" in m and m == m.lower():
        return [r["name"], m.split("|")[-1]]
    if r["name"] == "--layer":
        return [r["name"], "0"]
    return [r["name"], "1"]


def row(name, cmd):
    return next((r for r in rows if r["name"] == name and cmd in r["cmds"]), None)


def outputs():
    return sorted(os.listdir(outdir))


cases = 0
failures = []


def expect_error(args, names, why):
    global cases
    cases += 1
    before = outputs()
    p = moec_run(args)
    errs = [ln for ln in p.stderr.splitlines() if "error:" in ln]
    ok = p.returncode == 1 and errs and all(n in errs[0] for n in names) and outputs() == before
    if not ok:
        failures.append((why, args, p.returncode, p.stderr.strip()[:300]))


# the base command lines succeed
for cmd in COMMANDS:
    for kind, target in combos(cmd):
        b, _ = base(cmd, kind, target)
        p = moec_run(b)
        assert p.returncode == 0, (b, p.stderr)
for f in os.listdir(outdir):
    os.remove(os.path.join(outdir, f))

names = sorted({r["name"] for r in rows})
for name in names:
    for cmd in COMMANDS:
        if row(name, cmd):
            continue
        kind, target = combos(cmd)[0]
        b, _ = base(cmd, kind, target)
        expect_error(b + value(next(r for r in rows if r["name"] == name)), [name, "does not apply to moec " + cmd],
                     "another command's option")

for r in rows:
    for cmd in r["cmds"]:
        for kind, target in combos(cmd):
            b, held = base(cmd, kind, target)
            if r["name"] in held:
                continue
            why = []
            if r["only"] and target and r["only"] != target:
                why.append("target")
            if kind and kind not in r["inputs"]:
                why.append("input")
            if r["needs"]:
                why.append("needs " + r["needs"])
            if why:
                expect_error(b + value(r), [r["name"]], "%s %s %s: %s" % (cmd, kind, target, ", ".join(why)))
            for x in r["excludes"]:
                q = row(x, cmd)
                if r["name"] == "--list":  # takes no file: the listing alone
                    expect_error(["import-hf", "--list"] + value(q), [r["name"], x], "--list with " + x)
                    continue
                if not q or why or x in held or (q["only"] and target and q["only"] != target) or \
                        (kind and kind not in q["inputs"]) or q["needs"]:
                    continue
                expect_error(b + value(r) + value(q), [r["name"], x], "%s with %s" % (r["name"], x))

for f in failures:
    print("FAIL", f)
print("%d cases from %d rows, %d failed" % (cases, len(rows), len(failures)))
sys.exit(1 if failures else 0)
