"""The ``runwire`` command. Each subcommand lives in its own module under ``runwire.workers.commands``.

Configuration (see ``runwire.workers.config``): flag > ``RUNWIRE_*`` environment >
config file (``--config``/``RUNWIRE_CONFIG``/``./runwire.toml``) > default.
"""

from __future__ import annotations

from functools import partial
from pathlib import Path

import click

from runwire.core.loader import load
from runwire.workers.config import (
    CONFIG_ENVVAR,
    build_default_map,
    find_config_file,
    read_config_file,
)

COMMANDS: dict[str, str] = {
    "convert": "runwire.workers.commands.convert:convert",
    "publish": "runwire.workers.commands.publish:publish",
    "worker": "runwire.workers.commands.worker:worker",
    "edge": "runwire.workers.commands.edge:edge",
    "token": "runwire.workers.commands.token:token",
    "tail": "runwire.workers.commands.tail:tail",
    "replay": "runwire.workers.commands.replay:replay",
    "up": "runwire.workers.commands.up:up",
    "config": "runwire.workers.commands.config:config",
    "webhooks": "runwire.workers.commands.webhooks:webhooks",
}

CONFIG_PATH_KEY = "runwire.config_path"
"""``ctx.meta`` key holding the config file in force (or None)."""


def load_command(name: str) -> click.Command:
    """The click command registered under ``name`` in COMMANDS (imports its module)."""
    command: click.Command = load(COMMANDS[name])
    return command


def _load_if_available(name: str) -> click.Command | None:
    try:
        return load_command(name)
    except ImportError:
        return None


class _LazyGroup(click.Group):
    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(COMMANDS)

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        if name not in COMMANDS:
            return None
        return load_command(name)


@click.group(cls=_LazyGroup)
@click.version_option(package_name="runwire")
@click.option(
    "--config",
    "config_path",
    type=click.Path(dir_okay=False, path_type=Path),
    envvar=CONFIG_ENVVAR,
    help="TOML config file (default: ./runwire.toml when present).",
)
@click.pass_context
def main(ctx: click.Context, config_path: Path | None) -> None:
    """runwire: agent run events from Redis Streams or Kafka to every client, resumable."""
    path = find_config_file(config_path)
    ctx.meta[CONFIG_PATH_KEY] = path
    if path is None:
        return
    loaders = {name: partial(_load_if_available, name) for name in COMMANDS}
    ctx.default_map = build_default_map(read_config_file(path), path, loaders)
