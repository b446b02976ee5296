"""The retry rule and the reading of answers, without a service: what a gateway or a broken
network can send that the service itself never does."""

from __future__ import annotations

import httpx
import pytest
from quota_client import (
    ApiError,
    ConflictError,
    ConnectionFailedError,
    MetricKindChangedError,
    NotResettableError,
    QuotaClient,
    ServerError,
)
from quota_client._core import RetryPolicy


def test_backoff_is_capped_exponential_with_jitter():
    policy = RetryPolicy(retries=10, backoff=0.1, max_backoff=1.0)
    for attempt, ceiling in [(0, 0.1), (1, 0.2), (2, 0.4), (3, 0.8), (4, 1.0), (9, 1.0)]:
        delays = {policy.delay(attempt, None) for _ in range(50)}
        assert all(0 <= d <= ceiling for d in delays)
        assert len(delays) > 1  # jittered, not one fixed wait
    assert policy.delay(0, 0.7) == 0.7  # the server's Retry-After, when it sends one
    assert policy.delay(0, 60) == 1.0  # ... within the cap


def client_over(handler, **options) -> QuotaClient:
    options = {"retries": 2, "backoff": 0.001, **options}
    return QuotaClient("http://quota.test", "key", transport=httpx.MockTransport(handler), **options)


def test_a_gateway_error_page_is_retried_then_raised_as_server_error():
    calls = []

    def handler(request):
        calls.append(request)
        return httpx.Response(502, text="<html>Bad Gateway</html>")

    with client_over(handler) as quota, pytest.raises(ServerError) as e:
        quota.usage("acc-1", "urls")
    assert (e.value.status, e.value.code, len(calls)) == (502, "http_502", 3)


def test_every_attempt_of_a_take_carries_the_same_key():
    bodies = []

    def handler(request):
        bodies.append(request.content)
        if len(bodies) < 3:
            raise httpx.ReadTimeout("lost", request=request)
        body = {"take_id": 7, "metric": "urls", "units": 1, "used": 1, "limit": 5, "remaining": 4}
        return httpx.Response(200, json={**body, "period": "2026-11", "limit_source": "plan"})

    with client_over(handler) as quota:
        took = quota.take("acc-1", "urls")
    assert len(bodies) == 3 and len(set(bodies)) == 1
    assert took.idempotency_key.encode() in bodies[0] and took.replayed


def test_an_error_that_will_not_heal_is_not_retried():
    calls = []

    def handler(request):
        calls.append(request)
        raise httpx.UnsupportedProtocol("no such scheme", request=request)

    with client_over(handler) as quota, pytest.raises(ConnectionFailedError):
        quota.account("acc-1")
    assert len(calls) == 1


def test_unknown_fields_are_ignored_and_a_non_object_answer_is_an_error():
    def handler(request):
        if request.url.path.endswith("/usage"):
            return httpx.Response(200, json=["not", "an", "object"])
        metric = {"limit": 5, "limit_source": "plan", "used": 1, "remaining": 4, "period": "2026-11"}
        account = {"id": "acc-1", "kind": "user", "plan": "free", "subscription_status": "none"}
        limits = {"urls": {**metric, "resets_at": "2026-12-01T00:00:00Z", "burst": 9}}
        return httpx.Response(200, json={**account, "deleted": True, "limits": limits, "tags": ["new"]})

    with client_over(handler) as quota:
        account = quota.account("acc-1")
        assert account.deleted and account.limits["urls"].remaining == 4
        with pytest.raises(ApiError) as e:
            quota.usage("acc-1", "urls")
    assert e.value.code == "invalid_response"
    # A service from before metric kinds and features: every metric a monthly consumable.
    urls = account.limits["urls"]
    assert (urls.kind, urls.reset, urls.over_limit, account.features) == ("consumable", "month", False, {})


@pytest.mark.parametrize(
    ("code", "error"),
    [("metric_kind_changed", MetricKindChangedError), ("not_resettable", NotResettableError)],
)
def test_the_plan_items_conflicts_have_their_own_errors(code, error):
    def handler(request):
        return httpx.Response(409, json={"error": code, "message": "no"})

    with client_over(handler) as quota, pytest.raises(error) as e:
        quota.take("acc-1", "seats")
    assert isinstance(e.value, ConflictError) and (e.value.status, e.value.code) == (409, code)


def test_a_slot_whose_take_could_not_be_sent_looks_for_nothing():
    failures = []
    with (
        QuotaClient("ftp://quota.test", "key", on_release_error=lambda e, t: failures.append(e)) as quota,
        pytest.raises(ConnectionFailedError, match="1 attempt"),
        quota.slot("acc-1", "urls"),
    ):
        pytest.fail("the block ran")
    assert failures == []
