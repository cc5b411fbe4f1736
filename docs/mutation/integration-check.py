#!/usr/bin/env python3
"""Usage: integration-check.py OUT.json TREE MUTANTS_OUT -- applies chosen etcd-bound mutants (cargo-mutants' own diffs) and runs the integration test that
should catch each one, against a real etcd. Records caught/missed."""
import json, subprocess, sys, os, time
tree = sys.argv[2] if len(sys.argv) > 2 else "."
run = sys.argv[3] if len(sys.argv) > 3 else "mutants.out"  # cargo-mutants output of the etcd-bound run
out = sys.argv[1]
# The second pass (results under "second_pass") re-ran 552:49 against
# leases.rs::idempotency_key_returns_the_same_grant and 730:41 against
# reuse.rs::a_released_lease_is_never_reused_and_its_secret_stays_dead.
picks = [  # (mutant name, test binary, test name)
 ("proxy/src/lease/mod.rs:806:16: replace <= with > in Leases::renew_grant", "lifecycle", "a_renewal_answered_with_ttl_0_is_lost"),
 ("proxy/src/lease/mod.rs:814:40: replace * with + in Leases::renew_grant", "leases", "renewal_keeps_the_lease_past_its_ttl"),
 ("proxy/src/lease/mod.rs:649:73: replace * with + in Leases::try_acquire", "leases", "dead_holder_is_replaced_by_a_waiter"),
 ("proxy/src/lease/mod.rs:756:44: replace && with || in Leases::confirmed", "leases", "wrong_secrets_are_rejected_and_change_nothing"),
 ("proxy/src/lease/mod.rs:730:41: replace match guard record.lease_id == lease_id with true in Leases::held_with", "leases", "wrong_secrets_are_rejected_and_change_nothing"),
 ("proxy/src/lease/mod.rs:332:32: replace match guard u64::try_from(renewed).ok() == Some(ttl) with true in Leases::lease_for", "reuse", "a_lapsed_spare_is_never_handed_out"),
 ("proxy/src/lease/mod.rs:707:9: replace Leases::prefence -> Result<()> with Ok(())", "lifecycle", "a_refused_prefence_withdraws_the_grant"),
 ("proxy/src/lease/mod.rs:669:75: replace == with != in Leases::try_acquire", "leases", "idempotency_key_returns_the_same_grant"),
 ("proxy/src/lease/mod.rs:552:49: replace == with != in Leases::refuse_a_used_key", "lifecycle", "a_replay_after_the_window_gets_no_secret"),
 ("proxy/src/lease/mod.rs:828:9: replace Leases::release -> Result<()> with Ok(())", "lifecycle", "nothing_succeeds_after_a_release"),
 ("proxy/src/lease/mod.rs:350:40: replace + with - in Leases::give_back", "reuse", "refused_acquires_reuse_their_leases"),
]
outcomes = {o["scenario"]["Mutant"]["name"]: o for o in json.load(open(os.path.join(run, "outcomes.json")))["outcomes"] if o["scenario"] != "Baseline"}
env = dict(os.environ, CARGO_BUILD_JOBS="1")
results = []
# Baseline: every chosen test passes on the unmutated tree.
for binary in sorted({b for _, b, _ in picks}):
    tests = sorted({t for _, b, t in picks if b == binary})
    t0 = time.time()
    p = subprocess.run(["nice", "-n", "19", "cargo", "test", "-p", "lease-proxy", "--test", binary, "--", *tests, "--exact"],
                       cwd=tree, env=env, capture_output=True, text=True, timeout=900)
    ok = p.returncode == 0 and f"running {len(tests)} test" in p.stdout
    r = {"baseline": binary, "tests": tests, "passed": ok, "seconds": round(time.time() - t0)}
    results.append(r); print(r, flush=True)
    if not ok:
        print(p.stdout[-3000:], p.stderr[-3000:]); sys.exit(1)
for name, binary, test in picks:
    o = outcomes.get(name)
    if o is None:
        print("no such mutant", name, flush=True); results.append({"name": name, "outcome": "not-found"}); continue
    # cargo-mutants' diffs name the mutation on the `+++` line: give it the file name back.
    text = open(os.path.join(run, o["diff_path"])).read().splitlines(keepends=True)
    file = text[0][4:].strip()
    text[0], text[1] = f"--- a/{file}\n", f"+++ b/{file}\n"
    diff = os.path.join("/tmp", os.path.basename(o["diff_path"]))
    open(diff, "w").write("".join(text))
    subprocess.run(["git", "apply", diff], cwd=tree, check=True)
    t0 = time.time()
    try:
        p = subprocess.Popen(["nice", "-n", "19", "cargo", "test", "-p", "lease-proxy", "--test", binary, "--", test, "--exact"],
                             cwd=tree, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
        try:
            so, _ = p.communicate(timeout=300)
            ran = "running 1 test" in so
            outcome = ("caught" if p.returncode != 0 else "missed") if ran else "error"
            if not ran: print(so[-2000:])
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, 9); p.communicate(); outcome = "timeout"
    finally:
        subprocess.run(["git", "apply", "-R", diff], cwd=tree, check=True)
    r = {"name": name, "test": f"proxy/tests/{binary}.rs::{test}", "outcome": outcome, "seconds": round(time.time() - t0)}
    results.append(r); print(r, flush=True)
json.dump(results, open(out, "w"), indent=1)
