"""``runwire token``: print a bearer token for the edge (needs RUNWIRE_SECRET)."""

from __future__ import annotations

import click


@click.command()
@click.option("--tenant", required=True, help="The tenant the token speaks for.")
@click.option("--run", "runs", multiple=True, help="A run id the token may touch (repeat); default: all.")
@click.option("--scope", "scopes", multiple=True, type=click.Choice(["read", "write", "control", "ops"]),
              help="read, write (ingest), control, ops (/metrics) (repeat) [default: read].")
@click.option("--ttl", default=3600, show_default=True, type=click.IntRange(min=1),
              help="Seconds until the token expires.")
@click.option("--secret", required=True, envvar="RUNWIRE_SECRET", show_envvar=True,
              help="HS256 key shared with the edge (≥ 32 bytes).")
def token(tenant: str, runs: tuple[str, ...], scopes: tuple[str, ...], ttl: int, secret: str) -> None:
    """Print an HS256 bearer token for TENANT (use as `Authorization: Bearer …` or ?access_token=)."""
    from runwire.edge.service.auth import issue_token

    if len(secret.encode()) < 32:
        raise click.UsageError("RUNWIRE_SECRET must be at least 32 bytes (HS256 key)")
    click.echo(
        issue_token(secret, tenant=tenant, runs=list(runs) or None, scopes=scopes or ("read",), ttl_s=ttl)
    )
