"""The plan config: parsing, validation errors that name the bad entry, limits and lapsed rules."""

from __future__ import annotations

import tomllib
from datetime import UTC, datetime
from pathlib import Path

import pytest

from service.errors import PlanConfigError
from service.plans import load_plans, parse_plans

ROOT = Path(__file__).resolve().parents[2]
STATUSES = ("none", "trialing", "active", "past_due", "unpaid", "incomplete", "paused", "canceled", "expired")


def _parse(text: str):
    return parse_plans(tomllib.loads(text))


def test_sample_and_test_configs_load():
    for path in (ROOT / "plans.toml", ROOT / "tests" / "plans.toml"):
        cfg = load_plans(path)
        assert cfg.free_plan == "free"
        assert {"free", "pro", "business"} <= set(cfg.plans)
        assert cfg.metrics == tuple(sorted(cfg.metrics))


def test_limits_unlimited_and_unlisted_metrics():
    cfg = _parse(
        """
        free_plan = "starter"
        [plans.starter]
        limits = { urls = 5 }
        [plans.max]
        limits = { urls = "unlimited", seats = 0, exports = 3 }
        stripe_prices = ["max_m"]
        """
    )
    assert cfg.metrics == ("exports", "seats", "urls")
    assert cfg.limits("starter") == {"exports": 0, "seats": 0, "urls": 5}  # unlisted = 0
    assert cfg.limits("max") == {"exports": 3, "seats": 0, "urls": None}
    assert cfg.limit("gone", "urls") == 5, "an unknown plan gets the free plan's limits"
    assert cfg.plan_for_stripe_price(None, "max_m") == "max"
    assert cfg.plan_for_stripe_price("nope") is None


def test_the_highest_plan_wins_when_keys_name_several():
    cfg = load_plans(ROOT / "tests" / "plans.toml")  # free, basic, pro, business: lowest first
    assert cfg.plan_for_stripe_price("pro_monthly", "basic_monthly") == "pro"
    assert cfg.plan_for_stripe_price("basic_monthly", "business_monthly", "pro_monthly") == "business"
    assert cfg.plan_for_revenuecat(["basic", "pro"], None) == "pro"


def test_revenuecat_entitlement_wins_over_product():
    cfg = load_plans(ROOT / "tests" / "plans.toml")
    assert cfg.plan_for_revenuecat(["pro"], "basic:monthly") == "pro"
    assert cfg.plan_for_revenuecat([], "basic:monthly") == "basic"
    assert cfg.plan_for_revenuecat(["unknown"], None) is None


def test_kinds_and_features():
    plans = _parse(
        'free_plan = "free"\n[metrics]\nseats = { kind = "allocation" }\napi_calls = { reset = "day" }\n'
        "[plans.free]\nlimits = { urls = 5, seats = 1, api_calls = 3 }\n"
        '[plans.pro]\nlimits = { urls = 50 }\nfeatures = ["sso", "api"]'
    )
    assert [(m, plans.metric(m).kind, plans.metric(m).reset) for m in plans.metrics] == [
        ("api_calls", "consumable", "day"),
        ("seats", "allocation", None),
        ("urls", "consumable", "month"),
    ]
    at = datetime(2026, 12, 31, 23, 59, tzinfo=UTC)
    assert [plans.period(m, at) for m in plans.metrics] == ["2026-12-31", "held", "2026-12"]
    assert plans.features == ("api", "sso")
    assert plans.has_feature("pro", "sso") and not plans.has_feature("free", "sso")
    assert not plans.has_feature("unknown-plan", "sso")  # the free plan's


_KINDS = 'free_plan = "free"\n[plans.free]\nlimits = { urls = 1, seats = 1 }\n[metrics]\n'


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "plans"),
        ('free_plan = "free"\n[plans]', "plans"),
        ('free_plan = "gold"\n[plans.free]\nlimits = {}', "free_plan"),
        ("[plans.free]\nlimits = {}", "free_plan"),
        ('free_plan = "free"\n[plans.free]\nlimits = { urls = -1 }', "plans.free.limits.urls"),
        ('free_plan = "free"\n[plans.free]\nlimits = { urls = 1.5 }', "plans.free.limits.urls"),
        ('free_plan = "free"\n[plans.free]\nlimits = { urls = true }', "plans.free.limits.urls"),
        ('free_plan = "free"\n[plans.free]\nlimits = { urls = "lots" }', "plans.free.limits.urls"),
        ('free_plan = "free"\n[plans.free]\nlimits = 5', "plans.free.limits"),
        ('free_plan = "free"\n[plans.free]\nlimit = {}', "unknown keys"),
        ('free_plan = "free"\n[plans.free]\nstripe_prices = "p"', "plans.free.stripe_prices"),
        ('free_plan = "free"\n[plans.free]\nstripe_prices = [""]', "plans.free.stripe_prices"),
        (
            'free_plan = "a"\n[plans.a]\nstripe_prices = ["p"]\n[plans.b]\nstripe_prices = ["p"]',
            "maps to both",
        ),
        # [metrics] and features (issue: plan items)
        (_KINDS + 'seats = { kind = "lease" }', "metrics.seats.kind"),
        (_KINDS + 'urls = { reset = "week" }', "metrics.urls.reset"),
        (_KINDS + 'seats = { kind = "allocation", reset = "month" }', "metrics.seats.reset"),
        (_KINDS + 'storage = { kind = "allocation" }', "metrics.storage: no plan lists"),
        (_KINDS + 'urls = { every = "day" }', "metrics.urls: unknown keys"),
        (_KINDS + 'urls = "day"', "metrics.urls: expected a table"),
        ('metrics = 5\nfree_plan = "free"\n[plans.free]\nlimits = {}', "metrics: expected a table"),
        ('free_plan = "free"\n[plans.free]\nlimits = { urls = 1 }\nfeatures = ["urls"]', "also a metric"),
        ('free_plan = "free"\n[plans.free]\nfeatures = "sso"', "plans.free.features"),
        # thresholds (issue 26: events out)
        ('thresholds = [0, 100]\nfree_plan = "free"\n[plans.free]', "thresholds: expected"),
        ('thresholds = [80, 101]\nfree_plan = "free"\n[plans.free]', "thresholds: expected"),
        ('thresholds = "80"\nfree_plan = "free"\n[plans.free]', "thresholds: expected"),
        ('free_plan = "free"\n[plans.free]\nthresholds = [80.5]', "plans.free.thresholds: expected"),
        ('free_plan = "free"\n[plans.free]\nthresholds = [true]', "plans.free.thresholds: expected"),
        ('free_plan = "free"\n[plans.free]\nthresholds = [80, 80]', "plans.free.thresholds: a percent"),
    ],
)
def test_invalid_configs_name_the_bad_entry(text, message):
    with pytest.raises(PlanConfigError, match=message):
        _parse(text)


