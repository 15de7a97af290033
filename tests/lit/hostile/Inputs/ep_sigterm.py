"""SIGTERM at pseudo-random times during `moec compile --ep` over an existing
set (20 tries, fixed seed). The work directory starts each try with a
complete old set (--ep 4); the command writes a new one (--ep 3, another T).
After every try: no temporary (*.set.*, *.tmp.*) is left, and the manifest,
when there is one, names files that all exist and are all of one set, the
old or the new, byte for byte as compiled undisturbed; the files of the old
set that the new one lacks are gone whenever the new manifest is there.
Prints how many kills found a temporary present at the time.

usage: ep_sigterm.py MOEC LAYER.moe WORKDIR"""
import filecmp, json, os, random, shutil, signal, subprocess, sys, time

moec, moe, work = sys.argv[1:4]
OLD = ["--ep", "4", "--set", "T=64"]
NEW = ["--ep", "3", "--set", "T=32768"]


def compile_into(d, args):
    os.makedirs(d, exist_ok=True)
    subprocess.run([moec, "compile", moe] + args + ["-o", os.path.join(d, "s.tcpb")], check=True)


def names(d):
    j = json.load(open(os.path.join(d, "s.ep.json")))
    return [p["file"] for p in j["programs"]]


old_ref, new_ref = os.path.join(work, "old"), os.path.join(work, "new")
compile_into(old_ref, OLD)
compile_into(new_ref, NEW)
old_files, new_files = names(old_ref), names(new_ref)
assert set(old_files) - set(new_files), "the old set must have files the new one lacks"
rng = random.Random(34)
killed = with_temp = 0
for i in range(20):
    d = os.path.join(work, "try")
    shutil.rmtree(d, ignore_errors=True)
    shutil.copytree(old_ref, d)
    p = subprocess.Popen([moec, "compile", moe] + NEW + ["-o", os.path.join(d, "s.tcpb")],
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(rng.uniform(0.0, 0.3))
    with_temp += any(".set." in f or ".tmp." in f for f in os.listdir(d))
    p.send_signal(signal.SIGTERM)
    rc = p.wait()
    assert rc in (0, 128 + signal.SIGTERM, -signal.SIGTERM), rc
    killed += rc == 128 + signal.SIGTERM
    left = [f for f in os.listdir(d) if ".set." in f or ".tmp." in f]
    assert not left, (i, left)
    man = os.path.join(d, "s.ep.json")
    if os.path.exists(man):
        listed = names(d)
        assert listed in (old_files, new_files), (i, listed)
        ref = old_ref if listed == old_files else new_ref
        for f in listed + ["s.ep.json"]:
            assert filecmp.cmp(os.path.join(d, f), os.path.join(ref, f), shallow=False), (i, f)
        if ref == new_ref:
            stale = [f for f in old_files if f not in new_files and os.path.exists(os.path.join(d, f))]
            assert not stale, (i, stale)
    assert rc != 0 or os.path.exists(man), i
print(f"20 tries: {killed} killed by SIGTERM (exit 143), {with_temp} with a temporary present at the kill, "
      "none left, every manifest names one whole set")
assert killed > 0
