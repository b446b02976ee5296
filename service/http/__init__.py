"""Flask lives here (and in service/console/): the app factory, blueprints, schemas and the error →
JSON mapping."""

from __future__ import annotations

import logging

from flask import Flask

from service import console
from service.config import Settings
from service.db import Database
from service.http.runtime import Runtime
from service.plans import load_plans


def build_app(settings: Settings | None = None) -> Flask:
    from service.http import (
        accounts,
        admin,
        errors,
        events,
        finance,
        gauges,
        health,
        inbound,
        index,
        metrics,
        webhook_endpoints,
        webhooks,
    )

    settings = settings or Settings.from_env(serving=True)
    app = Flask("service")
    app.json.sort_keys = False  # type: ignore[attr-defined]
    app.config["MAX_CONTENT_LENGTH"] = 1024 * 1024  # a webhook is a few kB; refuse absurd bodies (413)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    app.extensions["quota"] = Runtime(
        settings=settings,
        db=Database(settings),
        plans=load_plans(settings.plans_file),
        exports=Database(
            settings, name="quota-ledger-export", min_size=0, max_size=settings.export_pool_size
        ),
    )
    errors.init_app(app)
    gauges.init_app(app)
    inbound.init_app(app)
    metrics.init_app(app)  # the outermost WSGI wrapper, so that every answer is timed, refusals too
    for bp in (
        accounts.bp,
        admin.bp,
        finance.bp,
        health.bp,
        events.bp,
        webhook_endpoints.bp,
        webhooks.bp,
        index.bp,
    ):
        app.register_blueprint(bp)
    console.init_app(app, settings)
    return app
