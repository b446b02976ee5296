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
    conn, settings, receiver, monkeypatch
):
    monkeypatch.setattr(addresses, "lookup", lambda host, port: [PUBLIC])
    endpoint = endpoints.create(
        conn, url=f"https://{NAME}/hook", events=["credits.granted"], allow_private=False, actor="test"
    )
    event = emit(conn, "credits.granted")
    monkeypatch.setattr(addresses, "lookup", lambda host, port: [LOOPBACK])
    strict = dataclasses.replace(settings, webhook_out_retry_schedule=(3600,))
    assert not strict.webhook_out_allow_private
    Relay(strict, workers=1, poll=0.05).once()
    d = delivery(conn, event, endpoint.id)
    assert (d["status"], d["attempts"], d["last_status"]) == ("pending", 1, None)
    assert d["last_error"] == f"the URL is refused: {NAME}: 127.0.0.1 is a loopback address"
    assert receiver.requests == []
