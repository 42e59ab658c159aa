"""CPU of the publisher's batch cycle when it lingers: one event per batch, each awaited.

Run: ``.venv/bin/python bench/batch_cycle.py [--events N] [--rounds R]``; with
``RUNWIRE_CODE=<other checkout>`` (``bench/alternate.py``) the same for another tree.

Each round queues a text delta (``Run.delta_nowait``), then yields to the loop until the bus has
it, ``--events`` times, on an in-process bus with a 10 µs linger: every event is a batch of its
own that waited out a linger (the flusher's wake-up, its linger, the bus call and its deadline).
The figure is CPU µs per batch (``time.process_time``), the median of the rounds.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from cputime import import_code

import_code()

from runwire import Publisher  # noqa: E402 - the tree import_code() names


async def one_round(events: int) -> float:
    async with Publisher.connect(f"memory://batch-{uuid.uuid4().hex[:8]}", linger_ms=0.01) as pub:
        run = pub.run("batch-cycle")
        started = time.process_time()
        for count in range(1, events + 1):
            run.delta_nowait("text.delta", "w ")
            while pub.published < count:  # noqa: ASYNC110 - a flush would skip the linger
                await asyncio.sleep(0)
        return (time.process_time() - started) * 1e6 / events


async def main(events: int, rounds: int) -> dict[str, float]:
    await one_round(max(events // 10, 10))  # warm-up
    return {"batch_cycle_us": statistics.median([await one_round(events) for _ in range(rounds)])}


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=3000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    figures = asyncio.run(main(args.events, args.rounds))
    print(json.dumps(figures) if args.json else "\n".join(f"{k}: {v:.2f}" for k, v in figures.items()))
