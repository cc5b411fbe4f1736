#!/usr/bin/env python3
"""The peers table of docs/BENCHMARKS.md from `leasebench --peers --json FILE` (scripts/bench.sh).

Each row: an operation at one concurrency, lease-proxy against the peer a user would pick
instead (etcd's grpc-proxy for gRPC, etcd's JSON gateway for HTTP) and, for gRPC, the bare
pass-through (the limit for any proxy). Figures are ranges over the rounds; ratios are per round
(the same round's figures, the side order rotating). CPU per operation is the serving process's:
lease-proxy's, grpc-proxy's, the pass-through's; the JSON gateway runs inside etcd, so its row
compares etcd's CPU alone with lease-proxy's plus etcd's.

usage: peers-table.py FILE.json [DATA-NAME]
"""

import json
import math
import sys

GRPC_TARGET = 1.0  # lease-proxy / grpc-proxy throughput, and no more CPU per operation
HTTP_TARGET = 1.5  # lease-proxy / JSON gateway throughput
CPU_TARGET = 1.3  # lease-proxy CPU / pass-through CPU per operation


def span(values, fmt):
    values = [v for v in values if v is not None]
    if not values:
        return "–"
    lo, hi = min(values), max(values)
    a, b = fmt(lo), fmt(hi)
    return a if a == b else f"{a}–{b}"


def ops(v):
    return f"{v:,.0f}"


def us(v):
    return f"{v:,.0f}"


def beside(value, target):
    """`value`, a miss of `target`, with as few decimals (at least 2) as still show it on its
    side of the target: 0.9996 against 1.0 is 0.9996, never 1.00."""
    for digits in range(2, 7):
        shown = round(value, digits)
        if shown != target and (shown < target) == (value < target):
            return f"{shown:.{digits}f}"
    return repr(value)


def ratio(v):
    return f"{v:,.0f}" if v >= 100 else f"{v:.2f}"


def run_of(row, side):
    return row["backends"].get(side)


def cpu_of(row, side, what):
    ms = row.get("cpu_ms_per_op", {}).get(side, {}).get(what)
    return None if ms is None else ms * 1e3


def cut(row, side):
    r = run_of(row, side)
    return bool(r and r.get("cut_at_deadline"))


def main():
    path = sys.argv[1]
    data = sys.argv[2] if len(sys.argv) > 2 else path.rsplit("/", 1)[-1].removesuffix(".json")
    doc = json.load(open(path))
    cells = {}
    for row in doc["rows"]:
        cells.setdefault((row["op"], row["in_flight"]), []).append(row)
    print(
        "| op | in flight | lease-proxy via | peer | lease-proxy ops/s | peer ops/s "
        "| lease-proxy / peer, per round | lease-proxy CPU µs/op | peer CPU µs/op "
        "| pass-through ops/s | pass-through CPU µs/op | lease-proxy / pass-through CPU, per round "
        "| target | data |"
    )
    print("|---|--:|---|---|--:|--:|--:|--:|--:|--:|--:|--:|---|---|")
    for (op, c), rows in cells.items():
        sides = rows[0]["backends"].keys()
        if "grpc-proxy" in sides:
            subjects, peer, limit = [("proxy", "gRPC")], "grpc-proxy", "pass-through"
        elif "etcd gateway" in sides:
            subjects, peer, limit = [("proxy", "/v1"), ("proxy /v3", "/v3")], "etcd gateway", None
        else:
            continue
        for subject, via in subjects:
            per_round = [
                run_of(r, subject)["ops_per_sec"] / run_of(r, peer)["ops_per_sec"]
                for r in rows
                if run_of(r, peer) and run_of(r, peer)["ops_per_sec"] > 0
            ]
            # A peer that answered nothing by the deadline has no ratio and no CPU per operation.
            silent = sum(1 for r in rows if run_of(r, peer)["ops"] == 0)
            if limit:
                # Each process's own CPU.
                mine = [cpu_of(r, subject, "side") for r in rows]
                theirs = [cpu_of(r, peer, "side") for r in rows]
            else:
                # The gateway is inside etcd: etcd alone against lease-proxy plus etcd.
                mine = [
                    None
                    if cpu_of(r, subject, "side") is None or cpu_of(r, subject, "etcd") is None
                    else cpu_of(r, subject, "side") + cpu_of(r, subject, "etcd")
                    for r in rows
                ]
                theirs = [cpu_of(r, peer, "etcd") for r in rows]
            theirs = [t if run_of(r, peer)["ops"] > 0 else None for t, r in zip(theirs, rows)]
            peer_ops = span([run_of(r, peer)["ops_per_sec"] for r in rows], ops)
            if any(cut(r, peer) for r in rows):
                peer_ops += " (cut)"
            line = [
                op,
                str(c),
                via,
                "grpc-proxy" if limit else "etcd JSON gateway",
                span([run_of(r, subject)["ops_per_sec"] for r in rows], ops),
                peer_ops,
                ", ".join([ratio(v) for v in per_round] + ["∞ (peer: none)"] * silent),
                span(mine, us) + ("" if limit else " (+ etcd)"),
                span(theirs, us)
                + ("" if limit else " (etcd)")
                + (" (cut)" if any(cut(r, peer) for r in rows) else ""),
            ]
            misses = []
            target = GRPC_TARGET if limit else HTTP_TARGET
            if per_round and min(per_round) < target:
                misses.append(f"throughput {beside(min(per_round), target)}× < {target}×")
            if limit:
                pt_cpu = [cpu_of(r, limit, "side") for r in rows]
                cpu_ratio = [
                    m / p for m, p in zip(mine, pt_cpu) if m is not None and p
                ]
                line += [
                    span([run_of(r, limit)["ops_per_sec"] for r in rows], ops),
                    span(pt_cpu, us),
                    ", ".join(ratio(v) for v in cpu_ratio),
                ]
                # A cut peer's CPU per operation is its idle wait over a handful: no comparison.
                cpu_vs_peer = [
                    m / t
                    for m, t, r in zip(mine, theirs, rows)
                    if m is not None and t and not cut(r, peer)
                ]
                if cpu_vs_peer and max(cpu_vs_peer) > 1.0:
                    misses.append(f"CPU {beside(max(cpu_vs_peer), 1.0)}× grpc-proxy's")
                if cpu_ratio and max(cpu_ratio) > CPU_TARGET:
                    misses.append(
                        f"CPU {beside(max(cpu_ratio), CPU_TARGET)}× pass-through's > {CPU_TARGET}×"
                    )
            else:
                line += ["", "", ""]
            line.append("met" if not misses else "missed: " + "; ".join(misses))
            line.append(f"`{data}`")
            print("| " + " | ".join(line) + " |")


if __name__ == "__main__":
    main()
