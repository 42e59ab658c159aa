"""Tables of lazy ``"module:attr"`` targets: backends by URL scheme, codecs by name.

An entry's module is imported only when the entry is used, so optional
clients (aiokafka, psycopg, faust) stay optional.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from typing import Any

from .errors import ConfigError


def load(target: str) -> Any:
    """The object ``target`` (``"package.module:attr"``) names, importing its module."""
    module, _, attr = target.partition(":")
    return getattr(importlib.import_module(module), attr)


def load_entry(table: Mapping[str, str], key: str, unknown: str) -> Any:
    """The object of ``table[key]``; a key not in the table is a ConfigError saying ``unknown``."""
    target = table.get(key)
    if target is None:
        raise ConfigError(unknown)
    return load(target)


def url_scheme(url: str) -> str:
    """``"redis"`` for ``"redis://host"``; ``""`` when the URL has no scheme."""
    return url.split("://", 1)[0] if "://" in url else ""
