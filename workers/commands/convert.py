"""``runwire convert --from F --to T [FILE]``: one stream from one protocol format to another.

Reads NDJSON frames (raw text chunks for ``cogency-wire``) from FILE or stdin,
writes one JSON object a line to stdout. Every valid frame is written; each
rejected one is reported on stderr as ``line N: KAI-STREAM-PROTO-000x: …``
and the command exits 1 if any was rejected. ``--from auto`` picks the format
from the first lines (:func:`runwire.protocols.detect.detect`).
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from typing import BinaryIO

import click

from runwire.core.errors import ConfigError, RunwireError
from runwire.protocols import EGRESS, INGEST
from runwire.protocols.detect import detect
from runwire.protocols.transcode import Transcoder

DETECT_LINES = 20
RAW_CHUNK = 64 * 1024


@click.command()
@click.option(
    "--from",
    "source",
    default="auto",
    show_default=True,
    type=click.Choice(["auto", *INGEST]),
    help="Input format.",
)
@click.option(
    "--to", "target", required=True, type=click.Choice(list(EGRESS)), help="Output format."
)
@click.option("--run-id", default=None, help="Run id for formats whose frames don't name one.")
@click.argument("file", type=click.File("rb"), default="-")
def convert(source: str, target: str, run_id: str | None, file: BinaryIO) -> None:
    """Convert a stream of agent run events from one protocol format to another."""
    head = [file.readline() for _ in range(DETECT_LINES)]
    head = [line for line in head if line]
    try:
        if source == "auto":
            source = detect(head)
        transcoder = Transcoder(source, target, run_id=run_id)
    except ConfigError as exc:
        raise click.UsageError(str(exc)) from None
    except ImportError as exc:
        raise click.ClickException(f"format {target!r} is not available: {exc}") from None
    out = click.get_binary_stream("stdout")
    try:
        _run(transcoder, _frames(transcoder, head, file), out)
    except RunwireError as exc:
        raise click.ClickException(str(exc)) from None
    out.flush()
    if transcoder.rejected:
        sys.exit(1)


def _frames(
    transcoder: Transcoder, head: list[bytes], file: BinaryIO
) -> Iterator[tuple[int, bytes]]:
    """(line number, frame) pairs: whole lines for NDJSON, raw chunks otherwise."""
    number = 0
    for line in head:
        number += 1
        yield number, line
    if transcoder.line_based:
        for line in file:
            number += 1
            yield number, line
        return
    while chunk := file.read(RAW_CHUNK):
        yield number + 1, chunk
        number += chunk.count(b"\n")


def _run(transcoder: Transcoder, frames: Iterator[tuple[int, bytes]], out: BinaryIO) -> None:
    line_based = transcoder.line_based
    for number, data in frames:
        if line_based:
            data = data.strip()
            if not data:
                continue
        encoded, error = transcoder.feed(data, number)
        for frame in encoded:
            out.write(frame + b"\n")
        if error is not None:
            click.echo(f"line {number}: {error}", err=True)
    for frame in transcoder.close():
        out.write(frame + b"\n")