def test_missing_or_broken_file(tmp_path):
    with pytest.raises(PlanConfigError, match="not found"):
        load_plans(tmp_path / "nope.toml")
    bad = tmp_path / "bad.toml"
    bad.write_text("free_plan = ")
    with pytest.raises(PlanConfigError, match=r"bad\.toml"):
        load_plans(bad)
    binary = tmp_path / "bin.toml"
    binary.write_bytes(b"\xff\xfe")
    with pytest.raises(PlanConfigError):
        load_plans(binary)


CREDIT_BASE = """
free_plan = "free"
[metrics]
seats = { kind = "allocation" }
[plans.free]
limits = { urls = 5, seats = 1 }
[plans.pro]
limits = { urls = 50, seats = 5 }
stripe_prices = ["pro_m"]
revenuecat_products = ["pro.m"]
"""


def test_credit_packs_load_and_find_their_product():
    cfg = _parse(
        CREDIT_BASE
        + """
        [credit_packs.small]
        metric = "urls"
        units = 100
        expires_after_days = 30
        stripe_prices = ["urls_100"]
        revenuecat_products = ["urls.100"]
        [credit_packs.forever]
        metric = "urls"
        units = 10
        """
    )
    assert cfg.packs["small"].units == 100 and cfg.packs["forever"].expires_after_days is None
    assert cfg.pack_for_revenuecat_product("urls.100") is cfg.packs["small"]
    assert cfg.pack_for_revenuecat_product("pro.m") is None


@pytest.mark.parametrize(
    ("pack", "named"),
    [
        ('metric = "urls"\nunits = 1\nstripe_prices = ["pro_m"]', "'pro_m' is listed by both plans.pro"),
        (
            'metric = "urls"\nunits = 1\nrevenuecat_products = ["pro.m"]',
            "'pro.m' is listed by both plans.pro",
        ),
        ('metric = "seats"\nunits = 1', "credit_packs.x.metric: 'seats' is an allocation"),
        ('metric = "nope"\nunits = 1', "credit_packs.x.metric"),
        ('metric = "urls"\nunits = 0', "credit_packs.x.units"),
        ('metric = "urls"\nunits = 1\nexpires_after_days = "1"', "credit_packs.x.expires_after_days"),
        ('metric = "urls"\nunits = 1\nprice = 3', "credit_packs.x: unknown keys ['price']"),
    ],
)
def test_a_credit_pack_that_would_mean_two_things_is_refused_naming_it(pack, named):
    with pytest.raises(PlanConfigError, match=named.replace("[", r"\[").replace("]", r"\]")):
        _parse(CREDIT_BASE + "[credit_packs.x]\n" + pack + "\n")


def test_one_product_in_two_packs_is_refused():
    two = '[credit_packs.a]\nmetric = "urls"\nunits = 1\nstripe_prices = ["p"]\n'
    two += '[credit_packs.b]\nmetric = "urls"\nunits = 2\nstripe_prices = ["p"]\n'
    with pytest.raises(PlanConfigError, match=r"credit_packs\.a and credit_packs\.b"):
        _parse(CREDIT_BASE + two)


def test_thresholds_default_to_80_and_100_and_a_plan_may_set_its_own():
    plans = _parse('thresholds = [100, 50]\nfree_plan = "free"\n[plans.free]\n[plans.pro]\nthresholds = []')
    assert plans.plans["free"].thresholds == (50, 100)  # the file's, sorted
    assert plans.plans["pro"].thresholds == ()  # fires nothing
    assert _parse('free_plan = "free"\n[plans.free]').plans["free"].thresholds == (80, 100)
