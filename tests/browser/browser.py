"""Chromium driven from Python over drive.mjs (JSON lines): for the page's tests, screenshots and benchmark."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

HERE = Path(__file__).parent
CHROMIUM = os.environ.get("CHROMIUM", "/usr/bin/chromium")


class BrowserMissing(RuntimeError):
    """node, Chromium or playwright-core is not installed (scripts/bootstrap installs them)."""


def require_tools() -> str:
    node = shutil.which("node")
    if node is None:
        raise BrowserMissing("node is not installed: apt-get install nodejs npm (scripts/bootstrap does it)")
    if not Path(CHROMIUM).exists():
        raise BrowserMissing(f"no Chromium at {CHROMIUM}: apt-get install chromium (scripts/bootstrap does it)")
    if not (HERE / "node_modules" / "playwright-core").is_dir():
        raise BrowserMissing(f"run `npm ci` in {HERE} (scripts/bootstrap does it)")
    return node


class PageError(AssertionError):
    """A command the page could not do (a wait that timed out, a failing expression)."""


class Browser:
    """One Chromium page; every method is one command to drive.mjs."""

    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self.proc = proc

    async def command(self, answer_within: float = 60.0, **command: Any) -> Any:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(json.dumps(command).encode() + b"\n")
        await self.proc.stdin.drain()
        raw = await asyncio.wait_for(self.proc.stdout.readline(), answer_within)
        if not raw:
            raise PageError(f"the browser driver exited during {command}")
        answer = json.loads(raw)
        if not answer["ok"]:
            raise PageError(f"{command}: {answer['error']}")
        return answer["value"]

    async def goto(self, url: str) -> None:
        await self.command(goto=url)

    async def eval(self, expression: str) -> Any:
        return await self.command(eval=expression)

    async def wait(self, expression: str, timeout_s: float = 15.0) -> None:
        await self.command(answer_within=timeout_s + 10, wait=expression, timeout_ms=timeout_s * 1000)

    async def click(self, selector: str) -> None:
        await self.command(click=selector)

    async def focus(self, selector: str) -> None:
        await self.command(focus=selector)

    async def press(self, key: str) -> None:
        await self.command(press=key)

    async def screenshot(self, path: Path, *, full: bool = False) -> None:
        await self.command(screenshot=str(path), full=full)

    async def viewport(self, width: int, height: int) -> None:
        await self.command(viewport=[width, height])

    async def open_streams(self) -> int:
        value: int = await self.command(streams=True)
        return value


@contextlib.asynccontextmanager
async def browser() -> AsyncIterator[Browser]:
    """A headless Chromium page (BrowserMissing when the tools are not installed)."""
    node = require_tools()
    proc = await asyncio.create_subprocess_exec(
        node, str(HERE / "drive.mjs"), stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
        env={**os.environ, "CHROMIUM": CHROMIUM},  # the caller's working directory: paths are its
    )
    try:
        yield Browser(proc)
    finally:
        if proc.stdin is not None:
            proc.stdin.close()
        try:
            await asyncio.wait_for(proc.wait(), 20)
        except TimeoutError:
            proc.kill()
            await proc.wait()
