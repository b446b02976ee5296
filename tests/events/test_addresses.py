"""The SSRF rules: which URLs an endpoint may have and which addresses an attempt may reach."""

from __future__ import annotations

import ipaddress

import pytest

from service.errors import InvalidUrl
from service.events import addresses

REFUSED = [
    "127.0.0.1", "127.9.9.9", "10.1.2.3", "172.16.0.1", "192.168.1.1", "169.254.169.254", "100.64.0.1",
    "0.0.0.0", "224.0.0.1", "255.255.255.255", "192.0.2.1", "198.18.0.1", "240.0.0.1",
    "::1", "::", "fe80::1", "fc00::1", "fd12::1", "ff02::1", "::ffff:127.0.0.1", "::ffff:10.0.0.1",
    "::ffff:169.254.169.254", "2002:7f00:1::", "2001:db8::1", "64:ff9b::a00:1",
]  # fmt: skip
ALLOWED = ["93.184.216.34", "8.8.8.8", "2606:4700:4700::1111", "::ffff:93.184.216.34"]


@pytest.mark.parametrize("ip", REFUSED)
def test_internal_and_reserved_addresses_are_refused(ip):
    assert addresses.refusal(ipaddress.ip_address(ip)) is not None


@pytest.mark.parametrize("ip", ALLOWED)
def test_public_addresses_are_allowed(ip):
    assert addresses.refusal(ipaddress.ip_address(ip)) is None


@pytest.mark.parametrize(
    "url, reason",
    [
        ("http://93.184.216.34/hook", "scheme must be https"),
        ("ftp://93.184.216.34/hook", "scheme must be https"),
        ("https:///hook", "names no host"),
        ("https://user:pw@93.184.216.34/hook", "credentials"),
        ("https://93.184.216.34:99999/hook", "not a URL"),
        ("https://93.184.216.34/hook#frag", "fragment"),
        ("https://93.184.216.34/a b", "spaces"),
        ("https://127.0.0.1/hook", "127.0.0.1 is a loopback address"),
        ("https://localhost/hook", "loopback"),
        ("https://10.0.0.7/hook", "private"),
        ("https://169.254.169.254/latest/meta-data", "169.254.169.254 is a"),
        ("https://[::1]/hook", "::1 is a loopback address"),
        ("https://[::ffff:127.0.0.1]/hook", "127.0.0.1 is a loopback address"),
        ("https://[fe80::1]/hook", "link-local"),
        ("https://0.0.0.0/hook", "address"),
        ("https://no-such-host.invalid/hook", "does not resolve"),
        ("https://" + "a" * 2050, "longer than"),
    ],
)
def test_check_refuses_with_the_reason(url, reason):
    with pytest.raises(InvalidUrl) as refused:
        addresses.check(url, allow_private=False)
    assert reason in refused.value.details["reason"]
    assert reason in refused.value.message


def test_a_name_with_one_internal_address_among_public_ones_is_refused(monkeypatch):
    found = [ipaddress.ip_address("93.184.216.34"), ipaddress.ip_address("10.0.0.1")]
    monkeypatch.setattr(addresses, "lookup", lambda host, port: found)
    with pytest.raises(InvalidUrl, match=r"10\.0\.0\.1 is a private address"):
        addresses.check("https://hooks.example.test/x", allow_private=False)
    monkeypatch.setattr(addresses, "lookup", lambda host, port: found[:1])
    target = addresses.check("https://hooks.example.test:8443/x?a=1", allow_private=False)
    assert (target.host, target.port, target.path) == ("hooks.example.test", 8443, "/x?a=1")


def test_allow_private_lifts_both_rules():
    for url in ("http://127.0.0.1:8080/hook", "https://localhost/hook", "http://[::1]/x"):
        addresses.check(url, allow_private=True)
    with pytest.raises(InvalidUrl, match="scheme"):
        addresses.check("ftp://127.0.0.1/x", allow_private=True)


def test_hanging_lookups_hold_a_bounded_number_of_threads_and_each_fails_in_its_time(monkeypatch):
    """Endpoint creation waits LOOKUP_TIMEOUT at most for a name; lookups the resolver never ends
    hold at most LOOKUP_THREADS threads, a lookup that finds none free fails in its own time and
    says why, and the threads are given back when the resolver answers."""
    import threading
    import time
    from concurrent.futures import ThreadPoolExecutor

    release = threading.Event()
    public = [ipaddress.ip_address("8.8.8.8")]
    monkeypatch.setattr(addresses, "lookup", lambda host, port: release.wait(30) and public)
    monkeypatch.setattr(addresses, "LOOKUP_TIMEOUT", 0.5)
    monkeypatch.setattr(addresses, "LOOKUP_THREADS", 3)
    monkeypatch.setattr(addresses, "_lookup_slots", threading.BoundedSemaphore(3))

    def lookups() -> list[threading.Thread]:
        return [t for t in threading.enumerate() if t.name == "dns-lookup"]

    def create(n: int) -> tuple[str, float]:
        started = time.monotonic()
        with pytest.raises(InvalidUrl) as refused:
            addresses.check(f"https://hangs-{n}.example.com/hook", allow_private=False)
        return refused.value.details["reason"], time.monotonic() - started

    try:
        with ThreadPoolExecutor(5) as pool:
            results = list(pool.map(create, range(5)))
        held = len(lookups())
    finally:
        release.set()
    assert held == 3
    reasons = sorted(reason for reason, _ in results)
    assert [r.split(" ", 1)[1] for r in reasons] == ["did not resolve within 0.5 s"] * 3 + [
        "was not looked up: 3 lookups of names whose resolver does not answer were still waiting after 0.5 s"
    ] * 2, reasons
    assert max(took for _, took in results) < 1.5
    for t in lookups():
        t.join(5)
    # every thread came back: as many lookups as there are slots, and one more, all answered
    for n in range(4):
        assert addresses.check(f"https://back-{n}.example.com/hook", allow_private=False).host
