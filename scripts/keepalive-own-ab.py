#!/usr/bin/env python3
"""Summarises leasebench --peers JSON files of the gRPC keepalive rows, two proxy builds side by
side: DIR/{shards,own}-{1,64}-ROUND.json (written by a build that renews every gRPC keepalive
over the shared streams and by one with streams of their own). Prints, per row and build, the
medians and each round of the proxy's CPU per renewal, its ratio to the pass-through's, and the
proxy's throughput over the pass-through's. Figures in docs/benchmarks/grpc-cpu.md."""
import glob
import json
import statistics
import sys

folder = sys.argv[1] if len(sys.argv) > 1 else "docs/benchmarks/keepalive-own"
for in_flight in (1, 64):
    print(f"{in_flight} in flight")
    rows = {}
    for build in ("shards", "own"):
        for path in sorted(glob.glob(f"{folder}/{build}-{in_flight}-*.json")):
            for row in json.load(open(path))["rows"]:
                b, cpu = row["backends"], row["cpu_ms_per_op"]
                rows.setdefault(row["op"], {}).setdefault(build, []).append({
                    "µs": cpu["proxy"]["side"] * 1000,
                    "pass-through µs": cpu["pass-through"]["side"] * 1000,
                    "CPU / pass-through": cpu["proxy"]["side"] / cpu["pass-through"]["side"],
                    "ops / pass-through": b["proxy"]["ops_per_sec"] / b["pass-through"]["ops_per_sec"],
                    "etcd µs": cpu["proxy"]["etcd"] * 1000,
                })
    for op, builds in rows.items():
        for build, rounds in builds.items():
            cells = []
            for key in rounds[0]:
                values = [r[key] for r in rounds]
                each = ", ".join(f"{v:.2f}" for v in values)
                cells.append(f"{key} {statistics.median(values):.2f} [{each}]")
            print(f"  {op} {build}: " + "; ".join(cells))
