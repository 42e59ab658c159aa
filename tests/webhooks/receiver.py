"""A real webhook receiver for tests: uvicorn on a loopback port, verifying every request with the
``standardwebhooks`` library as a receiver in the field does.

It answers 500 to the first ``fail_first`` attempts of each ``webhook-id``
(then 204), 401 to a request the library refuses, and records every attempt;
``accepted`` maps each webhook-id to the bodies it answered 2xx to.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import defaultdict
from collections.abc import AsyncIterator
from typing import Any

from standardwebhooks.webhooks import Webhook, WebhookVerificationError
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from tests.edge.harness import loopback_config, start_uvicorn, stop_uvicorn
from tests.services import free_port


class Receiver:
    def __init__(self, *, fail_first: int = 0, status: int = 204, delay_s: float = 0.0,
                 answer: bytes = b"") -> None:
        self.secret: str | None = None
        self.fail_first = fail_first
        self.status = status
        self.delay_s = delay_s
        self.answer = answer
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.attempts: dict[str, int] = defaultdict(int)
        self.accepted: dict[str, list[dict[str, Any]]] = defaultdict(list)
        self.refused: list[str] = []
        self.requests: list[tuple[str, dict[str, str], bytes]] = []

    async def hook(self, request: Request) -> Response:
        body = await request.body()
        headers = dict(request.headers)
        self.requests.append((request.url.path, headers, body))
        msg_id = headers.get("webhook-id", "")
        self.attempts[msg_id] += 1
        if self.delay_s:
            await asyncio.sleep(self.delay_s)
        try:
            assert self.secret is not None, "the receiver was given no secret"
            payload = Webhook(self.secret).verify(body, headers)
        except (WebhookVerificationError, AssertionError) as exc:
            self.refused.append(f"{msg_id}: {exc}")
            return Response(status_code=401)
        if self.attempts[msg_id] <= self.fail_first:
            return Response(status_code=500)
        if 200 <= self.status < 300:
            self.accepted[msg_id].append(payload)
        return Response(self.answer, status_code=self.status, headers={"location": self.url + "/elsewhere"})

    def run_ids(self, type_: str = "run.finished") -> list[str]:
        """The run of each accepted webhook-id of ``type_`` (once per id)."""
        return sorted(bodies[0]["data"]["run_id"] for bodies in self.accepted.values()
                      if bodies[0]["type"] == type_)


@contextlib.asynccontextmanager
async def serve_receiver(receiver: Receiver) -> AsyncIterator[Receiver]:
    app = Starlette(routes=[Route("/hook", receiver.hook, methods=["POST"]),
                            Route("/elsewhere", receiver.hook, methods=["POST", "GET"])])
    server, task = await start_uvicorn(loopback_config(app, receiver.port))
    try:
        yield receiver
    finally:
        await stop_uvicorn(server, task)
