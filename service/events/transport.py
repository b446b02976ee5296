"""One delivery attempt over HTTP: resolve the endpoint's host, refuse it if any address is
internal (service/events/addresses.py), then connect to the address checked, never to a second
lookup's answer, while TLS still checks the certificate against the endpoint's name (SNI and
hostname verification on the name, not the address). Redirects are not followed: a 3xx is a failed
attempt like any other non-2xx."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from dataclasses import dataclass

import urllib3
import urllib3.connection

from service.errors import InvalidUrl
from service.events import addresses

TIMEOUT = 10.0  # seconds for the whole attempt: lookup, connect, send, and the answer's status line
USER_AGENT = "quota-ledger-relay"


@dataclass(frozen=True)
class Outcome:
    """What an attempt came to: the answer's status (None: no answer) and, unless 2xx, why it failed."""

    status: int | None
    error: str | None

    @property
    def ok(self) -> bool:
        return self.status is not None and 200 <= self.status < 300

    @property
    def gone(self) -> bool:
        return self.status == 410


def post(url: str, body: bytes, headers: dict[str, str], *, allow_private: bool) -> Outcome:
    """POST `body` to `url` once, within TIMEOUT seconds from the name's lookup to the answer's
    headers (a resolver that hangs, or a receiver that trickles its answer, is cut off then); never
    raises for the network's or the receiver's failures."""
    deadline = time.monotonic() + TIMEOUT
    try:
        target = addresses.parse(url, allow_private=allow_private)
        ip = addresses.resolve(target, allow_private=allow_private, timeout=TIMEOUT)[0]
    except InvalidUrl as e:
        return Outcome(None, e.message)
    name = f"[{target.host}]" if ":" in target.host else target.host  # an IPv6 literal in brackets
    default = 443 if target.scheme == "https" else 80
    host = name if target.port == default else f"{name}:{target.port}"
    sent = {"Host": host, "Content-Type": "application/json", "User-Agent": USER_AGENT, **headers}
    late = f"no answer within {TIMEOUT:g} s"
    left = deadline - time.monotonic()  # what the lookup left of the attempt's time
    if left <= 0:
        return Outcome(None, late)
    conn: urllib3.connection.HTTPConnection
    if target.scheme == "https":
        conn = urllib3.connection.HTTPSConnection(
            str(ip),
            target.port,
            timeout=left,
            cert_reqs="CERT_REQUIRED",
            server_hostname=target.host,
            assert_hostname=target.host,
        )
    else:
        conn = urllib3.connection.HTTPConnection(str(ip), target.port, timeout=left)
    # The socket timeout bounds the connect and each read, not the attempt: the watchdog cuts the
    # connection at the deadline, which ends a read in progress (shutdown wakes a blocked recv; close
    # does not). It can cut only a connection that has its socket: one that fires during the connect
    # is seen right after it, before anything is sent.
    cut = threading.Event()
    watchdog = threading.Timer(left, _cut, args=(conn, cut))
    watchdog.start()
    try:
        conn.connect()
        if cut.is_set():
            raise TimeoutError
        conn.request("POST", target.path, body=body, headers=sent)
        status, location = _answer(conn)
    except Exception as e:  # whatever the peer makes the client raise is a failed attempt
        why = late if cut.is_set() else f"{type(e).__name__}: {e}"
        return Outcome(None, printable(why))
    finally:
        watchdog.cancel()
        conn.close()
    if 200 <= status < 300:
        return Outcome(status, None)
    if 300 <= status < 400:
        return Outcome(status, printable(f"redirect to {location} not followed"))
    return Outcome(status, f"answered {status}")


def _answer(conn: urllib3.connection.HTTPConnection) -> tuple[int, str]:
    """The answer's status and Location (its body is not read)."""
    r = conn.getresponse()
    return r.status, r.headers.get("Location", "?")[:200]


def _cut(conn: urllib3.connection.HTTPConnection, cut: threading.Event) -> None:
    cut.set()
    sock = getattr(conn, "sock", None)
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)


def printable(text: str) -> str:
    """An error for the delivery's row: at most 500 characters, none a control character (a peer's
    Location may hold a NUL, which a text column refuses)."""
    return "".join(c if c.isprintable() else "?" for c in text)[:500]
