"""A copy of the tree with some of its modules compiled by mypyc, for the benches to measure.

What compiling the same ``.py`` files buys is measured, not assumed: this builds a copy of the
working tree (``pipeline/`` and ``workers/``, as ``git archive`` would give them, uncommitted
changes included) in ``--out`` and compiles the named modules there with mypyc (it ships with
mypy, which the test extras install; it needs a C compiler and Python's headers). Any bench then
runs it as it runs another tree, beside the pure-Python one::

    .venv/bin/python bench/compiled.py --out /tmp/mypyc runwire/jobs/spans.py runwire/jobs/otlp.py
    RUNWIRE_CODE=/tmp/mypyc PYTHONPATH=/tmp/mypyc/build .venv/bin/python bench/spans.py --instructions --parts --events 20000

(``PYTHONPATH``: mypyc puts the code its modules share in one more extension module, at the top
level.) The figures are in docs/benchmarks.md § Span export, "What compiling buys".
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def build(out: Path, modules: list[str]) -> None:
    if out.exists():
        shutil.rmtree(out)
    for folder in ("pipeline", "workers"):
        shutil.copytree(ROOT / folder, out / folder, ignore=shutil.ignore_patterns("__pycache__", "*.so"))
    staging = out / "build"
    staging.mkdir()
    (staging / "runwire").symlink_to(out / "pipeline", target_is_directory=True)
    mypyc = Path(sys.executable).with_name("mypyc")
    done = subprocess.run([str(mypyc), *modules], cwd=staging, capture_output=True, text=True)
    if done.returncode:  # mypyc says what it cannot compile on stdout
        raise SystemExit(f"mypyc failed:\n{done.stdout[-4000:]}{done.stderr[-4000:]}")
    built = sorted(path.relative_to(out) for path in out.rglob("*.so") if "build/build" not in str(path))
    print("\n".join(str(path) for path in built))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="where the compiled copy goes (replaced)")
    parser.add_argument("modules", nargs="+", help="paths under runwire/, e.g. runwire/jobs/spans.py")
    args = parser.parse_args()
    build(args.out.resolve(), args.modules)


if __name__ == "__main__":
    main()
