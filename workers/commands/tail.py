"""``runwire tail RUN_ID``: follow one run live in the terminal, from an edge's SSE stream.

Reads ``GET /v1/runs/{run_id}/stream`` with httpx (SSE parsed by
``httpx-sse``). After a disconnect it reconnects with ``Last-Event-ID`` set
to the last seq seen, so nothing is shown twice or skipped (Koder agent stream §7 T3). Exits 0
when the run's own terminal ``run.lifecycle`` arrives, 1 on an error event
(e.g. ``KAI-STREAM-CONN-0002``: the cursor expired), a 4xx answer, or when
the edge stays unreachable for ``--retry-for`` seconds.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from typing import Any
from urllib.parse import quote

import click
import httpx
from httpx_sse import ServerSentEvent, aconnect_sse
from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.text import Text

from runwire.workers.tailview import RunView, plain_line

DEFAULT_URL = "http://127.0.0.1:8765"
Show = Callable[[dict[str, Any]], None]


RESUMABLE_ERRORS = frozenset({"KAI-STREAM-BUF-0001"})
"""Stream errors after which a reconnect with Last-Event-ID continues (this client fell behind)."""


class TailError(click.ClickException):
    """The stream ended with an error the client can't recover from."""


class StreamInterrupted(Exception):
    """The edge closed the stream with a resumable error."""


class StreamFollower:
    """One run's SSE stream, resumed across disconnects; hands each event to ``show``."""

    def __init__(
        self,
        url: str,
        run_id: str,
        *,
        detail: str,
        token: str | None,
        retry_for: float,
        on_status: Callable[[str], None] = lambda _: None,
    ) -> None:
        self.stream_url = f"{url.rstrip('/')}/v1/runs/{quote(run_id, safe='')}/stream"
        self.run_id = run_id
        self.detail = detail
        self.token = token
        self.retry_for = retry_for
        self.on_status = on_status
        self.last_id: str | None = None
        self.reconnects = 0
        self.live = False
        """Whether the current connection got a stream (not an error answer)."""

    async def follow(self, show: Show) -> None:
        """Show events until the run ends; reconnect (resuming) on disconnects."""
        delay, down_since = 0.2, None
        async with httpx.AsyncClient(timeout=httpx.Timeout(10.0, read=60.0)) as client:
            while True:
                self.live = False
                try:
                    if await self._once(client, show):
                        return
                    down_since = None
                except (httpx.TransportError, httpx.RemoteProtocolError, StreamInterrupted) as exc:
                    if self.live:  # it was connected: the outage starts now
                        down_since, delay = None, 0.2
                    down_since = down_since or time.monotonic()
                    if time.monotonic() - down_since > self.retry_for:
                        raise TailError(
                            f"edge unreachable for {self.retry_for:g}s: {exc}"
                        ) from None
                    self.on_status(
                        f"disconnected ({exc or type(exc).__name__}); resuming after {self.last_id or 0}"
                    )
                    await asyncio.sleep(delay)
                    delay = min(delay * 2, 5.0)
                    continue
                delay = 0.2
                self.reconnects += 1
                self.on_status(
                    f"stream closed before the run ended; resuming after {self.last_id or 0}"
                )
                await asyncio.sleep(delay)

    async def _once(self, client: httpx.AsyncClient, show: Show) -> bool:
        """One connection; True when the run ended on it."""
        headers = {}
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        if self.last_id is not None:
            headers["Last-Event-ID"] = self.last_id
        params = {"detail": self.detail}
        async with aconnect_sse(
            client, "GET", self.stream_url, headers=headers, params=params
        ) as source:
            response = source.response
            if response.status_code >= 400:
                await response.aread()
                self._fail_on_status(response)
            self.live = True
            self.on_status("live")
            async for sse in source.aiter_sse():
                if self._handle(sse, show):
                    return True
        return False

    def _fail_on_status(self, response: httpx.Response) -> None:
        if response.status_code >= 500:
            raise httpx.RemoteProtocolError(f"edge answered {response.status_code}")
        raise TailError(f"edge answered {response.status_code}: {response.text.strip()[:300]}")

    def _handle(self, sse: ServerSentEvent, show: Show) -> bool:
        if not sse.data:  # an id-only frame moves the cursor without an event
            self.last_id = sse.id or self.last_id
            return False
        data = json.loads(sse.data)
        if not isinstance(data, dict):
            return False
        if sse.event == "error" or data.get("type") == "error":
            if data.get("code") in RESUMABLE_ERRORS:
                raise StreamInterrupted(str(data.get("message", data.get("code"))))
            raise TailError(f"stream error {data.get('code')}: {data.get('message')}")
        if sse.id:
            self.last_id = sse.id
        show(data)
        payload = data.get("payload") or {}
        return (
            data.get("type") == "run.lifecycle"
            and not data.get("child_id")
            and data.get("run_id", self.run_id) == self.run_id
            and payload.get("state") in ("done", "aborted", "error")
        )


@click.command()
@click.argument("run_id")
@click.option(
    "--url",
    default=DEFAULT_URL,
    show_default=True,
    envvar="RUNWIRE_URL",
    help="The edge's base URL.",
)
@click.option(
    "--detail",
    type=click.Choice(["full", "shaped"]),
    default="shaped",
    show_default=True,
    envvar="RUNWIRE_DETAIL",
    help="full: every delta; shaped: deltas coalesced to at most 10 per second.",
)
@click.option(
    "--token",
    default=None,
    envvar="RUNWIRE_TOKEN",
    help="Bearer token (when the edge has a secret).",
)
@click.option("--plain", is_flag=True, help="One line per event instead of the live view.")
@click.option(
    "--retry-for",
    type=float,
    default=60.0,
    show_default=True,
    envvar="RUNWIRE_RETRY_FOR",
    help="Give up after the edge is unreachable this many seconds.",
)
def tail(
    run_id: str, url: str, detail: str, token: str | None, plain: bool, retry_for: float
) -> None:
    """Follow a run live: reasoning, text, tool calls, child runs, lifecycle."""
    follower = StreamFollower(url, run_id, detail=detail, token=token, retry_for=retry_for)
    try:
        if plain:
            follower.on_status = lambda text: click.echo(f"runwire tail: {text}", err=True)
            asyncio.run(follower.follow(lambda event: click.echo(plain_line(event))))
        else:
            asyncio.run(_live(follower, run_id))
    except KeyboardInterrupt:
        raise SystemExit(130) from None


async def _live(follower: StreamFollower, run_id: str) -> None:
    view = RunView(run_id)
    console = Console()
    status = {"text": "connecting"}

    def frame() -> RenderableType:
        return Group(view.render(), Text(f"[{status['text']}]", style="dim"))

    with Live(frame(), console=console, refresh_per_second=8, transient=False) as live:

        def on_status(text: str) -> None:
            status["text"] = text
            live.update(frame())

        def show(event: dict[str, Any]) -> None:
            view.apply(event)
            live.update(frame())

        follower.on_status = on_status
        await follower.follow(show)
        status["text"] = "run ended"
        live.update(frame())
