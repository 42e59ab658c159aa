"""``cogency-wire`` (ingest only): the Cogency streaming protocol's raw LLM text protocol, parsed incrementally.

The LLM writes ``<think>…</think>``, ``<execute>[…]</execute>``,
``<results>[…]</results>`` and ``<respond>…</respond>``; text outside any
marker is user-facing response text. :class:`CogencyWireIngest` is fed
arbitrary chunks of that text (a marker or a UTF-8 character may be split
anywhere) and emits events as soon as they are known:

* ``<think>`` text → ``reasoning.delta`` and ``<respond>``/plain text →
  ``text.delta``, streamed as it arrives (only a possible marker prefix at
  the end of a chunk is held back). Leading and trailing whitespace of each
  segment is dropped, so the blank lines between blocks produce nothing.
* ``<execute>[{"name", "args"}, …]</execute>`` → one ``tool.start`` per call
  (``call_id`` = ``<run_id>.call.<n>``, n counting calls from 1), then
  ``x.cogency.execute`` — the same events the Cogency streaming protocol's event stream has.
* ``<results>[{"tool", "status", "content"}, …]</results>`` → one
  ``tool.end`` per result, answering the open calls in order
  (``ok = status == "success"``).
* A block that is not valid JSON (Cogency streaming protocol: "Invalid JSON is an error:
  Parser rejects and reports error") → ``x.cogency.error`` with
  ``{"payload": {"error": …, "block": …}}``; parsing continues after it.

Hand-written on purpose: the grammar is four fixed markers, and a
character-level state machine is what makes chunk boundaries irrelevant
(an XML or HTML parser would choke on the JSON and the free text).
"""

from __future__ import annotations

import codecs
import json
from collections import deque
from collections.abc import Callable
from typing import Any

from ..core import envelope
from ..core.envelope import Event
from ..core.ulid import MonotonicULID
from .base import Ingest

OUTSIDE, THINK, RESPOND, EXECUTE, RESULTS = "outside", "think", "respond", "execute", "results"
OPENING: dict[str, str] = {
    "<think>": THINK,
    "<respond>": RESPOND,
    "<execute>": EXECUTE,
    "<results>": RESULTS,
}
CLOSING: dict[str, str] = {state: f"</{state}>" for state in (THINK, RESPOND, EXECUTE, RESULTS)}
MAX_BLOCK_CHARS = 1 << 20
"""An ``<execute>``/``<results>`` block longer than this is reported and skipped."""


class _Segment:
    """Streams one text segment with its leading and trailing whitespace removed."""

    __slots__ = ("pending", "started")

    def __init__(self) -> None:
        self.started = False
        self.pending = ""

    def push(self, text: str) -> str:
        if not text:
            return ""
        if not self.started:
            text = text.lstrip()
            if not text:
                return ""
            self.started = True
        else:
            text = self.pending + text
        core = text.rstrip()
        self.pending = text[len(core) :]
        return core

    def reset(self) -> None:
        self.started = False
        self.pending = ""


