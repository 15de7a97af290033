"""SIGTERM at pseudo-random times during `moec compile --target=obj` and
`moec run --engine=c` (20 tries, fixed seed): every try must end with exit 0
(it finished first), 143 (128 + SIGTERM, from moec's handler) or death by
SIGTERM (the signal came before main() installed the handler, when no
temporary can exist yet), and leave no
temporary: no *.tmp.* beside the outputs and no moec-cc-* build directory in
TMPDIR. Prints how many kills found a temporary present at the time."""
import os, random, signal, subprocess, sys, time

moec, moe, weights, x, work = sys.argv[1:6]
tmpdir = os.path.join(work, "tmp")
os.makedirs(tmpdir, exist_ok=True)
env = dict(os.environ, TMPDIR=tmpdir)
rng = random.Random(21)

def temporaries():
    left = [f for f in os.listdir(work) if ".tmp." in f]
    left += [f for f in os.listdir(tmpdir) if f.startswith("moec-cc-")]
    return left

cmds = [[moec, "compile", moe, "--target=obj", "-o", os.path.join(work, "m.o")],
        [moec, "run", moe, "--weights", weights, "--input", x, "-o", os.path.join(work, "y.npy"), "--engine=c"]]
# Kill times are drawn over each command's own duration, timed once unkilled, so
# a slow build (sanitizers, a loaded host) is interrupted while it works too.
span = []
for cmd in cmds:
    t0 = time.monotonic()
    subprocess.run(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
    span.append(time.monotonic() - t0)

killed = with_temp = 0
for i in range(20):
    cmd = cmds[i % 2]
    p = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(rng.uniform(0.0, 0.9) * span[i % 2])
    with_temp += bool(temporaries())
    p.send_signal(signal.SIGTERM)
    rc = p.wait()
    assert rc in (0, 128 + signal.SIGTERM, -signal.SIGTERM), (cmd, rc)
    killed += rc == 128 + signal.SIGTERM
    left = temporaries()
    assert not left, (cmd, left)
print(f"20 tries: {killed} killed by SIGTERM (exit 143), {with_temp} with a temporary present at the kill, none left")
assert killed > 0
