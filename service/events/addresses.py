"""Where a webhook may go (no SSRF): an https URL whose host is, and resolves only to, public
addresses. Checked when an endpoint is created and again before every attempt, after resolving the
name, so that a name rebound to an internal address is refused; the attempt then connects to the
address checked (service/events/transport.py). `allow_private` (WEBHOOK_OUT_ALLOW_PRIVATE) lifts
both rules, for development and tests only."""

from __future__ import annotations

import ipaddress
import socket
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass
from urllib.parse import quote, urlsplit

from service.errors import InvalidUrl

Address = ipaddress.IPv4Address | ipaddress.IPv6Address
MAX_URL = 2048  # webhook_endpoints.url's CHECK
# Seconds a name may take to resolve when an endpoint is created (an attempt gives its lookup what
# is left of its own TIMEOUT). The system resolver's own limit is its timeout times its attempts
# times its servers: 30 s and more with a nameserver that does not answer.
LOOKUP_TIMEOUT = 5.0
# getaddrinfo cannot be interrupted: a lookup runs on a thread of its own, which the caller stops
# waiting for at its deadline. A lookup past its deadline keeps its thread until the resolver gives
# up; at most LOOKUP_THREADS are held so at once (no queue, nothing grows while a resolver hangs),
# and a lookup that finds none free within its own deadline fails, saying so. The relay's attempts
# hold at most a few each of its workers (an attempt gives up after 10 s, a resolver after 30-40).
LOOKUP_THREADS = 32
_lookup_slots = threading.BoundedSemaphore(LOOKUP_THREADS)


@dataclass(frozen=True)
class Target:
    """A checked URL's parts: where to connect and what to ask for."""

    scheme: str
    host: str  # the name (or literal) for the Host header and TLS (SNI, certificate check)
    port: int
    path: str  # with the query


def _refuse(reason: str) -> InvalidUrl:
    return InvalidUrl(f"the URL is refused: {reason}", reason=reason)


def lookup(host: str, port: int) -> list[Address]:
    """The addresses `host` resolves to (the system resolver; a test may replace this function)."""
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return [ipaddress.ip_address(str(info[4][0]).split("%")[0]) for info in infos]


class NoLookupSlot(TimeoutError):
    """Every lookup thread is held by a lookup the resolver has not ended."""


def lookup_within(host: str, port: int, timeout: float) -> list[Address]:
    """`lookup`, waited for at most `timeout` seconds: raises TimeoutError past it (NoLookupSlot
    when it could not even start)."""
    deadline = time.monotonic() + timeout
    if not _lookup_slots.acquire(timeout=max(timeout, 0.0)):
        raise NoLookupSlot
    found: Future[list[Address]] = Future()

    def run() -> None:
        try:
            found.set_result(lookup(host, port))
        except BaseException as e:  # handed to the caller, who raises it
            found.set_exception(e)
        finally:
            _lookup_slots.release()

    # a daemon: a lookup the resolver never ends holds no process from exiting
    try:
        threading.Thread(target=run, name="dns-lookup", daemon=True).start()
    except RuntimeError as e:  # no thread to be had: the slot is given back, and it is a lookup error
        _lookup_slots.release()
        raise OSError(f"no thread for the lookup ({e})") from None
    return found.result(timeout=max(deadline - time.monotonic(), 0.0))  # TimeoutError past it


def refusal(ip: Address) -> str | None:
    """Why a webhook must not connect to `ip` (None: it may). An IPv4 address inside IPv6 (mapped,
    6to4, Teredo) is judged as the IPv4 address it carries."""
    if isinstance(ip, ipaddress.IPv6Address):
        inner = ip.ipv4_mapped or ip.sixtofour or (ip.teredo[1] if ip.teredo else None)
        if inner is not None:
            return refusal(inner)
    for kind, bad in (
        ("loopback", ip.is_loopback),
        ("link-local", ip.is_link_local),
        ("private", ip.is_private),
        ("multicast", ip.is_multicast),
        ("unspecified", ip.is_unspecified),
        ("reserved", ip.is_reserved or not ip.is_global),
    ):
        if bad:
            return f"{ip} is a {kind} address"
    return None


_PRINTABLE_ASCII = "".join(map(chr, range(0x21, 0x7F)))  # kept as written; anything else %-encoded


def parse(url: str, *, allow_private: bool) -> Target:
    """The URL's parts, or InvalidUrl saying why it can never be an endpoint's (its addresses are
    checked by `resolve`)."""
    if len(url) > MAX_URL:
        raise _refuse(f"longer than {MAX_URL} characters")
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as e:
        raise _refuse(f"not a URL: {e}") from None
    schemes = ("https", "http") if allow_private else ("https",)
    if parts.scheme not in schemes:
        raise _refuse("the scheme must be https")
    if not parts.hostname:
        raise _refuse("the URL names no host")
    if parts.username is not None or parts.password is not None:
        raise _refuse("the URL must not carry credentials")
    if parts.fragment:
        raise _refuse("the URL must not have a fragment")
    if any(c.isspace() or ord(c) < 0x20 or ord(c) == 0x7F for c in url):
        raise _refuse("the URL must not contain spaces or control characters")
    try:  # an internationalized name is looked up, sent and checked by TLS in its ASCII form
        host = parts.hostname.encode("idna").decode("ascii")
    except UnicodeError:
        raise _refuse("the host is not a valid name") from None
    path = quote((parts.path or "/") + (f"?{parts.query}" if parts.query else ""), safe=_PRINTABLE_ASCII)
    default = 443 if parts.scheme == "https" else 80
    return Target(parts.scheme, host, port or default, path)


def resolve(target: Target, *, allow_private: bool, timeout: float | None = None) -> list[Address]:
    """The target's addresses, every one of them allowed, or InvalidUrl: a name with one internal
    address among public ones is refused whole, whichever the connection would have picked, and a
    name that takes longer than `timeout` seconds (LOOKUP_TIMEOUT unless given) to resolve is
    refused too."""
    timeout = LOOKUP_TIMEOUT if timeout is None else timeout
    try:
        literal: Address | None = ipaddress.ip_address(target.host)
    except ValueError:
        literal = None
    if literal is not None:
        found = [literal]
    else:
        try:
            found = lookup_within(target.host, target.port, timeout)
        except NoLookupSlot:
            raise _refuse(
                f"{target.host} was not looked up: {LOOKUP_THREADS} lookups of names whose resolver does"
                f" not answer were still waiting after {timeout:g} s"
            ) from None
        except TimeoutError:
            raise _refuse(f"{target.host} did not resolve within {timeout:g} s") from None
        except (OSError, UnicodeError) as e:
            raise _refuse(f"{target.host} does not resolve ({e})") from None
    if not found:
        raise _refuse(f"{target.host} does not resolve")
    if not allow_private:
        for ip in found:
            why = refusal(ip)
            if why:
                raise _refuse(f"{target.host}: {why}")
    return found


def check(url: str, *, allow_private: bool) -> Target:
    """`parse` and `resolve`: what endpoint creation asks (InvalidUrl with the reason)."""
    target = parse(url, allow_private=allow_private)
    resolve(target, allow_private=allow_private)
    return target
