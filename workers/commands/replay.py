"""``runwire replay …``: offline jobs on the replay log of any store URL.

=============================================  ===========================================
``ls [--tenant T] [--state S] [--since/--until]``  list runs (table, or ``--json``)
``export RUN… [--format F] [--detail D] [-o F]``   JSONL, one frame a line, runs streamed
``import FILE…``                                   JSONL in (``-`` = stdin); bad lines reported
``play RUN --bus URL [--speed N] [--as ID]``       re-publish with the original timing
``fork RUN --at SEQ [--run-id ID] [--bus URL]``    a new run: RUN's events up to SEQ, open to continue
``messages RUN``                                   the run's chat messages (JSON array)
``stats RUN…``                                     events by type, duration, tools, tokens, drops
``sweep [--dry-run]``                              delete runs whose retention expired
=============================================  ===========================================

A run that is unknown or whose retention expired is an error (exit 1).
Progress bars go to stderr, only when it is a terminal.
"""

from __future__ import annotations

import asyncio
import json
import re
import sys
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from functools import wraps
from typing import IO, Any, ParamSpec, TypeVar, cast

import click
import msgspec
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn
from rich.table import Column, Table

from runwire.core.errors import RunwireError
from runwire.jobs.stats import StatsCollector
from runwire.store import open_store
from runwire.store.base import ReplayLog, RunInfo
from runwire.store.jsonl import import_jsonl
from runwire.workers.config import absolute_store

DEFAULT_STORE = "sqlite:///.runwire/replay.db"
P = ParamSpec("P")
T = TypeVar("T")

store_option = click.option(
    "--store", envvar="RUNWIRE_STORE", default=DEFAULT_STORE, show_default=True, callback=absolute_store,
    help="Replay log URL (sqlite:///path or postgresql://…).",
)


def run_async(fn: Callable[P, Awaitable[T]]) -> Callable[P, T]:
    """Run an async click callback; runwire errors become a clean exit 1."""

    @wraps(fn)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> T:
        async def main() -> T:
            return await fn(*args, **kwargs)

        try:
            return asyncio.run(main())
        except RunwireError as exc:
            raise click.ClickException(str(exc)) from None

    return wrapper


_RELATIVE = re.compile(r"^(\d+(?:\.\d+)?)\s*([smhdw])$")
_UNITS = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days", "w": "weeks"}


class When(click.ParamType):
    """An ISO 8601 time (UTC if no offset) or an age such as ``30m``, ``2h``, ``7d``."""

    name = "time"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if isinstance(value, datetime):
            return value
        match = _RELATIVE.match(str(value).strip())
        if match:
            amount = timedelta(**{_UNITS[match[2]]: float(match[1])})
            return datetime.now(UTC) - amount
        try:
            moment = datetime.fromisoformat(str(value))
        except ValueError:
            self.fail(f"{value!r} is neither an ISO 8601 time nor an age like 2h or 7d", param, ctx)
        return moment if moment.tzinfo else moment.replace(tzinfo=UTC)


@contextmanager
def progress_bar(label: str, total: int | None) -> Iterator[Callable[[int], object]]:
    """A rich progress bar on stderr when it is a terminal; a no-op otherwise."""
    if not sys.stderr.isatty():
        yield lambda _: None
        return
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
               TimeRemainingColumn())
    with Progress(*columns, console=Console(stderr=True), transient=True) as bar:
        task = bar.add_task(label, total=total)
        yield lambda n: bar.advance(task, n)


@click.group()
def replay() -> None:
    """Offline jobs on stored runs: list, export, import, re-publish, messages, stats, sweep."""


# ---- ls ----------------------------------------------------------------------
def _run_row(info: RunInfo) -> dict[str, Any]:
    row: dict[str, Any] = msgspec.to_builtins(info)
    return row


def _when(moment: datetime | None) -> str:
    return moment.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S") if moment else ""


UNBOUNDED = 1 << 20
"""A width no table reaches: measured against it, a table has its natural width."""


def print_table(table: Table) -> None:
    """``table`` on stdout: at the terminal's width, or whole when stdout is not a terminal
    (a pipe, a file: nothing cut at 80 columns). Ids fold rather than lose characters."""
    console = Console()
    if not console.is_terminal:
        natural = console.measure(table, options=console.options.update_width(UNBOUNDED))
        console = Console(width=natural.maximum)
    console.print(table)


def _id(header: str) -> Column:
    """A column of run ids: never cut, folded onto a second line when the terminal is narrow."""
    return Column(header, overflow="fold")


def _runs_table(runs: list[RunInfo]) -> Table:
    table = Table(_id("run"), "tenant", "state", "events", "tokens in/out", "dropped", _id("parent"),
                  "updated (UTC)", "expires (UTC)")
    for info in runs:
        table.add_row(info.run_id, info.tenant or "", info.state or "", str(info.events),
                      f"{info.input_tokens}/{info.output_tokens}", str(info.dropped),
                      info.parent_id or "", _when(info.updated_at), _when(info.expires_at))
    return table


