"""Quota ledger service."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from flask import Flask

    from service.config import Settings


def create_app(settings: Settings | None = None) -> Flask:
    """The Flask app: JSON API under /v1, webhooks, health, metrics and OpenAPI."""
    from service.http import build_app

    return build_app(settings)
