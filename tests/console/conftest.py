from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterator
from typing import Any

import pytest

from service.config import Settings
from tests.conftest import running_app

SECRET = "console-test-secret-of-at-least-32-bytes"


@pytest.fixture
def console_settings(settings: Settings) -> Settings:
    return dataclasses.replace(settings, console_secret_key=SECRET)


@pytest.fixture
def app(console_settings: Settings) -> Iterator[Any]:
    with running_app(console_settings) as application:
        yield application


def csrf_of(html: str) -> str:
    found = re.search(r'name="csrf_token" value="([^"]+)"', html)
    assert found, "no CSRF token in the page"
    return found.group(1)


def sign_in(client: Any, key_header: dict[str, str]) -> Any:
    """Sign `client` in with the key of an Authorization header; the response of the POST."""
    key = key_header["Authorization"].removeprefix("Bearer ")
    form = client.get("/console/login")
    return client.post(
        "/console/login", data={"api_key": key, "csrf_token": csrf_of(form.get_data(as_text=True))}
    )


@pytest.fixture
def account(client: Any, keys: Any) -> str:
    from tests.http.conftest import put_account

    put_account(client, keys, "acc-1")
    return "acc-1"
