"""What ``pip install`` makes of the repository: one top-level name, ``runwire``, and no warnings.

pyproject's package-dir installs pipeline/ as ``runwire`` and workers/ as ``runwire.workers``;
the wheel holds nothing else at its top level, so ``pipeline`` and ``workers`` never land in a
user's site-packages. Building it prints no setuptools warning (a deprecated license table
printed one three times). An editable install prints setuptools' notice about folders named
like the package in the working directory; scripts/bootstrap filters that notice out, and this
checks it has nothing to warn about.
"""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_the_wheel_installs_runwire_only_and_builds_without_warnings(tmp_path: Path) -> None:
    build = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--disable-pip-version-check",
         "-w", str(tmp_path), str(ROOT)],
        capture_output=True, text=True, timeout=300,
    )
    assert build.returncode == 0, build.stderr
    warnings = [line for line in (build.stdout + build.stderr).splitlines()
                if "Warning" in line or line.strip() == "!!"]
    assert warnings == [], "\n".join(warnings)
    (wheel,) = tmp_path.glob("runwire-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        top = {name.split("/", 1)[0] for name in archive.namelist()}
    assert {name for name in top if not name.endswith(".dist-info")} == {"runwire"}
    assert {"runwire/workers/cli.py", "runwire/py.typed"} <= set(zipfile.ZipFile(wheel).namelist())


def test_no_folder_is_named_like_the_package() -> None:
    """What setuptools' editable-install notice warns of (scripts/bootstrap silences it)."""
    assert not (ROOT / "runwire").exists()
    assert "ignore:Editable installation:UserWarning" in (ROOT / "scripts" / "bootstrap").read_text()
