"""A TCP proxy in front of the live service that can make the network fail on purpose: refuse the
next requests with a 503 that never reaches the service, or forward them and then cut the
connection (drop) or hold the answer back until the client gives up (stall), so that the client
never sees an answer that the service did apply."""

from __future__ import annotations

import contextlib
import socket
import threading
from typing import BinaryIO


def _refusal() -> bytes:
    body = b'{"error": "unavailable", "message": "failing on purpose"}'
    head = (
        "HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    )
    return head.encode() + body


def read_message(f: BinaryIO) -> bytes | None:
    """One HTTP/1.1 message (head and a Content-Length body), or None at a clean end of stream."""
    head = b""
    while True:
        line = f.readline(65537)
        if not line:
            if head:
                raise ConnectionError("stream ended inside a message head")
            return None
        head += line
        if line in (b"\r\n", b"\n"):
            break
    length = 0
    for header in head.split(b"\r\n")[1:]:
        name, _, value = header.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value)
    return head + f.read(length)


class FlakyProxy:
    def __init__(self, upstream: tuple[str, int]) -> None:
        self.upstream = upstream
        self.requests = 0  # requests that reached the proxy, refused and dropped ones included
        self.dropped = 0
        self._plan: list[str] = []
        self._lock = threading.Lock()
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._listener.settimeout(0.2)
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._accept, daemon=True)

    @property
    def url(self) -> str:
        host, port = self._listener.getsockname()[:2]
        return f"http://{host}:{port}"

    def reset(self) -> None:
        with self._lock:
            self.requests = self.dropped = 0
            self._plan.clear()

    def refuse_next(self, count: int = 1) -> None:
        with self._lock:
            self._plan.extend(["refuse"] * count)

    def drop_next(self, count: int = 1) -> None:
        with self._lock:
            self._plan.extend(["drop"] * count)

    def stall_next(self, count: int = 1) -> None:
        with self._lock:
            self._plan.extend(["stall"] * count)

    def __enter__(self) -> FlakyProxy:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stopping.set()
        self._thread.join(5)
        self._listener.close()

    def _accept(self) -> None:
        while not self._stopping.is_set():
            try:
                conn, _ = self._listener.accept()
            except TimeoutError:
                continue
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        conn.settimeout(10)
        with conn, conn.makefile("rb") as incoming, contextlib.suppress(OSError):
            while (request := read_message(incoming)) is not None:
                with self._lock:
                    self.requests += 1
                    action = self._plan.pop(0) if self._plan else "forward"
                if action == "refuse":
                    conn.sendall(_refusal())
                    return
                answer = self._forward(request)
                if action != "forward":
                    with self._lock:
                        self.dropped += 1
                    if action == "stall":
                        conn.recv(1)  # until the client times out and closes, or our own timeout
                    return  # the service has answered; the client gets a closed connection instead
                conn.sendall(answer)

    def _forward(self, request: bytes) -> bytes:
        with socket.create_connection(self.upstream, timeout=10) as up, up.makefile("rb") as f:
            up.sendall(request)
            answer = read_message(f)
        if answer is None:
            raise ConnectionError("the service closed the connection without an answer")
        return answer
