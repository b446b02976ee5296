"""An attempt connects to the address it checked, after resolving the name, while TLS still
verifies the endpoint's name; a name that resolves to an internal address at delivery is refused
and recorded."""

from __future__ import annotations

import dataclasses
import datetime as dt
import ipaddress
import ssl
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from service.events import addresses, endpoints, transport
from service.events.relay import Relay
from tests.events.helpers import delivery, emit

NAME = "hooks.example.test"
PUBLIC = ipaddress.ip_address("93.184.216.34")
LOOPBACK = ipaddress.ip_address("127.0.0.1")


def _certificate(tmp: Path) -> tuple[Path, Path]:
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, NAME)])
    now = dt.datetime.now(dt.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=1))
        .not_valid_after(now + dt.timedelta(hours=1))
        .add_extension(x509.SubjectAlternativeName([x509.DNSName(NAME)]), critical=False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = tmp / "cert.pem", tmp / "key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    return cert_path, key_path


@pytest.fixture
def tls_receiver(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[int, list[Any]]]:
    """An HTTPS server on 127.0.0.1 with a certificate for NAME, trusted by this process only."""
    cert, key = _certificate(tmp_path)
    monkeypatch.setenv("SSL_CERT_FILE", str(cert))
    seen: list[Any] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            seen.append((self.headers.get("Host"), self.rfile.read(int(self.headers["Content-Length"]))))
            self.send_response(204)
            self.end_headers()

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server.server_address[1], seen
    server.shutdown()
    server.server_close()


def test_tls_goes_to_the_checked_address_and_verifies_the_name(tls_receiver, monkeypatch):
    port, seen = tls_receiver
    lookups: list[str] = []

    def lookup(host: str, port: int) -> list[Any]:
        lookups.append(host)
        return [LOOPBACK]

    monkeypatch.setattr(addresses, "lookup", lookup)
    outcome = transport.post(f"https://{NAME}:{port}/in", b"{}", {}, allow_private=True)
    assert (outcome.status, outcome.error) == (204, None)
    assert seen == [(f"{NAME}:{port}", b"{}")] and lookups == [NAME]  # one lookup, then that address
    # a name the certificate is not for fails, though the address is the same
    wrong = transport.post(f"https://other.example.test:{port}/in", b"{}", {}, allow_private=True)
    assert wrong.status is None and "doesn't match" in (wrong.error or "")
    assert len(seen) == 1


def test_a_name_rebound_to_loopback_at_delivery_is_refused_and_recorded(
    conn, relay_settings, receiver, monkeypatch
):
    monkeypatch.setattr(addresses, "lookup", lambda host, port: [PUBLIC])
    endpoint = endpoints.create(
        conn, url=f"https://{NAME}/hook", events=["credits.granted"], allow_private=False, actor="test"
    )
    event = emit(conn, "credits.granted")
    monkeypatch.setattr(addresses, "lookup", lambda host, port: [LOOPBACK])
    strict = dataclasses.replace(
        relay_settings, webhook_out_allow_private=False, webhook_out_retry_schedule=(3600,)
    )
    assert not strict.webhook_out_allow_private
    Relay(strict, workers=1, poll=0.05).once()
    d = delivery(conn, event, endpoint.id)
    assert (d["status"], d["attempts"], d["last_status"]) == ("pending", 1, None)
    assert d["last_error"] == f"the URL is refused: {NAME}: 127.0.0.1 is a loopback address"
    assert receiver.requests == []


class _Raw:
    """A TCP server on 127.0.0.1 that answers every connection with `reply(send)` (send: bytes ->
    None), to play a receiver no HTTP library would be."""

    def __init__(self, reply: Any) -> None:
        import socket as socket_module

        self.sock = socket_module.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(4)
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}/hooks"

        def serve() -> None:
            while True:
                try:
                    c, _ = self.sock.accept()
                except OSError:
                    return
                c.recv(65536)
                try:
                    reply(c.sendall)
                except OSError:
                    pass
                finally:
                    c.close()

        threading.Thread(target=serve, daemon=True).start()

    def close(self) -> None:
        self.sock.close()


