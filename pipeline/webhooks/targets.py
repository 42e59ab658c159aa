"""Where a delivery may go: no loopback, private or otherwise non-public address unless allowed.

A webhook URL is chosen by a tenant and fetched by runwire's processes, from
inside the operator's network: without a check it is a door to the metadata
service, the database and every internal admin page (SSRF). So a URL is
checked when a webhook is added (every address its host resolves to), and
again at every connection: :class:`GuardedResolver` resolves the host for the
HTTP client, which connects only to an address that passes (an IP literal is
checked by the sender before it sends), so a name that resolved to a
public address at the check and to ``127.0.0.1`` a minute later (DNS
rebinding) gets nowhere. Redirects are never followed (the sender answers a
3xx as a failure), so a public URL can't forward a delivery inward either.

The operator allows private targets with ``--webhooks-allow-private``
(``RUNWIRE_WEBHOOKS_ALLOW_PRIVATE=1``): receivers on the same host or network.
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from collections.abc import Iterable
from urllib.parse import urlsplit

from aiohttp.abc import AbstractResolver, ResolveResult

from ..core.errors import REQ_BAD_PARAMETER, RequestError

URL_CHARS = 2048
"""Longest webhook URL."""
IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address


class TargetRefused(RequestError):
    """A URL runwire will not deliver to (``KAI-STREAM-REQ-0001``, 400 where a request named it)."""

    code = REQ_BAD_PARAMETER


def split_url(url: str) -> tuple[str, int]:
    """``(host, port)`` of an ``http``/``https`` URL with a host and no user info; TargetRefused else."""
    if len(url) > URL_CHARS:
        raise TargetRefused(f"a webhook URL is at most {URL_CHARS} characters")
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        raise TargetRefused(f"bad webhook URL: {exc}") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise TargetRefused("a webhook URL is http:// or https:// with a host")
    if parts.username is not None or parts.password is not None:
        raise TargetRefused("a webhook URL carries no user or password (the signature authenticates)")
    return parts.hostname, port or (443 if parts.scheme == "https" else 80)


def refusal(address: IPAddress) -> str | None:
    """Why a delivery may not go to ``address`` unless private targets are allowed (None: it may)."""
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    if address.is_loopback:
        return "a loopback address"
    if address.is_multicast or address.is_unspecified or address.is_reserved:
        return "not a unicast address"
    if address.is_link_local:
        return "a link-local address"
    if not address.is_global:
        return "a private address"
    return None


class Unresolvable(OSError):
    """A host name with no address."""


async def resolve(host: str, port: int) -> list[IPAddress]:
    """Every address ``host`` resolves to (an IP literal is itself); Unresolvable when none."""
    literal = ip_literal(host)
    if literal is not None:
        return [literal]
    try:
        infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except OSError as exc:
        raise Unresolvable(f"cannot resolve {host}: {exc}") from None
    return list(dict.fromkeys(ipaddress.ip_address(str(info[4][0]).split("%")[0]) for info in infos))


def ip_literal(host: str) -> IPAddress | None:
    try:
        return ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return None


def allowed(addresses: Iterable[IPAddress], host: str, allow_private: bool) -> list[IPAddress]:
    """The addresses a delivery may connect to; TargetRefused when there is none."""
    addresses = list(addresses)
    if allow_private:
        return addresses
    passing = [address for address in addresses if refusal(address) is None]
    if not passing:
        reason = refusal(addresses[0]) if addresses else "no address"
        raise TargetRefused(f"refusing to deliver to {host}: {reason} (allow with --webhooks-allow-private)")
    return passing


async def check_url(url: str, *, allow_private: bool) -> None:
    """TargetRefused unless ``url`` may be delivered to now: its form, and every address its host
    resolves to (a name that does not resolve is refused too)."""
    host, port = split_url(url)
    try:
        addresses = await resolve(host, port)
    except Unresolvable as exc:
        raise TargetRefused(str(exc)) from None
    if not allow_private:
        bad = [address for address in addresses if refusal(address) is not None]
        if bad:
            raise TargetRefused(f"refusing to deliver to {host}: {refusal(bad[0])} ({bad[0]})"
                                " (allow with --webhooks-allow-private)")


class GuardedResolver(AbstractResolver):
    """aiohttp's resolver, answering only addresses :func:`allowed` lets through: the connection
    is made to one of them (aiohttp connects to what its resolver answers)."""

    def __init__(self, *, allow_private: bool) -> None:
        self.allow_private = allow_private

    async def resolve(self, host: str, port: int = 0,
                      family: socket.AddressFamily = socket.AF_INET) -> list[ResolveResult]:
        addresses = allowed(await resolve(host, port), host, self.allow_private)
        return [ResolveResult(hostname=host, host=str(address), port=port,
                              family=socket.AF_INET6 if address.version == 6 else socket.AF_INET,
                              proto=0, flags=socket.AI_NUMERICHOST) for address in addresses]

    async def close(self) -> None:
        return None
