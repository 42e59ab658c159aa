"""Read deploy/compose.yaml and deploy/Dockerfile the way Docker would, to run them as processes.

Only what runwire's compose file uses: YAML merge keys, ``${VAR}``,
``${VAR:-default}`` and ``${VAR:?message}`` interpolation, ``profiles``,
``deploy.replicas``, ``ports``, ``healthcheck``; from the Dockerfile the
``ENV``, ``WORKDIR`` and ``ENTRYPOINT`` the image runs with.
"""

from __future__ import annotations

import json
import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
COMPOSE = DEPLOY / "compose.yaml"
DOCKERFILE = DEPLOY / "Dockerfile"

_VAR = re.compile(r"\$\{(?P<name>[A-Za-z_][A-Za-z0-9_]*)(?:(?P<op>:?[-?])(?P<arg>[^}]*))?\}")


class MissingVariable(ValueError):
    """A ``${VAR:?message}`` whose variable is unset: compose refuses to start."""


def interpolate(value: str, env: dict[str, str]) -> str:
    def one(match: re.Match[str]) -> str:
        name, op, arg = match["name"], match["op"], match["arg"]
        present = env.get(name)
        if op in (":-", ":?") and present == "":
            present = None
        if present is not None:
            return present
        if op in (":?", "?"):
            raise MissingVariable(arg or f"{name} is not set")
        return arg if op in (":-", "-") else ""

    return _VAR.sub(one, value).replace("$$", "$")


def _interpolate_all(node: Any, env: dict[str, str]) -> Any:
    if isinstance(node, str):
        return interpolate(node, env)
    if isinstance(node, list):
        return [_interpolate_all(item, env) for item in node]
    if isinstance(node, dict):
        return {key: _interpolate_all(value, env) for key, value in node.items()}
    return node


def load(env: dict[str, str], profiles: tuple[str, ...] = ()) -> dict[str, dict[str, Any]]:
    """The services that ``docker compose [--profile …] up`` starts, interpolated with ``env``."""
    spec = yaml.safe_load(COMPOSE.read_text())
    services = {
        name: service for name, service in spec["services"].items()
        if not service.get("profiles") or set(service["profiles"]) & set(profiles)
    }
    return dict(_interpolate_all(services, env))


@dataclass
class Image:
    """What a container of deploy/Dockerfile starts with."""

    entrypoint: list[str]
    env: dict[str, str] = field(default_factory=dict)
    workdir: str = "/"


def image() -> Image:
    text = DOCKERFILE.read_text().replace("\\\n", " ")
    built = Image(entrypoint=[])
    for line in text.splitlines():
        instruction, _, rest = line.strip().partition(" ")
        if instruction == "ENV":
            for pair in shlex.split(rest):
                key, _, value = pair.partition("=")
                built.env[key] = value
        elif instruction == "WORKDIR":
            built.workdir = rest.strip()
        elif instruction == "ENTRYPOINT":
            built.entrypoint = json.loads(rest)
    return built


def container_port(service: dict[str, Any]) -> int | None:
    """The container side of a service's first published port (``host:range:container``)."""
    ports = service.get("ports") or []
    return int(str(ports[0]).rsplit(":", 1)[-1]) if ports else None


def replicas(service: dict[str, Any]) -> int:
    return int(service.get("deploy", {}).get("replicas", 1))


def healthcheck(service: dict[str, Any]) -> list[str] | None:
    """A healthcheck's command as an argv (``CMD`` form), or ``["sh", "-c", …]`` (``CMD-SHELL``)."""
    test = service.get("healthcheck", {}).get("test")
    if not test:
        return None
    kind, *argv = test
    return argv if kind == "CMD" else ["sh", "-c", " ".join(argv)]