def test_a_receiver_that_trickles_its_answer_is_cut_off_at_the_deadline(monkeypatch):
    import time

    def trickle(send: Any) -> None:
        for byte in b"HTTP/1.1 200 OK\r\nX-Slow: " + b"a" * 100:
            send(bytes([byte]))
            time.sleep(0.2)  # each read well within the socket's timeout, the whole far past it

    monkeypatch.setattr(transport, "TIMEOUT", 1.0)
    server = _Raw(trickle)
    try:
        started = time.monotonic()
        outcome = transport.post(server.url, b"{}", {}, allow_private=True)
        took = time.monotonic() - started
    finally:
        server.close()
    assert outcome == transport.Outcome(None, "no answer within 1 s")
    assert took < 3


def test_a_location_with_control_characters_is_recorded_printable():
    server = _Raw(
        lambda send: send(
            b"HTTP/1.1 302 Found\r\nLocation: http://10.0.0.1/\x00\x1b\r\nContent-Length: 0\r\n\r\n"
        )
    )
    try:
        outcome = transport.post(server.url, b"{}", {}, allow_private=True)
    finally:
        server.close()
    assert outcome.status == 302 and outcome.error is not None
    assert outcome.error.isprintable() and "10.0.0.1" in outcome.error


def test_an_internationalized_name_is_looked_up_and_sent_in_ascii(monkeypatch):
    looked_up = []
    monkeypatch.setattr(addresses, "lookup", lambda host, port: looked_up.append(host) or [LOOPBACK])
    target = addresses.parse("https://例子.测试/hooks/ä", allow_private=False)
    assert target.host == "xn--fsqu00a.xn--0zwm56d" and target.path == "/hooks/%C3%A4"
    outcome = transport.post("https://例子.测试/hooks", b"{}", {}, allow_private=False)
    assert looked_up == ["xn--fsqu00a.xn--0zwm56d"]
    assert outcome.status is None and "127.0.0.1" in (outcome.error or "")  # refused after the lookup


def test_a_lookup_that_hangs_ends_the_attempt_at_its_deadline(monkeypatch):
    """getaddrinfo cannot be interrupted and a resolver whose server does not answer takes 30 s
    and more: the attempt's deadline counts from before the lookup, and the attempt ends there."""
    import time

    release = threading.Event()
    monkeypatch.setattr(addresses, "lookup", lambda host, port: release.wait(30) and [PUBLIC])
    monkeypatch.setattr(transport, "TIMEOUT", 1.0)
    started = time.monotonic()
    try:
        outcome = transport.post(f"https://{NAME}/in", b"{}", {}, allow_private=False)
    finally:
        release.set()
    assert time.monotonic() - started < 2
    assert outcome == transport.Outcome(None, f"the URL is refused: {NAME} did not resolve within 1 s")


def test_a_slow_lookup_leaves_a_trickling_receiver_only_what_is_left_of_the_deadline(monkeypatch):
    """The attempt's deadline counts from before the lookup for the connect and the reads too: a
    lookup that took most of it leaves a receiver only the rest (the watchdog, which cuts only a
    connection that has its socket, is also checked right after the connect)."""
    import time

    def trickle(send: Any) -> None:
        for byte in b"HTTP/1.1 200 OK\r\nX-Slow: " + b"a" * 100:
            send(bytes([byte]))
            time.sleep(0.2)

    def slow_lookup(host: str, port: int) -> list[Any]:
        time.sleep(0.9)
        return [LOOPBACK]

    monkeypatch.setattr(addresses, "lookup", slow_lookup)
    monkeypatch.setattr(transport, "TIMEOUT", 1.0)
    server = _Raw(trickle)
    try:
        started = time.monotonic()
        outcome = transport.post(server.url.replace("127.0.0.1", NAME), b"{}", {}, allow_private=True)
        took = time.monotonic() - started
    finally:
        server.close()
    assert outcome == transport.Outcome(None, "no answer within 1 s")
    assert took < 1.6
