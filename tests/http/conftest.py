from __future__ import annotations

import socket
from typing import Any

import pytest


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now, for a server subprocess."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def put_account(client: Any, keys: Any, account_id: str = "acc-1", **body: Any) -> Any:
    r = client.put(f"/v1/accounts/{account_id}", json={"kind": "user", **body}, headers=keys["product"])
    assert r.status_code in (200, 201), r.json
    return r.json


def take(client: Any, keys: Any, account_id: str = "acc-1", status: int = 201, **body: Any) -> Any:
    r = client.post(
        f"/v1/accounts/{account_id}/takes", json={"metric": "urls", **body}, headers=keys["product"]
    )
    assert r.status_code == status, r.json
    return r.json


def assert_error(r: Any, status: int, code: str | None = None) -> dict[str, Any]:
    """Every 4xx is JSON {"error": code, "message": text}."""
    assert r.status_code == status, (r.status_code, r.get_data(as_text=True))
    assert r.is_json, r.get_data(as_text=True)
    body: dict[str, Any] = r.json
    assert isinstance(body.get("error"), str) and body["error"]
    assert isinstance(body.get("message"), str) and body["message"]
    if code is not None:
        assert body["error"] == code, body
    return body


@pytest.fixture
def account(client: Any, keys: Any) -> str:
    put_account(client, keys, "acc-1")
    return "acc-1"
