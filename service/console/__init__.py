"""The web console: server-rendered pages for finance and admins over the same domain functions the
JSON API calls (service/quota, service/billing), under /console (docs/console.md).

It is on only with CONSOLE_SECRET_KEY of at least MIN_SECRET_BYTES: without it the blueprint is not
registered and every /console path answers 404. Sessions and CSRF: sessions.py; the pages:
views.py; the usage plot's geometry: plot.py."""

from __future__ import annotations

from flask import Flask

from service.config import Settings

MIN_SECRET_BYTES = 32


def disabled_reason(settings: Settings) -> str | None:
    """Why the console is off, in one line; None when it is on."""
    size = len(settings.console_secret_key.encode())
    if size == 0:
        return "the console is off: CONSOLE_SECRET_KEY is not set (docs/console.md)"
    if size < MIN_SECRET_BYTES:
        return (
            f"the console is off: CONSOLE_SECRET_KEY has {size} bytes, it needs at least "
            f"{MIN_SECRET_BYTES} (docs/console.md)"
        )
    return None


def init_app(app: Flask, settings: Settings) -> None:
    """Register the console's pages when it is on."""
    if disabled_reason(settings) is not None:
        return
    from service.console import sessions, views

    app.extensions["console"] = sessions.Sessions(settings)
    app.register_blueprint(views.bp)
