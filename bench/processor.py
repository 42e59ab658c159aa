"""A worker's in-process stages, without a bus or a store: CPU µs per published event per part.

The workload of ``bench/workers.py`` (``--runs`` run trees of a root and two
children, 85 % deltas), encoded once; then, per round, the loop a
consumer-group worker runs on its event loop's thread, batch by batch
(2,048 entries, up to 16 batches merged into one write):

* ``decode_us`` — ``decode_many`` of the batch's frames;
* ``restore_us`` — ``Processor.missing`` and restoring the new streams (no stored checkpoints);
* ``process_us`` — ``Processor.process_each`` (fan-in, sequencing, shaping);
* ``encode_us`` — a write's checkpoints and encoding (``Stages.encode``).

Figures are the median over ``--repeat`` rounds of the CPU time of this
process (``time.process_time``). On a shared machine run two trees
alternately (``bench/alternate.py``); for a figure that does not move with
the machine at all, count instructions with valgrind's callgrind, which gives
the same total on every run of the same code and input::

    valgrind --tool=callgrind --callgrind-out-file=/tmp/cg.out \\
        .venv/bin/python bench/processor.py --events 30000 --repeat 1
    callgrind_annotate /tmp/cg.out | grep "PROGRAM TOTALS"

``python bench/processor.py [--events N] [--runs R] [--repeat K] [--json]``
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from types import SimpleNamespace

sys.path.insert(0, str(Path(__file__).resolve().parent))
from cputime import import_code

import_code()

from runwire.core.envelope import decode_many, encode  # noqa: E402 - the tree import_code() names
from runwire.processing.processor import Processor, StreamOutput  # noqa: E402 - the tree import_code() names
from runwire.processing.stages import FETCH, PENDING_BATCHES, Stages  # noqa: E402 - the tree import_code() names
from workers import workload  # noqa: E402 - the same workload as the worker bench

PARTS = ("decode", "restore", "process", "encode")
_NO_EXPORT = SimpleNamespace(on_encoded=None, on_logged=None)
"""What ``Stages.encode`` reads of its stages: no span exporter is told of the streams."""


def one_round(frames: list[bytes]) -> dict[str, float]:
    processor = Processor()
    spent = dict.fromkeys(PARTS, 0.0)
    pending: dict[str, StreamOutput] = {}
    clock = time.process_time
    for number, start in enumerate(range(0, len(frames), FETCH), 1):
        began = clock()
        events = decode_many(frames[start:start + FETCH])
        decoded = clock()
        for run_id in sorted(processor.missing(events)):
            processor.restore(run_id, None)
        restored = clock()
        _, failures = processor.process_each(events, owned=True, into=pending)  # type: ignore[arg-type]
        assert not failures, failures[:1]
        processed = clock()
        if number % PENDING_BATCHES == 0 or start + FETCH >= len(frames):
            Stages.encode(_NO_EXPORT, pending)  # type: ignore[arg-type]  # (no span exporter)
            pending = {}
        spent["decode"] += decoded - began
        spent["restore"] += restored - decoded
        spent["process"] += processed - restored
        spent["encode"] += clock() - processed
    return {f"{part}_us": seconds / len(frames) * 1e6 for part, seconds in spent.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", type=int, default=100_000)
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    frames = [encode(event) for event in workload(args.events, args.runs)]
    rounds = [one_round(frames) for _ in range(args.repeat)]
    figures = {key: statistics.median(r[key] for r in rounds) for key in rounds[0]}
    figures["total_us"] = sum(figures[f"{part}_us"] for part in PARTS)
    figures["events"] = float(args.events)
    if args.json:
        print(json.dumps(figures))
        return
    print(f"{args.events:,} events, {args.runs} run trees, batches of {FETCH}, "
          f"CPU µs per event, median of {args.repeat}:")
    for key, value in figures.items():
        if key != "events":
            print(f"  {key:12s} {value:6.2f}")


if __name__ == "__main__":
    main()