class CogencyWireIngest(Ingest):
    """Raw cogency LLM text → canonical events, fed in arbitrary chunks."""

    name = "cogency-wire"
    line_based = False

    def __init__(self, *, run_id: str | None = None, clock: Callable[[], str] | None = None) -> None:
        super().__init__(run_id=run_id)
        self.run_id = run_id or "cogency-wire"
        self._clock = clock or envelope.now_ts
        self._ids = MonotonicULID("evt_")
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._buf = ""
        self._state = OUTSIDE
        self._segment = _Segment()
        self._seq = 0
        self._calls = 0
        self._result_count = 0
        self._open_calls: deque[str] = deque()
        self._out: list[Event] = []

    # --- public -----------------------------------------------------------

    def feed(self, data: bytes) -> list[Event]:
        self._buf += self._utf8.decode(data)
        self._scan()
        return self._take()

    def close(self) -> list[Event]:
        self._buf += self._utf8.decode(b"", final=True)
        self._scan()
        if self._state in (EXECUTE, RESULTS):
            self._error(f"unterminated <{self._state}> block at end of input", self._buf)
        elif self._buf:  # a held-back marker prefix that never completed is text
            self._text(self._buf)
        self._buf = ""
        self._state = OUTSIDE
        self._segment.reset()
        return self._take()

    # --- scanning -----------------------------------------------------------

    def _scan(self) -> None:
        while self._buf:
            if self._state in (EXECUTE, RESULTS):
                if not self._scan_block():
                    return
            elif not self._scan_text():
                return

    def _scan_text(self) -> bool:
        """Emit text up to the next marker; True if a marker was consumed."""
        markers = OPENING if self._state == OUTSIDE else {CLOSING[self._state]: OUTSIDE}
        buf = self._buf
        at = buf.find("<")
        while at != -1:
            rest = buf[at:]
            for marker, target in markers.items():
                if rest.startswith(marker):
                    self._text(buf[:at])
                    self._buf = buf[at + len(marker) :]
                    self._enter(target)
                    return True
            if any(marker.startswith(rest) for marker in markers):
                self._text(buf[:at])
                self._buf = rest  # maybe a marker split across chunks: wait for more
                return False
            at = buf.find("<", at + 1)
        self._text(buf)
        self._buf = ""
        return False

    def _scan_block(self) -> bool:
        closing = CLOSING[self._state]
        end = self._buf.find(closing)
        if end == -1:
            if len(self._buf) > MAX_BLOCK_CHARS:
                self._error(f"<{self._state}> block over {MAX_BLOCK_CHARS} characters", self._buf[:200])
                self._buf = ""
                self._state = OUTSIDE
                return True
            return False
        body, self._buf = self._buf[:end], self._buf[end + len(closing) :]
        if self._state == EXECUTE:
            self._execute(body)
        else:
            self._results(body)
        self._enter(OUTSIDE)
        return True

    def _enter(self, state: str) -> None:
        self._segment.reset()
        self._state = state

    # --- events -----------------------------------------------------------

    def _emit(self, kind: str, payload: dict[str, Any]) -> None:
        self._seq += 1
        ts = self._clock()
        self._out.append(
            envelope.make(
                kind, payload, id=self._ids.new(envelope.ts_ms(ts)), ts=ts,
                run_id=self.run_id, seq=self._seq,
            )
        )

    def _take(self) -> list[Event]:
        out, self._out = self._out, []
        return out

    def _text(self, text: str) -> None:
        chunk = self._segment.push(text)
        if chunk:
            kind = envelope.ReasoningDelta.type_name if self._state == THINK else envelope.TextDelta.type_name
            self._emit(kind, {"text": chunk})

    def _error(self, message: str, block: str) -> None:
        self._emit("x.cogency.error", {"payload": {"error": message, "block": block}})

    def _parse_array(self, body: str, marker: str) -> list[Any] | None:
        try:
            items = json.loads(body)
        except ValueError as exc:
            self._error(f"invalid JSON in <{marker}>: {exc}", body)
            return None
        if not isinstance(items, list):
            self._error(f"<{marker}> must hold a JSON array", body)
            return None
        return items

    def _execute(self, body: str) -> None:
        calls = self._parse_array(body, EXECUTE)
        if calls is None:
            return
        bad = [c for c in calls if not (isinstance(c, dict) and isinstance(c.get("name"), str))]
        if bad:
            self._error('<execute> items must be {"name": str, "args": ...}', body)
            return
        for call in calls:
            self._calls += 1
            call_id = f"{self.run_id}.call.{self._calls}"
            self._open_calls.append(call_id)
            self._emit(envelope.ToolStart.type_name, {"call_id": call_id, "tool": call["name"], "input": call.get("args")})
        self._emit("x.cogency.execute", {})

    def _results(self, body: str) -> None:
        results = self._parse_array(body, RESULTS)
        if results is None:
            return
        for result in results:
            self._result_count += 1
            item = result if isinstance(result, dict) else {"content": result}
            # a result with no open call gets an id of its own (counted, so chunking can't change it)
            call_id = self._open_calls.popleft() if self._open_calls else f"{self.run_id}.result.{self._result_count}"
            ok = item.get("status") == "success"
            payload: dict[str, Any] = {"call_id": call_id, "ok": ok, "output": item.get("content")}
            if not ok:
                payload["error"] = item.get("status") or "failure"
            self._emit(envelope.ToolEnd.type_name, payload)
