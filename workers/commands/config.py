"""``runwire config [SUBCOMMAND [FLAGS…]]``: the effective configuration, secrets redacted.

For each option: its value and where it came from — ``flag``, ``env``
(``RUNWIRE_*``), ``file`` (the config file) or ``default``. Flags after
SUBCOMMAND are parsed as that subcommand's, so
``runwire config worker --bus redis://h`` shows what ``runwire worker --bus
redis://h`` would run with. Without SUBCOMMAND, every command is shown.
"""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path
from typing import Any

import click

from runwire.workers.cli import COMMANDS, CONFIG_PATH_KEY, load_command
from runwire.workers.config import (
    effective_options,
    envvar_of,
    file_key,
    options_reference,
    redact,
    subcommands_of,
)


@click.command(context_settings={"ignore_unknown_options": True})
@click.argument("subcommand", required=False)
@click.argument("flags", nargs=-1, type=click.UNPROCESSED)
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
@click.option(
    "--reference",
    is_flag=True,
    help="Print the Markdown reference of every option (flag, environment, file key, default).",
)
@click.pass_context
def config(
    ctx: click.Context,
    subcommand: str | None,
    flags: tuple[str, ...],
    as_json: bool,
    reference: bool,
) -> None:
    """Print the effective configuration (value and source of every option), secrets redacted."""
    if reference:
        available = {}
        for name in sorted(set(COMMANDS) - {"config"}):
            with contextlib.suppress(ImportError):
                available[name] = load_command(name)
        click.echo(options_reference(available))
        return
    main_ctx = ctx.find_root()
    path: Path | None = main_ctx.meta.get(CONFIG_PATH_KEY)
    names = [subcommand] if subcommand else sorted(n for n in COMMANDS if n != "config")
    report: dict[str, Any] = {
        "config_file": str(path) if path else None,
        "environment": _runwire_environment(),
        "commands": {},
    }
    for name in names:
        if name not in COMMANDS:
            raise click.UsageError(f"no such command {name!r}", ctx=ctx)
        try:
            command = load_command(name)
        except ImportError as exc:
            report["commands"][name] = {"unavailable": str(exc)}
            continue
        args = list(flags) if subcommand else []
        report["commands"].update(_describe(command, name, args, main_ctx))
    click.echo(json.dumps(report, indent=2, default=str) if as_json else _as_text(report, path))


def _describe(
    command: click.Command,
    name: str,
    args: list[str],
    parent: click.Context,
    label: str | None = None,
) -> dict[str, Any]:
    """``{label: {option: {value, source, env}}}`` for a command and its subcommands.

    ``runwire config replay export --format x`` describes just that subcommand with its flags.
    """
    label = label or name
    subcommands = subcommands_of(command)
    if args and args[0] in subcommands:
        own_ctx = command.make_context(name, [], parent=parent, resilient_parsing=True)
        picked = args[0]
        return _describe(subcommands[picked], picked, args[1:], own_ctx, f"{label} {picked}")
    own_ctx = command.make_context(name, args, parent=parent, resilient_parsing=True)
    options = {
        file_key(option): {"value": _plain(value), "source": source, "env": envvar_of(option)}
        for option, value, source in effective_options(own_ctx)
    }
    described: dict[str, Any] = {label: options} if options else {}
    for sub_name, sub in subcommands.items():
        described.update(_describe(sub, sub_name, [], own_ctx, f"{label} {sub_name}"))
    return described


def _plain(value: Any) -> Any:
    """Open files (``click.File`` options) by their name; everything else as is."""
    is_file = hasattr(value, "read") or hasattr(value, "write")
    return str(getattr(value, "name", value)) if is_file else value


def _runwire_environment() -> dict[str, str]:
    return {
        key: str(redact(key, value))
        for key, value in sorted(os.environ.items())
        if key.startswith("RUNWIRE_") and not key.startswith("RUNWIRE_TEST_")
    }


def _as_text(report: dict[str, Any], path: Path | None) -> str:
    lines = [f"config file: {path if path else '(none)'}"]
    for name, options in report["commands"].items():
        lines.append("")
        lines.append(f"[{name}]")
        if "unavailable" in options:
            lines.append(f"  (not available: {options['unavailable']})")
            continue
        width = max((len(opt) for opt in options), default=0)
        for opt, info in options.items():
            source = info["source"]
            if source == "env" and info["env"]:
                source = f"env {info['env']}"
            elif source == "file" and path:
                source = f"file {path}"
            lines.append(f"  {opt:<{width}} = {_show(info['value'])}    ({source})")
    return "\n".join(lines)


def _show(value: Any) -> str:
    return json.dumps(value, default=str) if not isinstance(value, str) else repr(value)
