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
def relay_settings(settings: Settings) -> Settings:
    """The service's settings for a relay that may reach the local receiver, retrying at once."""
    return dataclasses.replace(settings, webhook_out_allow_private=True, webhook_out_retry_schedule=(0, 0, 0))
