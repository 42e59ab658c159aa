"""One configuration model for every ``runwire`` service command.

Each option is resolved in this order, first hit wins::

    flag  >  RUNWIRE_* environment  >  config file  >  default

Flags and environment variables are plain click options (``envvar=``); the
config file is layered in as click's ``default_map``, so click itself does
the precedence and records where each value came from
(``Context.get_parameter_source``), which ``runwire config`` prints.

The config file is TOML: ``--config PATH`` on the main command or
``RUNWIRE_CONFIG``, else ``./runwire.toml`` when it exists. Top-level keys
apply to every command that has that option; a table per subcommand
applies to that command only and wins over top-level keys; a group's table
may hold a table per sub-subcommand::

    bus = "redis://redis:6379/0"          # every command with --bus
    [worker]
    group = "runwire"
    [edge]
    port = 8080
    [replay.sweep]
    dry_run = true

Keys are option names (``data-dir`` and ``data_dir`` both work). An unknown
key or section is an error naming it and the file — a typo must not be
silently ignored.
"""

from __future__ import annotations

import tomllib
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import click
from click.core import ParameterSource

from runwire.core.redaction import REDACTED, is_secret_name, redact_url

CONFIG_ENVVAR = "RUNWIRE_CONFIG"
DEFAULT_CONFIG_FILE = Path("runwire.toml")

CommandLoader = Callable[[], click.Command | None]
"""Loads one subcommand; None when its module can't be imported here."""


class ConfigFileError(click.ClickException):
    """The config file can't be read or names something no command has."""

    def __init__(self, path: Path, message: str) -> None:
        super().__init__(f"{path}: {message}")
        self.path = path


def find_config_file(explicit: Path | None) -> Path | None:
    """The config file in force: the explicit one, else ``./runwire.toml`` if present."""
    if explicit is not None:
        return explicit
    return DEFAULT_CONFIG_FILE if DEFAULT_CONFIG_FILE.is_file() else None


def read_config_file(path: Path) -> dict[str, Any]:
    """The parsed TOML document; a missing file or bad TOML is a ConfigFileError."""
    try:
        with path.open("rb") as handle:
            return tomllib.load(handle)
    except FileNotFoundError:
        raise ConfigFileError(path, "no such config file") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigFileError(path, f"invalid TOML: {exc}") from None


def option_key(key: str) -> str:
    """A file key as the option's parameter name (``data-dir`` → ``data_dir``)."""
    return key.replace("-", "_")


def file_key(option: click.Option) -> str:
    """The key naming ``option`` in a config file: its long flag (``--data-dir`` → ``data_dir``)."""
    longs = [opt for opt in option.opts if opt.startswith("--")]
    return option_key(longs[0][2:]) if longs else str(option.name)


def configurable_names(command: click.Command) -> dict[str, str]:
    """Config file keys ``command`` accepts, each mapped to its option's parameter name.

    Both the long flag (``format``) and the parameter name (``format_``) are accepted.
    """
    keys: dict[str, str] = {}
    for param in command.params:
        if isinstance(param, click.Option) and param.name and not param.is_eager:
            keys[param.name] = param.name
            keys[file_key(param)] = param.name
    return keys


def build_default_map(
    document: Mapping[str, Any],
    path: Path,
    commands: Mapping[str, CommandLoader],
) -> dict[str, Any]:
    """Turn a config document into click's ``default_map`` for the main group.

    ``commands`` maps each subcommand name to a loader of its click command.
    Raises ConfigFileError for an unknown section or key.
    """
    shared = {option_key(k): v for k, v in document.items() if not isinstance(v, dict)}
    sections = {k: v for k, v in document.items() if isinstance(v, dict)}
    for name in sections:
        if name not in commands:
            known = ", ".join(sorted(commands))
            raise ConfigFileError(path, f"unknown section [{name}]; sections are: {known}")
    default_map: dict[str, Any] = {}
    accepted: set[str] = set()
    for name, load in commands.items():
        if name not in sections and not shared:
            continue
        command = load()
        if command is None:
            if name in sections:
                raise ConfigFileError(
                    path, f"section [{name}]: the {name} command is not available"
                )
            continue
        entry = _command_defaults(command, shared, sections.get(name, {}), path, name)
        accepted |= _names_in_tree(command)
        if entry:
            default_map[name] = entry
    unknown = sorted(set(shared) - accepted)
    if unknown:
        raise ConfigFileError(
            path, f"unknown key {unknown[0]!r}: no runwire command has an option of that name"
        )
    return default_map


def _command_defaults(
    command: click.Command,
    shared: Mapping[str, Any],
    section: Mapping[str, Any],
    path: Path,
    where: str,
) -> dict[str, Any]:
    """``default_map`` entry of one command; a group's scalar keys also reach its subcommands."""
    names = configurable_names(command)
    subcommands = subcommands_of(command)
    scalars = {option_key(k): v for k, v in section.items() if not isinstance(v, dict)}
    tables = {k: v for k, v in section.items() if isinstance(v, dict)}
    inherited = {**shared, **scalars}
    for key in scalars:
        if key not in names and not any(key in _names_in_tree(sub) for sub in subcommands.values()):
            raise ConfigFileError(
                path, f"unknown key {key!r} in [{where}]; {_accepts(command, where)}"
            )
    for key in tables:
        if key not in subcommands:
            raise ConfigFileError(
                path, f"unknown key {key!r} in [{where}]; {_accepts(command, where)}"
            )
    entry: dict[str, Any] = {names[k]: v for k, v in inherited.items() if k in names}
    for sub_name, sub in subcommands.items():
        sub_where = f"{where}.{sub_name}"
        sub_entry = _command_defaults(sub, inherited, tables.get(sub_name, {}), path, sub_where)
        if sub_entry:
            entry[sub_name] = sub_entry
    return entry