@replay.command("ls")
@store_option
@click.option("--tenant", help="Only this tenant's runs.")
@click.option("--state", help="Only runs whose last lifecycle state is this (done, error …).")
@click.option("--since", type=When(), help="Active at or after (ISO time or age: 2h, 7d).")
@click.option("--until", type=When(), help="Started at or before (ISO time or age).")
@click.option("--limit", default=100, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="Print a JSON array.")
@run_async
async def ls(
    store: str, tenant: str | None, state: str | None, since: datetime | None,
    until: datetime | None, limit: int, as_json: bool,
) -> None:
    """List stored runs, newest activity first."""
    async with open_store(store) as log:
        runs = await log.runs(tenant=tenant, state=state, since=since, until=until, limit=limit)
    if as_json:
        click.echo(json.dumps([_run_row(info) for info in runs], default=str))
    else:
        print_table(_runs_table(runs))


# ---- export --------------------------------------------------------------------
async def _known(log: ReplayLog, run_ids: tuple[str, ...]) -> list[RunInfo]:
    return [await log.require_run(run_id) for run_id in run_ids]


@replay.command("export")
@store_option
@click.argument("run_ids", nargs=-1, required=True, metavar="RUN…")
@click.option("--format", "format_", default="koder", show_default=True,
              help="Any egress format (koder, loom, agui, ai-sdk, …).")
@click.option("--detail", type=click.Choice(["full", "shaped"]), default="full",
              show_default=True, help="Every raw event, or the shaped (coalesced) view.")
@click.option("-o", "--output", type=click.File("wb"), default="-", help="File (default stdout).")
@run_async
async def export(
    store: str, run_ids: tuple[str, ...], format_: str, detail: str, output: IO[bytes]
) -> None:
    """Write runs as JSON lines (koder: one canonical envelope a line, in seq order)."""
    from runwire.jobs.replay import Detail, export_run

    async with open_store(store) as log:
        runs = await _known(log, run_ids)
        with progress_bar("export", sum(info.events for info in runs)) as advance:
            for info in runs:
                await export_run(log, info.run_id, output.write, format=format_,
                                 detail=cast(Detail, detail), progress=advance)
    output.flush()


# ---- import --------------------------------------------------------------------
def _lines(source: IO[bytes], advance: Callable[[int], object]) -> Iterator[bytes]:
    for line in source:
        advance(len(line))
        yield line


@replay.command("import")
@store_option
@click.argument("files", nargs=-1, required=True, type=click.File("rb"), metavar="FILE…")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
@run_async
async def import_(store: str, files: tuple[IO[bytes], ...], as_json: bool) -> None:
    """Store JSONL files (idempotent). Bad lines are reported (exit 1); good ones are kept."""
    reports: dict[str, Any] = {}
    async with open_store(store) as log:
        for source in files:
            with progress_bar(f"import {source.name}", None) as advance:
                report = await import_jsonl(log, _lines(source, advance))
            reports[source.name] = report
    failed = False
    for name, report in reports.items():
        for error in report.errors:
            failed = True
            where = f" at `{error.field}`" if error.field else ""
            click.echo(f"{name}:{error.line}: {error.code}: {error.message}{where}", err=True)
        if not as_json:
            click.echo(f"{name}: {report.lines} lines, {report.added} events added, "
                       f"{len(report.runs)} runs, {len(report.errors)} bad lines")
    if as_json:
        click.echo(json.dumps({name: msgspec.to_builtins(r) for name, r in reports.items()}))
    if failed:
        sys.exit(1)


# ---- play ----------------------------------------------------------------------
@replay.command("play")
@store_option
@click.argument("run_id", metavar="RUN")
@click.option("--bus", envvar="RUNWIRE_BUS", required=True, help="Bus URL to publish onto.")
@click.option("--speed", type=click.FloatRange(min=0), default=1.0, show_default=True,
              help="Time scale: 2 = twice as fast, 0 = no waiting.")
@click.option("--as", "as_run", help="Publish under this run id (default: the original); "
              "child runs get ids derived from it.")
@run_async
async def play(store: str, run_id: str, bus: str, speed: float, as_run: str | None) -> None:
    """Re-publish a stored run and its child runs with the original relative timing, seq from 1."""
    from runwire.bus import open_bus
    from runwire.jobs.replay import play_run

    async with open_store(store) as log:
        info = await log.require_run(run_id)
        async with open_bus(bus) as target:
            with progress_bar("play", info.events) as advance:
                sent = await play_run(log, target, run_id, as_run=as_run, speed=speed,
                                      progress=advance)
    click.echo(f"published {sent} events as run {as_run or run_id}", err=True)


