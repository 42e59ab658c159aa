"""Build .typecheck/runwire: the import name `runwire` as a tree of links, for mypy.

pip installs pipeline/ and workers/ under the one name `runwire` (pyproject's package-dir); at run
time the editable install's import hook maps the name, but mypy does not run import hooks. This
tree of symlinks gives it the same name: .typecheck/runwire/<entry> -> pipeline/<entry> for every
entry of pipeline/, and .typecheck/runwire/workers -> workers/. Rebuilt on every test run.
"""

from __future__ import annotations

import shutil
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TREE = ROOT / ".typecheck" / "runwire"


def main() -> None:
    if TREE.exists():
        shutil.rmtree(TREE)
    TREE.mkdir(parents=True)
    for entry in sorted((ROOT / "pipeline").iterdir()):
        if entry.name != "__pycache__":
            (TREE / entry.name).symlink_to(entry)
    (TREE / "workers").symlink_to(ROOT / "workers")


if __name__ == "__main__":
    main()