def _accepts(command: click.Command, where: str) -> str:
    flags = {file_key(p) for p in command.params if isinstance(p, click.Option) and not p.is_eager}
    known = ", ".join(sorted(flags | set(subcommands_of(command)))) or "nothing"
    return f"`{where}` accepts: {known}"


def _names_in_tree(command: click.Command) -> set[str]:
    names = set(configurable_names(command))
    for sub in subcommands_of(command).values():
        names |= _names_in_tree(sub)
    return names


def subcommands_of(command: click.Command) -> dict[str, click.Command]:
    """A group's subcommands (lazy groups included); empty for a plain command."""
    if not isinstance(command, click.Group):
        return {}
    ctx = click.Context(command)
    found = {name: command.get_command(ctx, name) for name in command.list_commands(ctx)}
    return {name: sub for name, sub in found.items() if sub is not None}


# ---- reporting ------------------------------------------------------------


def redact(name: str, value: Any) -> Any:
    """``value`` as it may be shown: secrets replaced by ``***``, URL passwords removed."""
    if value is None:
        return None
    if is_secret_name(name):
        return REDACTED
    if isinstance(value, str):
        return redact_url(value)
    if isinstance(value, list | tuple):
        return [redact(name, item) for item in value]
    return value


SOURCE_NAMES: dict[ParameterSource, str] = {
    ParameterSource.COMMANDLINE: "flag",
    ParameterSource.ENVIRONMENT: "env",
    ParameterSource.DEFAULT_MAP: "file",
    ParameterSource.DEFAULT: "default",
    ParameterSource.PROMPT: "prompt",
}


def effective_options(ctx: click.Context) -> Iterator[tuple[click.Option, Any, str]]:
    """Each configurable option of a parsed command: ``(option, redacted value, source)``."""
    for param in ctx.command.params:
        if not isinstance(param, click.Option) or not param.name or param.is_eager:
            continue
        source = ctx.get_parameter_source(param.name)
        label = SOURCE_NAMES.get(source, "default") if source is not None else "default"
        yield param, redact(param.name, ctx.params.get(param.name)), label


def envvar_of(option: click.Option) -> str | None:
    """The environment variable an option reads, if any."""
    if isinstance(option.envvar, str):
        return option.envvar
    if option.envvar:
        return option.envvar[0]
    return None


def options_reference(commands: Mapping[str, click.Command]) -> str:
    """Markdown tables of every command's options: flag, environment variable, file key, default."""
    sections: list[str] = []
    for name, command in commands.items():
        sections += _reference_of(command, name)
    return "\n".join(sections).rstrip() + "\n"


def _reference_of(command: click.Command, label: str) -> list[str]:
    options = [
        p for p in command.params if isinstance(p, click.Option) and p.name and not p.is_eager
    ]
    lines: list[str] = []
    if options:
        lines += [f"`runwire {label}`", "", "| flag | environment | file key | default | meaning |"]
        lines.append("|---|---|---|---|---|")
        lines += [_reference_row(option) for option in options]
        lines.append("")
    for sub_name, sub in subcommands_of(command).items():
        lines += _reference_of(sub, f"{label} {sub_name}")
    return lines


def _reference_row(option: click.Option) -> str:
    flag = " / ".join(f"`{opt}`" for opt in option.opts)
    env = f"`{envvar_of(option)}`" if envvar_of(option) else ""
    meaning = (option.help or "").replace("|", "\\|").split("\n")[0]
    return f"| {flag} | {env} | `{file_key(option)}` | {_shown_default(option)} | {meaning} |"


def _shown_default(option: click.Option) -> str:
    default = option.default
    if option.is_flag:
        return "on" if default is True else "off"
    unset = default is None or repr(default).startswith("Sentinel.")
    if unset or callable(default) or (option.multiple and not default):
        return ""
    return f"`{default}`"


def absolute_store(ctx: click.Context | None, param: click.Parameter | None, value: str | None) -> str | None:
    """A ``--store`` callback: a relative SQLite path (``sqlite:///x.db``) made absolute against the
    working directory, so the replay log is where the user meant and every message names it in full."""
    prefix = "sqlite:///"
    if value and value.startswith(prefix) and not value.startswith(prefix + "/") and ":memory:" not in value:
        path, _, query = value[len(prefix):].partition("?")
        value = f"{prefix}{Path(path).resolve()}" + (f"?{query}" if query else "")
    return value


def absolute_dir(ctx: click.Context | None, param: click.Parameter | None, value: Path | None) -> Path | None:
    """A directory option made absolute against the working directory (``--data-dir``)."""
    return value.resolve() if value is not None else None


def split_addr(addr: str, default_host: str, option: str) -> tuple[str, int]:
    """An option's ``[HOST:]PORT`` as (host, port), ``default_host`` when it names none."""
    host, _, port = addr.rpartition(":")
    if not port.isdigit() or int(port) > 65535:
        raise click.BadParameter(f"{addr!r} is not [HOST:]PORT", param_hint=option)
    return host.strip("[]") or default_host, int(port)
