"""``runwire publish --bus URL [--format F] [--run-id ID] [FILE|-]``: a recorded stream onto a bus.

Reads a stream in any ingest format (NDJSON frames; raw text chunks for
``cogency-wire``) from FILE or stdin, decodes it with the format's ingest
codec and publishes the events through the publisher SDK (batched, bounded,
retried). Each rejected frame is reported on stderr as
``line N: KAI-STREAM-PROTO-000x: …`` while the frames around it are
published; the command exits 1 if any was rejected. At the end it prints how
many events went to each run. ``--format auto`` picks the format from the
first lines.
"""

from __future__ import annotations

import asyncio
import sys
from collections import Counter
from collections.abc import Iterator
from typing import BinaryIO

import click

from runwire.core.envelope import Event
from runwire.core.errors import ConfigError, ProtocolError, RunwireError
from runwire.protocols import INGEST, ingest
from runwire.protocols.base import Ingest
from runwire.protocols.detect import detect
from runwire.sdk.publisher import Publisher

DETECT_LINES = 20
RAW_CHUNK = 64 * 1024


@click.command()
@click.option("--bus", envvar="RUNWIRE_BUS", default="memory://", show_default=True,
              help="Bus URL (memory://, redis://, redis+cluster://, kafka://).")
@click.option("--format", "source", default="auto", show_default=True,
              type=click.Choice(["auto", *INGEST]), help="Input format.")
@click.option("--run-id", default=None, help="Run id for formats whose frames don't name one.")
@click.option("--delivery-timeout", default=30.0, show_default=True, type=float,
              help="Seconds to keep retrying an unreachable bus before giving up.")
@click.argument("file", type=click.File("rb"), default="-")
def publish(bus: str, source: str, run_id: str | None, delivery_timeout: float,
            file: BinaryIO) -> None:
    """Publish a recorded stream of agent run events onto a bus."""
    head = [line for line in (file.readline() for _ in range(DETECT_LINES)) if line]
    try:
        if source == "auto":
            source = detect(head)
        codec = ingest(source, **({"run_id": run_id} if run_id else {}))
    except ConfigError as exc:
        raise click.UsageError(str(exc)) from None
    try:
        counts, rejected = asyncio.run(
            _publish(bus, codec, _frames(codec, head, file), delivery_timeout)
        )
    except RunwireError as exc:
        raise click.ClickException(str(exc)) from None
    total = sum(counts.values())
    runs = ", ".join(f"{run} {n}" for run, n in counts.items())
    click.echo(f"published {total} event(s) from {source} to {len(counts)} run(s): {runs or '-'}")
    if rejected:
        click.echo(f"{rejected} frame(s) rejected", err=True)
        sys.exit(1)


async def _publish(
    url: str, codec: Ingest, frames: Iterator[tuple[int, bytes]], delivery_timeout: float
) -> tuple[Counter[str], int]:
    counts: Counter[str] = Counter()
    rejected = 0
    async with Publisher.connect(url, delivery_timeout=delivery_timeout) as pub:
        for number, data in frames:
            try:
                events = codec.feed(data)
            except ProtocolError as exc:
                rejected += 1
                click.echo(f"line {number}: {exc.at_line(number)}", err=True)
                continue
            await _send(pub, events, counts)
        await _send(pub, codec.close(), counts)
    return counts, rejected


async def _send(pub: Publisher, events: list[Event], counts: Counter[str]) -> None:
    await pub.publish_events(events)
    counts.update(event.run_id for event in events)


def _frames(codec: Ingest, head: list[bytes], file: BinaryIO) -> Iterator[tuple[int, bytes]]:
    """(line number, frame): stripped non-empty lines for NDJSON, raw chunks otherwise."""
    number = 0
    if codec.line_based:
        for line in (*head, *file):
            number += 1
            if line.strip():
                yield number, line.strip()
        return
    for chunk in head:
        number += 1
        yield number, chunk
    while chunk := file.read(RAW_CHUNK):
        yield number + 1, chunk
        number += chunk.count(b"\n")
