"""``runwire webhooks list|add|remove|test``: a tenant's webhooks, through the edge's ``/v1/webhooks``.

The token (``--token`` / ``RUNWIRE_TOKEN``) needs the ``control`` scope; its
tenant is whose webhooks these are. ``add`` prints the new webhook with its
secret — the only time the secret is shown (``rotate`` makes a new one).
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import click
import httpx

from runwire.workers.commands.tail import DEFAULT_URL


def _request(ctx: click.Context, method: str, path: str, body: Any = None) -> Any:
    url, token = ctx.obj["url"].rstrip("/"), ctx.obj["token"]
    headers = {"authorization": f"Bearer {token}"} if token else {}

    async def call() -> httpx.Response:
        async with httpx.AsyncClient(timeout=30.0) as client:
            return await client.request(method, url + path, json=body, headers=headers)

    try:
        response = asyncio.run(call())
    except httpx.HTTPError as exc:
        raise click.ClickException(f"cannot reach the edge at {url}: {exc}") from None
    if response.status_code >= 400:
        try:
            detail = response.json().get("error", response.text)
        except ValueError:
            detail = response.text
        raise click.ClickException(f"{response.status_code}: {detail}")
    return response.json() if response.content else None


def _show(data: Any) -> None:
    click.echo(json.dumps(data, indent=2))


@click.group()
@click.option("--url", default=DEFAULT_URL, show_default=True, envvar="RUNWIRE_URL", help="The edge's base URL.")
@click.option("--token", default=None, envvar="RUNWIRE_TOKEN", help="Bearer token with the control scope.")
@click.pass_context
def webhooks(ctx: click.Context, url: str, token: str | None) -> None:
    """Manage webhooks: signed deliveries of run.finished and run.awaiting_approval."""
    ctx.obj = {"url": url, "token": token}


@webhooks.command("list")
@click.pass_context
def list_webhooks(ctx: click.Context) -> None:
    """The tenant's webhooks: URL, events, status (active/disabled and why), last success and failure."""
    for hook in _request(ctx, "GET", "/v1/webhooks")["webhooks"]:
        status = hook["status"] + (f" ({hook['disabled_reason']})" if hook["disabled_reason"] else "")
        run = f" run={hook['run_id']}" if hook["run_id"] else ""
        click.echo(f"{hook['id']}  {hook['url']}  {','.join(hook['events'])}{run}  {status}")


@webhooks.command("add")
@click.argument("target")
@click.option("--event", "events", multiple=True, type=click.Choice(["run.finished", "run.awaiting_approval"]),
              help="An event type (repeatable; run.finished when none is given).")
@click.option("--run-id", default=None, help="Only this run and the runs under it.")
@click.pass_context
def add(ctx: click.Context, target: str, events: tuple[str, ...], run_id: str | None) -> None:
    """Add a webhook for TARGET (a URL); prints it with its secret, shown this once."""
    _show(_request(ctx, "POST", "/v1/webhooks", {"url": target, "events": list(events) or ["run.finished"], "run_id": run_id}))


@webhooks.command("remove")
@click.argument("webhook_id")
@click.pass_context
def remove(ctx: click.Context, webhook_id: str) -> None:
    """Remove a webhook and what it still had to deliver."""
    _request(ctx, "DELETE", f"/v1/webhooks/{webhook_id}")
    click.echo(f"removed {webhook_id}")


@webhooks.command("rotate")
@click.argument("webhook_id")
@click.pass_context
def rotate(ctx: click.Context, webhook_id: str) -> None:
    """A new secret (printed); deliveries carry a signature with the old one for 24 h more."""
    _show(_request(ctx, "POST", f"/v1/webhooks/{webhook_id}/rotate"))


@webhooks.command("test")
@click.argument("webhook_id")
@click.pass_context
def test(ctx: click.Context, webhook_id: str) -> None:
    """Queue a signed webhook.test delivery to the webhook (delivered and retried like any other)."""
    _show(_request(ctx, "POST", f"/v1/webhooks/{webhook_id}/test"))
