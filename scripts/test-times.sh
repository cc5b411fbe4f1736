#!/usr/bin/env bash
# Where the test suite's time goes: the slowest test binaries and tests of the last
# `cargo nextest run` (its JUnit report, target/nextest/default/junit.xml), by wall time.
#   scripts/test-times.sh [N]   the N slowest of each (default 15)
set -euo pipefail
cd "$(dirname "$0")/.."
report="${CARGO_TARGET_DIR:-target}/nextest/default/junit.xml"
[ -f "$report" ] || { echo "no $report: run cargo nextest run first" >&2; exit 1; }
python3 - "$report" "${1:-15}" <<'PY'
import sys, xml.etree.ElementTree as ET
from collections import defaultdict
root = ET.parse(sys.argv[1]).getroot()
n = int(sys.argv[2])
per_binary, tests = defaultdict(float), []
for case in root.iter("testcase"):
    t = float(case.get("time", 0))
    binary = case.get("classname", "?")
    per_binary[binary] += t
    tests.append((t, f"{binary} {case.get('name')}"))
print(f"{len(tests)} tests, {sum(t for t, _ in tests):.0f} s of test time")
print("slowest binaries (sum of their tests' times):")
for binary, t in sorted(per_binary.items(), key=lambda x: -x[1])[:n]:
    print(f"  {t:8.1f} s  {binary}")
print("slowest tests:")
for t, name in sorted(tests, reverse=True)[:n]:
    print(f"  {t:8.1f} s  {name}")
PY
