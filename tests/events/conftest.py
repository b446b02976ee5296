from __future__ import annotations

import dataclasses
from collections.abc import Iterator

import pytest

from service.config import Settings
from tests.events.helpers import Receiver


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    r = Receiver()
    yield r
    r.close()


@pytest.fixture
def relay_settings(settings: Settings, relay_db_url: str) -> Settings:
    """The service's settings for a relay, as the relay's role, that may reach the local receiver,
    retrying at once."""
    return dataclasses.replace(
        settings,
        database_url=relay_db_url,
        webhook_out_allow_private=True,
        webhook_out_retry_schedule=(0, 0, 0),
    )
