"""deploy/nginx.conf, compose's front, run by a real nginx (Debian's `nginx` package) in front of the
app served on a local port: what nginx answers by itself (413, 502, 504) is JSON in the API's error
shape, and what the app answers passes through. The fixture adapts only the addresses (listen, the
upstream), the file paths and the upstream read timeout; skipped, saying why, without nginx."""

from __future__ import annotations

import http.client
import json
import re
import shutil
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from werkzeug.http import HTTP_STATUS_CODES
from werkzeug.serving import make_server

from service.http.errors import error_code
from tests.http.conftest import free_port

ROOT = Path(__file__).resolve().parents[2]
CONF = (ROOT / "deploy" / "nginx.conf").read_text()
NGINX = shutil.which("nginx") or next((p for p in ("/usr/sbin/nginx",) if Path(p).exists()), None)


def adapted(conf: str, *, port: int, upstream: str, tmp: Path) -> str:
    """The compose file's nginx.conf with this machine's addresses and paths."""
    for old, new in (
        ("listen 8080;", f"listen 127.0.0.1:{port};"),
        ("set $web web:8000;", f"set $web {upstream};\n        proxy_read_timeout 1s;"),
        ("access_log /dev/stdout;", "access_log off;"),
        ("error_log /dev/stderr warn;", f"error_log {tmp}/error.log warn;"),
    ):
        assert old in conf, old
        conf = conf.replace(old, new)
    kinds = ("client_body", "proxy", "fastcgi", "uwsgi", "scgi")
    temp = "".join(f"    {kind}_temp_path {tmp}/{kind};\n" for kind in kinds)
    return f"pid {tmp}/nginx.pid;\n" + conf.replace("http {\n", "http {\n" + temp, 1)


class Front:
    def __init__(self, upstream: str, tmp: Path) -> None:
        if NGINX is None:
            pytest.skip("no nginx binary (Debian: apt-get install nginx)")
        tmp.chmod(0o777)  # under root the workers run as nobody and write their temp files here
        self.port = free_port()
        (tmp / "nginx.conf").write_text(adapted(CONF, port=self.port, upstream=upstream, tmp=tmp))
        self.log = tmp / "error.log"
        self.proc = subprocess.Popen(
            [NGINX, "-p", str(tmp), "-c", str(tmp / "nginx.conf"), "-g", "daemon off;"],
            stderr=subprocess.PIPE,
        )
        deadline = time.monotonic() + 10
        while True:
            assert self.proc.poll() is None, self.proc.stderr.read() if self.proc.stderr else ""
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                return
            except OSError:
                assert time.monotonic() < deadline, "nginx did not start"
                time.sleep(0.05)

    def request(self, method: str, path: str, body: bytes | None = None) -> tuple[int, str, bytes]:
        c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=10)
        try:
            c.request(method, path, body=body, headers={"Content-Type": "application/json"})
            r = c.getresponse()
            return r.status, r.getheader("Content-Type", ""), r.read()
        finally:
            c.close()

    def close(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=10)


@pytest.fixture
def app_port(app: Any) -> Iterator[int]:
    """The app under test on a local port (werkzeug's server, in a thread)."""
    server = make_server("127.0.0.1", 0, app, threaded=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server.server_port
    server.shutdown()


@pytest.fixture
def front(tmp_path: Path) -> Iterator[Any]:
    fronts: list[Front] = []

    def start(upstream: str) -> Front:
        fronts.append(Front(upstream, tmp_path / f"front{len(fronts)}"))
        return fronts[-1]

    for p in (tmp_path / f"front{i}" for i in range(3)):
        p.mkdir()
    yield start
    for f in fronts:
        f.close()


def assert_json_error(status: int, content_type: str, body: bytes, want_status: int, code: str) -> None:
    assert status == want_status, body
    assert content_type.startswith("application/json"), (content_type, body)
    doc = json.loads(body)
    assert set(doc) == {"error", "message"} and doc["error"] == code and doc["message"], doc


def test_the_app_answers_through_the_front(front, app_port):
    f = front(f"127.0.0.1:{app_port}")
    status, _, body = f.request("GET", "/healthz")
    assert (status, json.loads(body)) == (200, {"status": "ok"}), body
    # the app's own errors pass through as the app wrote them
    assert_json_error(*f.request("GET", "/no-such-route"), 404, "not_found")


def test_a_body_over_the_limit_is_a_json_413_from_nginx(front, app_port):
    f = front(f"127.0.0.1:{app_port}")
    answer = f.request("POST", "/webhooks/stripe", b"x" * (2 * 1024 * 1024))
    assert_json_error(*answer, 413, "request_entity_too_large")


def test_an_upstream_that_is_down_is_a_json_502(front):
    f = front(f"127.0.0.1:{free_port()}")  # nothing listens there
    assert_json_error(*f.request("GET", "/healthz"), 502, "bad_gateway")


def test_an_upstream_that_does_not_answer_is_a_json_504(front):
    with socket.socket() as mute:  # accepts connections (the backlog) and never answers
        mute.bind(("127.0.0.1", 0))
        mute.listen(8)
        f = front(f"127.0.0.1:{mute.getsockname()[1]}")
        assert_json_error(*f.request("GET", "/healthz"), 504, "gateway_timeout")


def test_every_error_nginx_makes_has_the_apps_code_for_its_status():
    answered = set()  # the statuses the client gets: each caught one, or the one after `=`
    for caught, changed in re.findall(r"error_page ([\d ]+?) (?:=(\d+) )?/", CONF):
        answered |= {int(changed)} if changed else {int(s) for s in caught.split()}
    bodies = dict(re.findall(r"^\s+(\d{3})\s+'(\{.*\})';", CONF, re.M))
    assert answered == {int(s) for s in bodies}, "each status answered has its body in the map"
    assert {413, 502, 504} <= answered
    for status, body in bodies.items():
        assert json.loads(body)["error"] == error_code(HTTP_STATUS_CODES[int(status)]), (status, body)


def test_a_header_over_nginxs_buffers_is_a_json_431(front, app_port):
    f = front(f"127.0.0.1:{app_port}")
    with socket.create_connection(("127.0.0.1", f.port), timeout=10) as s:
        s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 40000 + b"\r\n\r\n")
        head, _, body = s.makefile("rb").read().partition(b"\r\n\r\n")
    status = int(head.split()[1])
    content_type = re.search(rb"(?im)^content-type: *(\S+)", head)
    assert_json_error(status, content_type.group(1).decode() if content_type else "", body, 431,
                      "request_header_fields_too_large")  # fmt: skip


def test_nginx_resolves_the_web_service_at_run_time():
    # an `upstream` block or a literal proxy_pass host is resolved once, at start: a recreated web
    # container (new address) would answer 502 until nginx restarts
    assert re.search(r"^\s*resolver \S+", CONF, re.M)
    assert re.search(r"proxy_pass http://\$\w+;", CONF)
    assert "upstream " not in CONF
