"""What only InMemoryQuota has: a clock that can be moved on, its plan items refused as the service
refuses a plan file, admin actions and their misuse, one state shared by a sync and an async fake."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from quota_client.testing import AsyncInMemoryQuota, InMemoryQuota, InMemoryService


def test_a_new_month_starts_from_zero_and_closes_the_old_takes():
    quota = InMemoryQuota(service=InMemoryService({"urls": 2}, period="2026-11"))
    quota.ensure_account("acc-1")
    old = quota.take("acc-1", "urls", units=2)
    quota.service.period = "2026-12"
    assert quota.take("acc-1", "urls", units=2).granted
    assert (quota.release(old).released, quota.release(old).reason) == (False, "period_closed")
    assert [quota.usage("acc-1", "urls", p).used for p in ("2026-11", "2026-12")] == [2, 2]
    assert quota.limits("acc-1")["urls"].resets_at == "2027-01-01T00:00:00Z"


def test_the_clock_can_be_any_callable_and_must_be_aware():
    at = [datetime(2026, 12, 31, 23, 0, tzinfo=UTC)]
    service = InMemoryService({"exports": 1}, metrics={"exports": {"reset": "day"}}, clock=lambda: at[0])
    quota = InMemoryQuota(service=service)
    quota.ensure_account("acc-1")
    assert quota.take("acc-1", "exports").period == "2026-12-31"
    at[0] += timedelta(hours=2)
    assert quota.take("acc-1", "exports").period == "2027-01-01"
    assert service.period == "2027-01"
    with pytest.raises(ValueError, match="aware"):
        service.now = datetime(2027, 1, 2)


@pytest.mark.parametrize(
    ("metrics", "features", "refused"),
    [
        ({"bananas": {"kind": "allocation"}}, None, "metrics.bananas"),
        ({"seats": {"kind": "allocation", "reset": "day"}}, None, "metrics.seats.reset"),
        ({"seats": {"kind": "lease"}}, None, "metrics.seats.kind"),
        ({"urls": {"reset": "week"}}, None, "metrics.urls.reset"),
        ({"urls": {"every": "day"}}, None, "metrics.urls.every"),
        (None, {"seats": True}, "also a metric"),
    ],
)
def test_plan_items_are_refused_as_the_service_refuses_a_plan_file(metrics, features, refused):
    with pytest.raises(ValueError, match=refused):
        InMemoryQuota({"urls": 5, "seats": 1}, metrics=metrics, features=features)


def test_admin_actions_refuse_what_the_service_would_not_know():
    quota = InMemoryQuota({"urls": 2})
    with pytest.raises(KeyError, match="ensure_account"):
        quota.set_limit("nobody", "urls", 5)
    quota.ensure_account("acc-1")
    with pytest.raises(ValueError, match="unknown metric"):
        quota.set_limit("acc-1", "bananas", 5)
    quota.set_limit("acc-1", "urls", 5)
    assert quota.limits("acc-1")["urls"].limit_source == "override"
    quota.clear_limit("acc-1", "urls")
    assert quota.limits("acc-1")["urls"].limit == 2
    with pytest.raises(ValueError, match="unknown feature"):
        quota.set_feature("acc-1", "sso", True)
    with pytest.raises(TypeError, match="limits"):
        InMemoryQuota()
    with pytest.raises(TypeError, match="InMemoryService"):
        InMemoryQuota(features={"sso": True}, service=quota.service)


@pytest.mark.anyio
async def test_a_sync_and_an_async_fake_can_share_one_service():
    service = InMemoryService({"urls": 5})
    sync = InMemoryQuota(service=service)
    sync.ensure_account("acc-1")
    async with AsyncInMemoryQuota(service=service) as quota:
        took = await quota.take("acc-1", "urls", units=3)
    assert sync.usage("acc-1", "urls").used == 3
    assert sync.release(took.take_id).released
