"""The scripted scenario every SDK runs (examples/scenario.py) against a stack of its own,
compared with the table in docs/SDKS.md: this SDK observes what the table says every SDK
observes."""

from __future__ import annotations

import subprocess
import sys

from conftest import ROOT, Etcd
from test_robot_example import warehouse  # noqa: F401  (the fixture: inventory, gateway, proxy)

RUNNER = ROOT / "sdk" / "python" / "examples" / "scenario.py"


def documented() -> str:
    """The table's observed column as the runner prints it: KEY<TAB>OBSERVED lines."""
    text = (ROOT / "docs" / "SDKS.md").read_text()
    text = text[text.index("<!-- scenario-table:") :]
    text = text[: text.index("<!-- /scenario-table -->")]
    rows = [line for line in text.splitlines() if line.startswith("| `")]
    assert rows, "no scenario table in docs/SDKS.md"
    out = []
    for line in rows:
        cells = line.replace("\\|", "\0").split(" | ")
        out.append(f"{cells[0].removeprefix('| `').removesuffix('`')}\t{cells[2].replace(chr(0), '|')}\n")
    return "".join(out)


def test_the_scenario_observes_what_the_sdk_table_says_every_sdk_observes(
    warehouse: dict, etcd: Etcd  # noqa: F811
) -> None:
    run = subprocess.run(
        [sys.executable, str(RUNNER), "--proxy", warehouse["proxy"], "--gateway", warehouse["gateway"],
         "--etcd", etcd.url, "--prefix", "py-"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert run.returncode == 0, run.stdout + run.stderr
    assert run.stdout == documented(), "if the change is meant for every SDK, scripts/sdk-scenario.sh rewrites the table"
