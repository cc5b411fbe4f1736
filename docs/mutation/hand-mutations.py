#!/usr/bin/env python3
"""Usage: hand-mutations.py TREE OUT.json [ID...] -- applies each hand-made mutation to a tree, runs that crate's unit tests, records the outcome."""
import json, subprocess, sys, time, os
tree, out = sys.argv[1], sys.argv[2]
muts = json.load(open(os.path.join(os.path.dirname(__file__), "hand-mutations.json")))
only = set(sys.argv[3:])
results = []
env = dict(os.environ, CARGO_BUILD_JOBS="1")
for m in muts:
    if only and m["id"] not in only:
        continue
    path = os.path.join(tree, m["file"])
    src = open(path).read()
    if src.count(m["old"]) != 1:
        results.append({**m, "outcome": "not-applicable"}); print(m["id"], "not applicable", flush=True); continue
    open(path, "w").write(src.replace(m["old"], m["new"], 1))
    t0 = time.time()
    try:
        build = subprocess.run(["nice", "-n", "19", "cargo", "test", "-p", m["pkg"], "--lib", "--no-run"],
                               cwd=tree, env=env, capture_output=True, text=True, timeout=600)
        if build.returncode != 0:
            outcome = "unviable"
        else:
            test = subprocess.Popen(["nice", "-n", "19", "cargo", "test", "-p", m["pkg"], "--lib"],
                                    cwd=tree, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                    text=True, start_new_session=True)
            try:
                stdout, _ = test.communicate(timeout=60)
                failed = [l.split()[1] for l in stdout.splitlines() if l.startswith("test ") and l.endswith("FAILED")]
                outcome = "caught" if test.returncode != 0 else "missed"
            except subprocess.TimeoutExpired:
                os.killpg(test.pid, 9)  # the test binary too, not only cargo
                test.communicate()
                outcome, failed = "timeout", []
    finally:
        open(path, "w").write(src)
    r = {**m, "outcome": outcome, "failing_tests": failed if outcome == "caught" else [], "seconds": round(time.time() - t0)}
    results.append(r)
    print(m["id"], outcome, r["failing_tests"], flush=True)
json.dump(results, open(out, "w"), indent=1)
