"""Schemathesis holds the service to its own document: every operation of /openapi.json, every
check schemathesis has, with each role's key. Bounded (examples per operation, derandomized, no
example database) so that it stays a fixed, small cost of the suite."""

from __future__ import annotations

import json
import time
from typing import Any

import schemathesis
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from schemathesis.config import SchemathesisConfig
from schemathesis.generation.modes import GenerationMode

from tests.conftest import REVENUECAT_AUTH
from tests.http.conftest import put_account
from tests.webhooks.helpers import sign

MAX_EXAMPLES = 50
MODES = (GenerationMode.POSITIVE, GenerationMode.NEGATIVE)
# Explicit, not a schemathesis.toml found by walking up from the working directory.
CONFIG = SchemathesisConfig.from_dict(
    {
        "checks": {
            # A valid request may meet state that refuses it, as the document says: 410 for an
            # account an earlier example deleted (409, for an exhausted quota, is in the defaults).
            "positive_data_acceptance": {"expected-statuses": ["2xx", "401", "403", "404", "409", "410"]},
        }
    }
)


def _callers(case: Any, keys: Any) -> list[dict[str, str]]:
    """The headers of each caller: a webhook authenticates as its provider does, /v1 with each
    role's key (a route the role may not call must answer 403, as documented). A negative case
    that left out its credential header is sent as generated: that omission is what it tests."""
    header = "Stripe-Signature" if case.path == "/webhooks/stripe" else "Authorization"
    if case.meta.generation.mode.is_negative and (
        header not in (case.headers or {}) or header == "Stripe-Signature"  # a signature can be wrong
    ):
        return [{}]
    if case.path == "/webhooks/stripe":
        # signed over the bytes the WSGI client sends (json.dumps, as werkzeug serializes json=)
        raw = case.body if isinstance(case.body, bytes) else json.dumps(case.body).encode()
        return [{header: sign(raw, timestamp=int(time.time()))}]
    if case.path == "/webhooks/revenuecat":
        return [{header: REVENUECAT_AUTH}]
    return [keys[role] for role in ("product", "admin", "finance")]


def test_the_service_keeps_its_document(app: Any, client: Any, keys: Any, subtests: Any) -> None:
    # Not schemathesis' pytest plugin: its lazy schema (an app from a fixture) needs pytest < 9.
    put_account(client, keys, "acc-1")  # the document's example account id, so examples reach it
    api = schemathesis.openapi.from_wsgi("/openapi.json", app, config=CONFIG)
    for result in api.get_all_operations():
        operation = result.ok()
        strategies = [operation.as_strategy(generation_mode=mode) for mode in MODES]
        strategies += api.get_strategies_from_examples(operation)

        @settings(
            max_examples=MAX_EXAMPLES,
            deadline=None,
            derandomize=True,
            database=None,
            suppress_health_check=list(HealthCheck),
        )
        @given(case=st.one_of(strategies))
        def keeps_its_document(case: Any) -> None:
            if case.path.startswith("/webhooks/") and case.meta.generation.mode.is_positive:
                # A provider's event may hold any JSON, but none sends a NUL, which the inbox's
                # jsonb refuses (400 malformed_body); the document cannot say so of every field.
                assume(not isinstance(case.body, bytes) and "\\u0000" not in json.dumps(case.body))
            for headers in _callers(case, keys):
                case.call_and_validate(headers=headers)

        with subtests.test(operation.label):
            keeps_its_document()
