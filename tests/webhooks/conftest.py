"""Fixtures for webhook tests; the helpers live in helpers.py."""

from __future__ import annotations

from typing import Any

import pytest

from tests.webhooks.helpers import STRIPE_ACCOUNT, create_account


@pytest.fixture
def acc(client: Any, keys: dict[str, dict[str, str]]) -> str:
    """The account the Stripe fixtures name, created by the product."""
    create_account(client, keys, STRIPE_ACCOUNT)
    return STRIPE_ACCOUNT
