"""Secrets never printed: URL passwords, secret query parameters and bearer tokens become ``***``.

* :func:`redact_url` — one URL, with only its password and secret-looking
  query parameters (``token``, ``password``, ``key`` …) replaced.
* :func:`redact_text` — any text (an exception message, a log line, an
  access-log path): every ``scheme://user:password@`` and every
  ``access_token=`` / ``password=`` … value in it.
* :func:`redact_logs` — installs :class:`RedactingFilter` on the root
  logger's handlers and on uvicorn's loggers, so nothing a library logs
  (a request path with ``?access_token=``, an error naming a bus URL)
  reaches a log with its secret. Idempotent.
"""

from __future__ import annotations

import logging
import re
from urllib.parse import parse_qsl, urlencode, urlsplit

REDACTED = "***"
SECRET_WORDS = ("secret", "password", "passwd", "token", "key")

_USERINFO = re.compile(r"(?P<head>[A-Za-z][A-Za-z0-9+.\-]*://[^/\s:@]*:)(?P<secret>[^@\s/]*)@")
_SECRET_PARAM = re.compile(
    r"(?P<head>[?&;](?:[A-Za-z0-9_.\-]*(?:secret|password|passwd|token|key)[A-Za-z0-9_.\-]*)=)"
    r"(?P<secret>[^&#\s\"']*)",
    re.IGNORECASE,
)
_BEARER = re.compile(r"(?P<head>\bBearer\s+)(?P<secret>[A-Za-z0-9\-_.~+/=]+)", re.IGNORECASE)


def is_secret_name(name: str) -> bool:
    """Whether an option or query parameter name holds a secret."""
    lowered = name.lower()
    return any(word in lowered for word in SECRET_WORDS)


def redact_url(value: str) -> str:
    """A URL with its password and secret-looking query parameters replaced by ``***``.

    Only those parts change; the rest of the URL is kept character for character.
    """
    if "://" not in value:
        return value
    parts = urlsplit(value)
    redacted = value
    if "@" in parts.netloc:
        userinfo, _, hosts = parts.netloc.rpartition("@")
        user, sep, _password = userinfo.partition(":")
        netloc = f"{user}{sep}{REDACTED if sep else ''}@{hosts}"
        redacted = redacted.replace(f"//{parts.netloc}", f"//{netloc}", 1)
    if parts.query:
        pairs = parse_qsl(parts.query, keep_blank_values=True)
        query = urlencode([(k, REDACTED if is_secret_name(k) else v) for k, v in pairs], safe="*")
        if any(is_secret_name(k) for k, _ in pairs):
            redacted = redacted.replace(f"?{parts.query}", f"?{query}", 1)
    return redacted


def redact_text(text: str) -> str:
    """``text`` with every URL password, secret query value and bearer token replaced by ``***``."""
    if "://" in text:
        text = _USERINFO.sub(lambda m: m["head"] + REDACTED + "@", text)
    if "=" in text:
        text = _SECRET_PARAM.sub(lambda m: m["head"] + REDACTED, text)
    if "earer" in text:
        text = _BEARER.sub(lambda m: m["head"] + REDACTED, text)
    return text


class RedactingFilter(logging.Filter):
    """Rewrites a record's message and its string (and exception) arguments with :func:`redact_text`.

    Arguments keep their positions and other types, so formatters that
    unpack them (uvicorn's access formatter) still work.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.msg, str):
            record.msg = redact_text(record.msg)
        if isinstance(record.args, tuple):
            record.args = tuple(_redact_arg(arg) for arg in record.args)
        elif isinstance(record.args, dict):
            record.args = {key: _redact_arg(arg) for key, arg in record.args.items()}
        if record.exc_info and not record.exc_text:
            record.exc_text = redact_text(logging.Formatter().formatException(record.exc_info))
        return True


def _redact_arg(arg: object) -> object:
    if isinstance(arg, str):
        return redact_text(arg)
    if isinstance(arg, BaseException):
        return redact_text(str(arg) or type(arg).__name__)
    return arg


_FILTER = RedactingFilter()
_LOGGERS = ("uvicorn", "uvicorn.access", "uvicorn.error")
"""Loggers with handlers of their own (uvicorn's); everything else reaches the root handlers."""


def redact_logs() -> None:
    """Put the redacting filter on the root logger's handlers and on uvicorn's loggers.

    Call it after the handlers are set up (``logging.basicConfig``); a logger's
    filter only sees records logged on that logger, a handler's sees every
    record it writes.
    """
    targets: list[logging.Logger | logging.Handler] = [logging.getLogger(name) for name in _LOGGERS]
    targets.extend(logging.getLogger().handlers)
    for target in targets:
        if _FILTER not in target.filters:
            target.addFilter(_FILTER)
