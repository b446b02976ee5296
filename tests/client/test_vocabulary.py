"""The client's fake speaks the service's words from its own copy (the client cannot import the
service): each copy must be the service's word list, or the fake's answers would drift from the
real ones."""

from __future__ import annotations

from quota_client import testing

from service import vocabulary as v
from service.http.schemas import fields, requests
from service.quota import periods, takes


def test_the_fakes_words_are_the_services() -> None:
    assert tuple(v.AccountKind) == testing.ACCOUNT_KINDS
    assert f"^{testing.ACCOUNT_ID.pattern}$" == v.ACCOUNT_ID_PATTERN
    assert testing.ACCOUNT_ID_RULE == v.ACCOUNT_ID_RULE
    assert tuple(v.ReleaseReason) == testing.RELEASE_REASONS
    assert set(testing.LIMIT_SOURCES) <= set(v.LimitSource)  # the fake has no plans: no fallback
    assert testing.NO_SUBSCRIPTION == v.SubscriptionStatus.NONE
    assert tuple(v.MetricKind) == testing.METRIC_KINDS
    assert tuple(v.ResetInterval) == testing.RESETS
    assert testing.HELD == periods.HELD
    assert f"^{testing.USAGE_PERIOD.pattern}$" == periods.MONTH_OR_DAY_RE.pattern
    assert testing.MAX_LINES == takes.MAX_LINES
    assert testing.MAX_ITEMS == requests.MAX_ITEMS
    assert testing.LINE_SEPARATOR == fields.LINE_SEPARATOR
