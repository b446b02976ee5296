"""One delivery attempt over HTTP: resolve the endpoint's host, refuse it if any address is
internal (service/events/addresses.py), then connect to the address checked, never to a second
lookup's answer, while TLS still checks the certificate against the endpoint's name (SNI and
hostname verification on the name, not the address). Redirects are not followed: a 3xx is a failed
attempt like any other non-2xx."""

from __future__ import annotations

from dataclasses import dataclass

import urllib3

from service.errors import InvalidUrl
from service.events import addresses

TIMEOUT = 10.0  # seconds for the whole attempt: connect, send, and the answer's status line
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
    """POST `body` to `url` once; never raises for the network's or the receiver's failures."""
    try:
        target = addresses.parse(url, allow_private=allow_private)
        ip = addresses.resolve(target, allow_private=allow_private)[0]
    except InvalidUrl as e:
        return Outcome(None, e.message)
    name = f"[{target.host}]" if ":" in target.host else target.host  # an IPv6 literal in brackets
    default = 443 if target.scheme == "https" else 80
    host = name if target.port == default else f"{name}:{target.port}"
    sent = {"Host": host, "Content-Type": "application/json", "User-Agent": USER_AGENT, **headers}
    timeout = urllib3.Timeout(total=TIMEOUT)
    pool: urllib3.HTTPConnectionPool
    if target.scheme == "https":
        pool = urllib3.HTTPSConnectionPool(
            str(ip),
            target.port,
            timeout=timeout,
            retries=False,
            maxsize=1,
            cert_reqs="CERT_REQUIRED",
            server_hostname=target.host,
            assert_hostname=target.host,
        )
    else:
        pool = urllib3.HTTPConnectionPool(str(ip), target.port, timeout=timeout, retries=False, maxsize=1)
    try:
        with pool:
            r = pool.urlopen(
                "POST",
                target.path,
                body=body,
                headers=sent,
                redirect=False,
                retries=False,
                preload_content=False,
                assert_same_host=False,
            )
            r.release_conn()
    except urllib3.exceptions.HTTPError as e:
        return Outcome(None, f"{type(e).__name__}: {e}"[:500])
    except OSError as e:
        return Outcome(None, f"{type(e).__name__}: {e}"[:500])
    if 200 <= r.status < 300:
        return Outcome(r.status, None)
    if 300 <= r.status < 400:
        return Outcome(r.status, f"redirect to {r.headers.get('Location', '?')[:200]} not followed")
    return Outcome(r.status, f"answered {r.status}")
