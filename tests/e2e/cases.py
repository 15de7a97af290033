"""The case loop shared by the fixture-driven e2e scripts (hf_fixtures.py, ep_mpi.py, ep_tcp.py).

Each script walks the fixture families and their saved inputs, runs one or more cases per
input and counts them. What is common lives here:

    fams = families(fixtures_dir, only="a,b", exclude="c")
    for fam, dtype, T, x in inputs(fixtures_dir, fams, dtypes=..., tokens=...):
        ...
    tally = Tally()
    with tally.case("name"):            # an exception fails the case, reported, and the loop goes on
        tally.check("name", ok, detail)  # one verdict line: "ok   name detail" or "FAIL name detail"
    return tally.finish()               # "N passed, M failed"; 1 if any failed or none passed

The verdict rule is the scripts' own, the same in all three: a run fails when any case
failed or when no case ran at all (an empty fixture set is not a pass).
"""
import contextlib
import os
import subprocess


def families(fixtures, only=None, exclude=None):
    """The fixture families (folders with a config.json), sorted; `only` and `exclude` are
    comma-separated names or None."""
    fams = sorted(d for d in os.listdir(fixtures) if os.path.isfile(os.path.join(fixtures, d, "config.json")))
    if only:
        fams = [f for f in fams if f in only.split(",")]
    if exclude:
        fams = [f for f in fams if f not in exclude.split(",")]
    return fams


def inputs(fixtures, fams, dtypes=None, tokens=None):
    """(family, dtype, T, path) for every saved input x_{dtype}_T{T}.npy of the families, in
    family then dtype then T order; `dtypes` (names) and `tokens` (ints) restrict them, or
    are None for all. `tokens` may also be a function (family, T) -> bool."""
    for fam in fams:
        d = os.path.join(fixtures, fam)
        found = []
        for name in os.listdir(d):
            if not (name.startswith("x_") and name.endswith(".npy")):
                continue
            dtype, tpart = name[2:-4].rsplit("_", 1)
            found.append((dtype, int(tpart[1:]), os.path.join(d, name)))
        for dtype, T, path in sorted(found):
            if dtypes is not None and dtype not in dtypes:
                continue
            if callable(tokens):
                if not tokens(fam, T):
                    continue
            elif tokens is not None and T not in tokens:
                continue
            yield fam, dtype, T, path


def dtype_sets(dtype):
    """The `moec run` options that build the layer in the input's dtype."""
    return ["--set", "dtype=bf16"] if dtype == "bfloat16" else []


def run(cmd, timeout=None, env=None):
    """Run a command; a non-zero status raises RuntimeError with the command and its output."""
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    if p.returncode != 0:
        raise RuntimeError("command failed (%d): %s\n%s%s" % (p.returncode, " ".join(cmd), p.stdout, p.stderr))
    return p


def import_layer(moec, fixture_dir, T, out, timeout=None):
    """moec import-hf FIXTURE/config.json --tokens T -o OUT."""
    run([moec, "import-hf", os.path.join(fixture_dir, "config.json"), "--tokens", str(T), "-o", out], timeout)
    return out


class Tally:
    """Counts cases and prints one line per verdict."""

    def __init__(self, width=40):
        self.passed = 0
        self.failed = []
        self.width = width

    def check(self, case, ok, detail=""):
        print("%-4s %-*s %s" % ("ok" if ok else "FAIL", self.width, case, detail))
        if ok:
            self.passed += 1
        else:
            self.failed.append(case)
        return ok

    def fail(self, case, why):
        print("FAIL %s: %s" % (case, why))
        self.failed.append(case)

    @contextlib.contextmanager
    def case(self, case):
        """Run a case's body; an exception fails the case (reported) and does not stop the loop."""
        try:
            yield
        except Exception as e:  # report and go on with the other cases
            self.fail(case, e)

    def finish(self):
        print("%d passed, %d failed" % (self.passed, len(self.failed)))
        return 1 if self.failed or self.passed == 0 else 0
