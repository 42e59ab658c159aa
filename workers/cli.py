"""The ``runwire`` command. Each subcommand lives in its own module under ``workers.commands``."""

from __future__ import annotations

import importlib

import click

COMMANDS: dict[str, str] = {
    "convert": "workers.commands.convert:convert",
    "publish": "workers.commands.publish:publish",
    "worker": "workers.commands.worker:worker",
    "edge": "workers.commands.edge:edge",
    "token": "workers.commands.token:token",
    "tail": "workers.commands.tail:tail",
    "replay": "workers.commands.replay:replay",
    "up": "workers.commands.up:up",
    "config": "workers.commands.config:config",
}


class _LazyGroup(click.Group):
    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(COMMANDS)

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        target = COMMANDS.get(name)
        if target is None:
            return None
        module, _, attr = target.partition(":")
        command: click.Command = getattr(importlib.import_module(module), attr)
        return command


@click.group(cls=_LazyGroup)
@click.version_option(package_name="runwire")
def main() -> None:
    """runwire: agent run events from Redis Streams or Kafka to every client, resumable."""
