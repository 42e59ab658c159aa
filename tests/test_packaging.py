"""What ``pip install`` makes of the repository: one top-level name, ``runwire``, and no warnings.

pyproject's package-dir installs pipeline/ as ``runwire`` and workers/ as ``runwire.workers``;
the wheel holds nothing else at its top level, so ``pipeline`` and ``workers`` never land in a
user's site-packages. Building it prints no setuptools warning (a deprecated license table
printed one three times). An editable install prints setuptools' notice about folders named
like the package in the working directory; scripts/bootstrap filters that notice out, and this
checks it has nothing to warn about.
"""

from __future__ import annotations

import os
import shutil
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
    names = set(zipfile.ZipFile(wheel).namelist())
    assert {"runwire/workers/cli.py", "runwire/py.typed"} <= names
    # the compiled OTLP writer, built: installing the wheel needs no compiler
    assert [name for name in names if name.startswith("runwire/jobs/_otlp.") and name.endswith(".so")], names


def test_without_a_compiler_the_wheel_builds_with_the_pure_python_twins_only(tmp_path: Path) -> None:
    """The compiled twins are optional (runwire/core/native.py): a compiler that fails leaves them out
    of the wheel, and the build goes on."""
    source = tmp_path / "source"  # not the checkout, whose build/ may hold a built one
    shutil.copytree(ROOT, source, ignore=shutil.ignore_patterns(
        ".git", ".venv", ".services", "node_modules", "build", "*.so", "__pycache__", "*.egg-info"))
    build = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--disable-pip-version-check",
         "-w", str(tmp_path), str(source)],
        capture_output=True, text=True, timeout=300, env={**os.environ, "CC": "/bin/false"},
    )
    assert build.returncode == 0, build.stderr
    (wheel,) = tmp_path.glob("runwire-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    assert "runwire/jobs/otlp.py" in names and not [name for name in names if name.endswith(".so")]


def test_no_folder_is_named_like_the_package() -> None:
    """What setuptools' editable-install notice warns of (scripts/bootstrap silences it)."""
    assert not (ROOT / "runwire").exists()
    assert "ignore:Editable installation:UserWarning" in (ROOT / "scripts" / "bootstrap").read_text()
