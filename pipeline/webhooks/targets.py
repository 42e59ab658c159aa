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
An IPv6 address that carries an IPv4 one (mapped, 6to4, NAT64, Teredo) is
judged by that one too: it leads there through a translator or a relay.

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


NAT64 = ipaddress.IPv6Network("64:ff9b::/96")
"""The well-known NAT64 prefix (RFC 6052): its last 32 bits are the IPv4 address reached."""
LOCAL_NAT64 = ipaddress.IPv6Network("64:ff9b:1::/48")
"""Local-use NAT64 prefixes (RFC 8215): a network's own translator, never a public target."""


def embedded_ipv4(address: IPAddress) -> ipaddress.IPv4Address | None:
    """The IPv4 address an IPv6 one leads to: IPv4-mapped (``::ffff:0:0/96``), 6to4
    (``2002::/16``), NAT64 (``64:ff9b::/96``) or Teredo's client (``2001::/32``); None else."""
    if not isinstance(address, ipaddress.IPv6Address):
        return None
    if address.ipv4_mapped is not None:
        return address.ipv4_mapped
    if address.sixtofour is not None:
        return address.sixtofour
    if address in NAT64:
        return ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
    if address.teredo is not None:
        return address.teredo[1]
    return None


def refusal(address: IPAddress) -> str | None:
    """Why a delivery may not go to ``address`` unless private targets are allowed (None: it may).

    An IPv6 address that carries an IPv4 one (:func:`embedded_ipv4`) is judged by that IPv4
    address too: ``[2002:7f00:1::]`` or ``[64:ff9b::a00:1]`` reach ``127.0.0.1`` or
    ``10.0.0.1`` through a translator or relay as surely as the IPv4 address itself."""
    embedded = embedded_ipv4(address)
    if embedded is not None:
        inner = refusal(embedded)
        if inner is not None:
            return f"{inner} ({embedded}) inside an IPv6 address"
        if isinstance(address, ipaddress.IPv6Address) and (address.ipv4_mapped is not None or address in NAT64):
            return None  # an IPv4 address written as IPv6, or reached through DNS64/NAT64: judged as itself
    if isinstance(address, ipaddress.IPv6Address) and address in LOCAL_NAT64:
        return "a private address"
    if address.is_loopback:
        return "a loopback address"
    if address.is_multicast or address.is_unspecified or address.is_reserved:
        return "not a unicast address"
    if address.is_link_local:
        return "a link-local address"
    if not address.is_global:
        return "a private address"
    return None


def refused(host: str, reason: str, address: IPAddress | None = None) -> TargetRefused:
    """The refusal of a target by the address rule: the same words where a webhook is added and
    where a deliverer refuses it (``refused: …``, as its webhook's disabled reason shows)."""
    shown = f" ({address})" if address is not None and str(address) != host.strip("[]") else ""
    return TargetRefused(f"refused: {host}{shown} is {reason}, and private targets are not allowed here"
                         " (--webhooks-allow-private or RUNWIRE_WEBHOOKS_ALLOW_PRIVATE=1)")


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
        if not addresses:
            raise TargetRefused(f"refused: {host} has no address")
        raise refused(host, refusal(addresses[0]) or "", addresses[0])
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
            raise refused(host, refusal(bad[0]) or "", bad[0])


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
