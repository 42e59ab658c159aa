"""Retention settings from constructor arguments or store URL query parameters.

``?retention_done_days=90&retention_failed_days=30&retention_unfinished_days=30``
set the default policy; ``tenant.<name>.retention_done_days=7`` (and the other
two) override it for one tenant. Every other query parameter is left for the
backend's own connection settings.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from urllib.parse import parse_qsl, urlencode

import msgspec

from ..core.errors import ConfigError


class RetentionPolicy(msgspec.Struct, kw_only=True, frozen=True):
    done: timedelta = timedelta(days=90)
    failed: timedelta = timedelta(days=30)
    """aborted and error runs"""
    unfinished: timedelta = timedelta(days=30)
    """runs with no terminal event, measured from their last activity"""

    def keep_for(self, state: str | None) -> timedelta:
        if state == "done":
            return self.done
        if state in ("aborted", "error"):
            return self.failed
        return self.unfinished


_FIELDS = {"retention_done_days": "done", "retention_failed_days": "failed",
           "retention_aborted_days": "failed", "retention_unfinished_days": "unfinished"}


def _days(name: str, value: str) -> timedelta:
    try:
        days = float(value)
    except ValueError:
        raise ConfigError(f"{name} must be a number of days, not {value!r}") from None
    if days < 0:
        raise ConfigError(f"{name} must not be negative")
    return timedelta(days=days)


def _apply(policy: RetentionPolicy, changes: Mapping[str, timedelta]) -> RetentionPolicy:
    return RetentionPolicy(
        done=changes.get("done", policy.done),
        failed=changes.get("failed", policy.failed),
        unfinished=changes.get("unfinished", policy.unfinished),
    )


def split_retention(
    url: str, default: RetentionPolicy | None = None
) -> tuple[str, RetentionPolicy, dict[str, RetentionPolicy]]:
    """``url`` without its retention parameters, the default policy, per-tenant policies."""
    head, _, query = url.partition("?")
    kept: list[tuple[str, str]] = []
    base: dict[str, timedelta] = {}
    tenants: dict[str, dict[str, timedelta]] = {}
    for name, value in parse_qsl(query, keep_blank_values=True):
        field = name.rsplit(".", 1)[-1]
        if field not in _FIELDS:
            kept.append((name, value))
        elif name.startswith("tenant.") and name.count(".") >= 2:
            tenant = name[len("tenant."):].rsplit(".", 1)[0]
            tenants.setdefault(tenant, {})[_FIELDS[field]] = _days(name, value)
        elif name == field:
            base[_FIELDS[field]] = _days(name, value)
        else:
            raise ConfigError(f"unknown store URL parameter {name!r}")
    policy = _apply(default or RetentionPolicy(), base)
    per_tenant = {t: _apply(policy, changes) for t, changes in tenants.items()}
    clean = f"{head}?{urlencode(kept)}" if kept else head
    return clean, policy, per_tenant


def utc_now() -> datetime:
    """The default clock."""
    return datetime.now(UTC)
