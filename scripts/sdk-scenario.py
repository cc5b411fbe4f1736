#!/usr/bin/env python3
"""The table of scripts/sdk-scenario.sh: what each SDK's runner observed, step by step.

    sdk-scenario.py --write DOC OUT   put the table between DOC's markers
    sdk-scenario.py --check DOC OUT   exit 1 unless every SDK observed the same sequence and
                                      DOC's table is what these runs give

OUT holds one SDK.txt per runner: lines `KEY<TAB>OBSERVED`.
"""

import pathlib
import sys

BEGIN = "<!-- scenario-table: written by scripts/sdk-scenario.sh from the runs; do not edit -->"
END = "<!-- /scenario-table -->"

# The SDKs in the table's order; an SDK without a runner yet is shown as such.
SDKS = [("go", "Go"), ("typescript", "TypeScript"), ("rust", "Rust"), ("python", "Python")]

# What the runner does at each step (the same script in every language).
STEPS = {
    "lease.acquire": "client *a* acquires `aisle` (TTL 3 s)",
    "lease.renew": "wait for the lease's stop-by deadline to move on",
    "lease.write": "*a* writes a count through fence-gateway with the SDK's token propagation",
    "lease.revoke": "*a*'s etcd lease is revoked (a forced loss)",
    "lease.takeover": "client *b* acquires `aisle`, waiting up to 5 s",
    "lease.new-write": "*b* writes a count",
    "lease.old-write": "*a* writes again through the SDK's propagation",
    "lease.old-token": "*a*'s fencing token is sent to the gateway by hand",
    "lease.release": "*b* releases; `aisle` is read",
    "fleet.join": "a fleet of 2 resources (drain 20 s); member *m1* joins and serves",
    "fleet.write": "*m1* writes a count to each",
    "fleet.second-join": "member *m2* joins and serves",
    "fleet.hand-off": "*m1*'s work on it returns; its SDK releases it",
    "fleet.new-write": "*m2* writes the moved resource",
    "fleet.old-write": "*m1* writes it again through the SDK's propagation",
    "fleet.old-token": "*m1*'s token for it is sent to the gateway by hand",
    "fleet.drain": "*m1* drains",
    "fleet.session-end": "*m2*'s session's etcd lease is revoked",
}


def read(out: pathlib.Path):
    runs = {}
    for sdk, _ in SDKS:
        path = out / f"{sdk}.txt"
        if path.exists():
            runs[sdk] = [tuple(line.split("\t", 1)) for line in path.read_text().splitlines() if "\t" in line]
    return runs


def cell(text: str) -> str:
    return text.replace("|", "\\|")


def table(runs):
    """The table and whether every SDK that ran observed the same sequence."""
    reference = next(iter(runs.values()), [])
    keys = [k for k, _ in reference]
    for lines in runs.values():
        keys += [k for k, _ in lines if k not in keys]
    seen = {sdk: dict(lines) for sdk, lines in runs.items()}
    agree = all([k for k, _ in lines] == keys for lines in runs.values())
    head = "| step | the runner | observed | " + " | ".join(name for _, name in SDKS) + " |"
    rows = [head, "|" + "---|" * (3 + len(SDKS))]
    differences = []
    for key in keys:
        observed = dict(reference).get(key, "")
        marks = []
        for sdk, name in SDKS:
            if sdk not in runs:
                marks.append("hook")
            elif seen[sdk].get(key) == observed:
                marks.append("✓")
            else:
                marks.append("✗")
                differences.append(f"- {name}, `{key}`: {seen[sdk].get(key, '(no such step)')}")
                agree = False
        rows.append(f"| `{key}` | {cell(STEPS.get(key, '?'))} | {cell(observed)} | " + " | ".join(marks) + " |")
    if differences:
        rows += ["", "Where an SDK observed otherwise:", ""] + differences
    return "\n".join(rows), agree


def main() -> int:
    mode, doc_path, out = sys.argv[1], pathlib.Path(sys.argv[2]), pathlib.Path(sys.argv[3])
    runs = read(out)
    if not runs:
        print(f"no runs in {out}", file=sys.stderr)
        return 1
    text, agree = table(runs)
    doc = doc_path.read_text()
    try:
        start = doc.index(BEGIN) + len(BEGIN)
        end = doc.index(END, start)
    except ValueError:
        print(f"{doc_path} has no {BEGIN} … {END} section", file=sys.stderr)
        return 1
    new = doc[:start] + "\n" + text + "\n" + doc[end:]
    print(text)
    if mode == "--write":
        doc_path.write_text(new)
        print(f"==> written into {doc_path}")
    elif new != doc:
        print(f"{doc_path}'s table is not what these runs give: run scripts/sdk-scenario.sh", file=sys.stderr)
        return 1
    if not agree:
        print("the SDKs observed different sequences", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