# ---- fork ----------------------------------------------------------------------
@replay.command("fork")
@store_option
@click.argument("run_id", metavar="RUN")
@click.option("--at", type=click.IntRange(min=0), help="The seq the fork's history ends at (default: the run's last).")
@click.option("--run-id", "fork_id", help="The fork's run id (default: a new random one).")
@click.option("--bus", envvar="RUNWIRE_BUS", help="Also give the fork its hot views on this bus (without it, the "
              "first worker that continues the fork rebuilds them from the log).")
@click.option("--json", "as_json", is_flag=True, help="Print the fork as JSON.")
@run_async
async def fork(store: str, run_id: str, at: int | None, fork_id: str | None, bus: str | None, as_json: bool) -> None:
    """Fork a stored run: a new run whose history is RUN's events up to a seq, open for an agent to
    continue (its own seqs follow the copied ones) or for clients to read."""
    from runwire.bus import open_bus
    from runwire.jobs.fork import fork_run

    async with open_store(store) as log:
        if bus is None:
            result = await fork_run(log, run_id, at=at, run_id=fork_id)
        else:
            async with open_bus(bus) as target:
                result = await fork_run(log, run_id, at=at, run_id=fork_id, bus=target)
    made = result.fork
    if as_json:
        click.echo(json.dumps({**msgspec.to_builtins(made), "created": result.created}))
    else:
        click.echo(f"{made.run_id}: a fork of {made.source_id} at seq {made.at}"
                   + ("" if result.created else " (made before)"))


# ---- messages, stats --------------------------------------------------------------
@replay.command("messages")
@store_option
@click.argument("run_id", metavar="RUN")
@click.option("--style", type=click.Choice(["chat", "cogency"]), default="chat",
              show_default=True, help="Chat-completions shape, or the Cogency streaming protocol's wire shape.")
@click.option("--reasoning", is_flag=True, help="Keep reasoning (as reasoning_content).")
@click.option("--children", is_flag=True, help="Include fanned-in child run events.")
@run_async
async def messages(
    store: str, run_id: str, style: str, reasoning: bool, children: bool
) -> None:
    """Print a run's chat messages as a JSON array."""
    from runwire.jobs.messages import MessageAssembler, Style

    async with open_store(store) as log:
        await log.require_run(run_id)
        assembler = MessageAssembler(
            style=cast(Style, style), reasoning=reasoning, children=children
        )
        async for event in log.iter_events(run_id):
            assembler.add(event)
    click.echo(json.dumps(assembler.finish(), ensure_ascii=False, indent=2))


def _stats_table(rows: list[dict[str, Any]]) -> Table:
    table = Table(_id("run"), "events", "by type", "duration", "tools (errors)", "tokens in/out",
                  "dropped", "children", "state")
    for row in rows:
        by_type = "\n".join(f"{k} {v}" for k, v in row["by_type"].items())
        table.add_row(row["run_id"], str(row["events"]), by_type,
                      f"{row['duration_ms'] / 1000:.1f} s",
                      f"{row['tool_calls']} ({row['tool_errors']})",
                      f"{row['input_tokens']}/{row['output_tokens']}", str(row["dropped"]),
                      str(len(row["children"])), row["state"] or "")
    return table


@replay.command("stats")
@store_option
@click.argument("run_ids", nargs=-1, required=True, metavar="RUN…")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON array.")
@run_async
async def stats(store: str, run_ids: tuple[str, ...], as_json: bool) -> None:
    """Per-run statistics: events by type, duration, tool calls and errors, tokens, drops."""
    rows: list[dict[str, Any]] = []
    async with open_store(store) as log:
        runs = await _known(log, run_ids)
        with progress_bar("stats", sum(info.events for info in runs)) as advance:
            for info in runs:
                collector = StatsCollector(info.run_id)
                async for event in log.iter_events(info.run_id):
                    collector.add(event)
                advance(info.events)
                rows.append(msgspec.to_builtins(collector.result()))
    if as_json:
        click.echo(json.dumps(rows))
    else:
        print_table(_stats_table(rows))


# ---- sweep -----------------------------------------------------------------------
@replay.command("sweep")
@store_option
@click.option("--dry-run", is_flag=True, help="Only report what would be deleted.")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
@run_async
async def sweep(store: str, dry_run: bool, as_json: bool) -> None:
    """Delete runs whose retention expired (done 90 d, aborted/error 30 d, unfinished 30 d)."""
    async with open_store(store) as log:
        result = await log.sweep(dry_run=dry_run)
    if as_json:
        click.echo(json.dumps({"dry_run": dry_run, **msgspec.to_builtins(result)}))
        return
    verb = "would delete" if dry_run else "deleted"
    click.echo(f"{verb} {len(result.runs)} runs ({result.events} events)")
    for run_id in result.runs:
        click.echo(f"  {run_id}")


__all__ = ["replay"]
