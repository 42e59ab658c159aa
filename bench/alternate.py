"""Run one bench against two source trees in turn, so their ratio holds on a noisy machine.

    git archive main | tar -x -C /tmp/base        # e.g. the code before a change
    python bench/alternate.py --base /tmp/base --rounds 3 -- bench/workers.py --only redis --repeat 1

Each round runs the bench (with ``--json``) once against ``--base`` and once
against this checkout (``--new``), alternating which goes first; the bench
script itself is always this checkout's, importing the tree named by
``RUNWIRE_CODE``. Prints each numeric figure's median per tree and the ratio
new / base, and with ``--json`` all of it as one object.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parents[1]


def run_once(tree: str, command: list[str]) -> dict[str, float]:
    env = dict(os.environ, RUNWIRE_CODE=tree)
    out = subprocess.run([sys.executable, *command, "--json"], env=env, cwd=HERE,
                         capture_output=True, text=True, check=True).stdout
    return flatten(json.loads(out[out.index("{"):]))


def flatten(figures: dict[str, object], prefix: str = "") -> dict[str, float]:
    """A bench's numeric figures, those of nested objects as ``outer.inner``."""
    flat: dict[str, float] = {}
    for key, value in figures.items():
        if isinstance(value, dict):
            flat.update(flatten(value, f"{prefix}{key}."))
        elif isinstance(value, int | float) and not isinstance(value, bool):
            flat[prefix + key] = float(value)
    return flat


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", required=True, help="source tree of the code to compare against")
    parser.add_argument("--new", default=str(HERE), help="source tree of the new code (this one)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- bench/X.py [its options]")
    args = parser.parse_args()
    command = [c for c in args.command if c != "--"]
    runs: dict[str, list[dict[str, float]]] = {"base": [], "new": []}
    for index in range(args.rounds):
        order = [("base", args.base), ("new", args.new)]
        for label, tree in order if index % 2 == 0 else order[::-1]:
            runs[label].append(run_once(tree, command))
            if not args.json:
                print(f"round {index + 1} {label}: {json.dumps(runs[label][-1])}", flush=True)
    keys = list(dict.fromkeys(k for r in runs["base"] + runs["new"] for k in r))
    result: dict[str, dict[str, float | None]] = {}
    for key in keys:
        base = statistics.median(r.get(key, 0.0) for r in runs["base"])
        new = statistics.median(r.get(key, 0.0) for r in runs["new"])
        result[key] = {"base": base, "new": new, "ratio": new / base if base else None}
    if args.json:
        print(json.dumps(result, indent=2))
        return
    print(f"{'figure (median)':40s} {'base':>14s} {'new':>14s} {'new/base':>9s}")
    for key, row in result.items():
        ratio = f"{row['ratio']:.2f}" if row["ratio"] is not None else "-"
        print(f"{key:40s} {row['base']:>14,.2f} {row['new']:>14,.2f} {ratio:>9s}")


if __name__ == "__main__":
    main()
