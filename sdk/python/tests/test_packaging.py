"""Installing the package the way its README says (``pip install ./sdk/python``) leaves the
checkout as it was: no ``build/`` folder, no ``*.egg-info`` beside the sources."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

SDK = Path(__file__).resolve().parents[1]


def files(root: Path) -> set:
    return {p.relative_to(root).as_posix() for p in root.rglob("*") if "__pycache__" not in p.parts}


def test_pip_install_leaves_nothing_in_the_checkout(tmp_path: Path) -> None:
    # A copy of what a checkout holds (the tests aside), so the real one is never touched.
    checkout = tmp_path / "python"
    checkout.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(SDK / name, checkout / name)
    shutil.copytree(SDK / "src", checkout / "src", ignore=shutil.ignore_patterns("*.egg-info", "__pycache__"))
    before = files(checkout)
    target = tmp_path / "installed"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--disable-pip-version-check", "--no-deps",
         "--target", str(target), str(checkout)],
        check=True,
        timeout=300,
    )  # fmt: skip
    assert files(checkout) == before, sorted(files(checkout) - before)
    installed = target / "lease_proxy_client"
    assert (installed / "py.typed").is_file() and (installed / "client.py").is_file()
