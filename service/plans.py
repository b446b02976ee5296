"""The plan config (plans.toml): plan names, per-metric limits, each metric's kind, the boolean
features of each plan, and provider mappings.

Nothing about plans is hard-coded; a deployment with other plans edits the file. A metric that a plan
does not list has limit 0 on that plan; "unlimited" is stored as None. A metric is a consumable reset
every calendar month (UTC) unless `[metrics]` says otherwise: a consumable reset every UTC day, or an
allocation (seats), held until released and never reset. A feature a plan does not list is off on it.
Plans are listed from the lowest to the highest: when one subscription maps to several plans (a
Stripe subscription with items of two plans, RevenueCat entitlements of two plans), the highest, the
one listed last, is its tier.

Who keeps access under which status (the lapse rule) is not here: it is a SQL function
(billing_is_lapsed, migrations/repeatable/billing_rules.sql), which every statement that needs it
calls.
"""

from __future__ import annotations

import tomllib
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime
from functools import cached_property
from pathlib import Path
from typing import Any

from service.errors import PlanConfigError
from service.quota import periods
from service.vocabulary import MetricKind, ResetInterval

Limit = int | None  # None = unlimited

# Percent of the effective limit at which a take fires quota.threshold_crossed (docs/events.md),
# unless the file says otherwise (`thresholds = [...]` at the top level, or in a plan).
DEFAULT_THRESHOLDS = (80, 100)

KINDS = tuple(MetricKind)
RESETS = tuple(ResetInterval)


@dataclass(frozen=True, kw_only=True)
class Metric:
    """How a metric's counter moves: `reset` is 'month' or 'day' for a consumable, None for an
    allocation (held until released)."""

    name: str
    kind: str = MetricKind.CONSUMABLE
    reset: str | None = ResetInterval.MONTH

    def period_at(self, at: datetime) -> str:
        """The period a take at `at` counts in (periods.py: month, day, or HELD)."""
        if self.reset is None:
            return periods.HELD
        return periods.day_of(at) if self.reset == ResetInterval.DAY else periods.period_of(at)


@dataclass(frozen=True, kw_only=True)
class Plan:
    name: str
    limits: dict[str, Limit]
    stripe_prices: tuple[str, ...] = ()
    revenuecat_entitlements: tuple[str, ...] = ()
    revenuecat_products: tuple[str, ...] = ()
    features: tuple[str, ...] = ()
    thresholds: tuple[int, ...] = DEFAULT_THRESHOLDS


@dataclass(frozen=True, kw_only=True)
class CreditPack:
    """A pack of credits an end customer buys (`[credit_packs.<name>]`): `units` of a consumable
    `metric`, granted once per purchase, expiring `expires_after_days` after it (None: never)."""

    name: str
    metric: str
    units: int
    expires_after_days: int | None = None
    stripe_prices: tuple[str, ...] = ()
    revenuecat_products: tuple[str, ...] = ()


@dataclass(frozen=True, kw_only=True)
class PlanConfig:
    free_plan: str
    plans: dict[str, Plan]
    metrics: tuple[str, ...] = field(default=())
    kinds: dict[str, Metric] = field(default_factory=dict)  # a metric not here: consumable, monthly
    features: tuple[str, ...] = field(default=())  # every feature any plan names, sorted
    packs: dict[str, CreditPack] = field(default_factory=dict)  # [credit_packs.<name>]

    def pack_for_revenuecat_product(self, product: str | None) -> CreditPack | None:
        """The credit pack that lists this RevenueCat product id, if any."""
        return next((p for p in self.packs.values() if product and product in p.revenuecat_products), None)

    def metric(self, name: str) -> Metric:
        return self.kinds.get(name) or Metric(name=name)

    def period(self, metric: str, at: datetime | None = None) -> str:
        """The period a take of `metric` counts in now (or at `at`)."""
        return self.metric(metric).period_at(at or periods.now())

    def has_feature(self, plan: str, feature: str) -> bool:
        """Whether `plan` lists `feature`; an unknown plan gets the free plan's features."""
        p = self.plans.get(plan) or self.plans[self.free_plan]
        return feature in p.features

    def limit(self, plan: str, metric: str) -> Limit:
        """The plan's monthly limit for `metric`; an unknown plan gets the free plan's limits."""
        p = self.plans.get(plan) or self.plans[self.free_plan]
        return p.limits.get(metric, 0)

    def limits(self, plan: str) -> dict[str, Limit]:
        return {m: self.limit(plan, m) for m in self.metrics}

    def is_paid(self, plan: str) -> bool:
        return plan != self.free_plan

    @cached_property
    def limit_table(self) -> dict[str, str]:
        """Every plan's limits, as query parameters, for statements that pick the plan's limits in
        the database (quota_set_limits_for_plan, from billing_set_tier and billing_deliver): the same
        answers as `limit`. Made once, as array literals: psycopg adapts a list element by element
        on every execute, and Postgres parses an array literal faster than a JSON document."""
        rows = [(p, m, self.limit(p, m)) for p in self.plans for m in self.metrics]
        return {
            "plan_names": array_literal(r[0] for r in rows),
            "plan_metrics": array_literal(r[1] for r in rows),
            "plan_limits": array_literal(r[2] for r in rows),
            "free_plan": self.free_plan,
        }

    @cached_property
    def feature_table(self) -> dict[str, str]:
        """Every plan's features, as query parameters for the statement that decides an account's
        (features.sql `account_features`), made once as limit_table is: the plan names, and one
        (plan, feature) pair per feature a plan lists."""
        pairs = [(p.name, f) for p in self.plans.values() for f in p.features]
        return {
            "plans": array_literal(self.plans),
            "plan_names": array_literal(p for p, _ in pairs),
            "plan_features": array_literal(f for _, f in pairs),
            "free_plan": self.free_plan,
        }

    def plan_for_stripe_price(self, *keys: str | None) -> str | None:
        """The highest plan (listed last) that lists any of these price lookup keys or price ids."""
        for p in reversed(self.plans.values()):
            if any(k and k in p.stripe_prices for k in keys):
                return p.name
        return None

    def plan_for_revenuecat(self, entitlements: list[str], product: str | None) -> str | None:
        """The highest plan (listed last) that lists one of these entitlement ids, else the one that
        lists the product id."""
        for p in reversed(self.plans.values()):
            if any(e in p.revenuecat_entitlements for e in entitlements):
                return p.name
        for p in reversed(self.plans.values()):
            if product and product in p.revenuecat_products:
                return p.name
        return None


def array_literal(values: Iterable[object]) -> str:
    """A Postgres array literal: each element double-quoted, with a backslash before `"` and `\\`;
    None is NULL."""
    quoted = (
        "NULL" if v is None else '"' + str(v).replace("\\", "\\\\").replace('"', '\\"') + '"' for v in values
    )
    return "{" + ",".join(quoted) + "}"


def _limit(plan: str, metric: str, value: Any) -> Limit:
    if value == "unlimited":
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise PlanConfigError(f'plans.{plan}.limits.{metric}: expected an integer >= 0 or "unlimited"')
    return value


def _strings(plan: str, key: str, value: Any) -> tuple[str, ...]:
    if value is None:
        return ()
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        where = plan if plan.startswith("credit_packs.") else f"plans.{plan}"
        raise PlanConfigError(f"{where}.{key}: expected a list of non-empty strings")
    return tuple(value)


def _thresholds(key: str, value: Any, default: tuple[int, ...]) -> tuple[int, ...]:
    """A `thresholds` list: distinct whole percents from 1 to 100, kept sorted; [] fires nothing."""
    if value is None:
        return default
    if not isinstance(value, list) or not all(
        isinstance(v, int) and not isinstance(v, bool) and 1 <= v <= 100 for v in value
    ):
        raise PlanConfigError(f"{key}: expected a list of whole percents from 1 to 100, such as [80, 100]")
    if len(set(value)) != len(value):
        raise PlanConfigError(f"{key}: a percent is listed twice")
    return tuple(sorted(value))


_PLAN_KEYS = frozenset(
    {"limits", "features", "stripe_prices", "revenuecat_entitlements", "revenuecat_products", "thresholds"}
)
_PACK_KEYS = frozenset({"metric", "units", "expires_after_days", "stripe_prices", "revenuecat_products"})
_METRIC_KEYS = frozenset({"kind", "reset"})


def _table(key: str, body: Any, keys: frozenset[str], *, expected: str = "a table") -> dict[str, Any]:
    """`body` as the table `key` names, or PlanConfigError if it is not a table or has other keys."""
    if not isinstance(body, dict):
        raise PlanConfigError(f"{key}: expected {expected}")
    unknown = set(body) - keys
    if unknown:
        raise PlanConfigError(f"{key}: unknown keys {sorted(unknown)}")
    return body


def parse_plans(data: dict[str, Any]) -> PlanConfig:
    """Validate a parsed plans.toml; raises PlanConfigError naming the first bad entry."""
    free = data.get("free_plan")
    raw = data.get("plans")
    thresholds = _thresholds("thresholds", data.get("thresholds"), DEFAULT_THRESHOLDS)
    if not isinstance(raw, dict) or not raw:
        raise PlanConfigError("plans: at least one [plans.<name>] table is required")
    if not isinstance(free, str) or free not in raw:
        raise PlanConfigError("free_plan: must name one of the [plans.<name>] tables")
    plans: dict[str, Plan] = {}
    seen: dict[tuple[str, str], str] = {}
    for name, body in raw.items():
        body = _table(f"plans.{name}", body, _PLAN_KEYS)
        limits = body.get("limits", {})
        if not isinstance(limits, dict):
            raise PlanConfigError(f"plans.{name}.limits: expected a table")
        plan = Plan(
            name=name,
            limits={m: _limit(name, m, v) for m, v in limits.items()},
            stripe_prices=_strings(name, "stripe_prices", body.get("stripe_prices")),
            revenuecat_entitlements=_strings(
                name, "revenuecat_entitlements", body.get("revenuecat_entitlements")
            ),
            revenuecat_products=_strings(name, "revenuecat_products", body.get("revenuecat_products")),
            features=_strings(name, "features", body.get("features")),
            thresholds=_thresholds(f"plans.{name}.thresholds", body.get("thresholds"), thresholds),
        )
        for key in ("stripe_prices", "revenuecat_entitlements", "revenuecat_products"):
            for v in getattr(plan, key):
                other = seen.setdefault((key, v), name)
                if other != name:
                    raise PlanConfigError(f"{key} {v!r} maps to both {other!r} and {name!r}")
        plans[name] = plan
    metrics = tuple(sorted({m for p in plans.values() for m in p.limits}))
    features = tuple(sorted({f for p in plans.values() for f in p.features}))
    for f in features:
        if f in metrics:
            raise PlanConfigError(f"features: {f!r} is also a metric; a name is one or the other")
    kinds = _kinds(data.get("metrics", {}), metrics)
    packs = _packs(data.get("credit_packs", {}), metrics, kinds, seen)
    return PlanConfig(
        free_plan=free, plans=plans, metrics=metrics, kinds=kinds, features=features, packs=packs
    )


def _packs(
    raw: Any, metrics: tuple[str, ...], kinds: dict[str, Metric], seen: dict[tuple[str, str], str]
) -> dict[str, CreditPack]:
    """The [credit_packs] table (README "Credits"). A Stripe price or RevenueCat product belongs to
    one plan or one pack, never both: a purchase must mean one thing."""
    if not isinstance(raw, dict):
        raise PlanConfigError("credit_packs: expected a table of [credit_packs.<name>] tables")
    packs: dict[str, CreditPack] = {}
    for name, body in raw.items():
        key = f"credit_packs.{name}"
        body = _table(key, body, _PACK_KEYS)
        metric, units, days = body.get("metric"), body.get("units"), body.get("expires_after_days")
        if metric not in metrics:
            raise PlanConfigError(f"{key}.metric: expected a metric some plan lists in its limits")
        if kinds.get(metric, Metric(name=metric)).kind != MetricKind.CONSUMABLE:
            raise PlanConfigError(f"{key}.metric: {metric!r} is an allocation; credits are for consumables")
        # units fit a grant (bigint, and a quantity of up to 1000 packs); days at most a century
        for field_name, value, most in (("units", units, 2**31 - 1), ("expires_after_days", days, 36_500)):
            if (field_name == "units" or value is not None) and (
                isinstance(value, bool) or not isinstance(value, int) or not 0 < value <= most
            ):
                raise PlanConfigError(f"{key}.{field_name}: expected a whole number from 1 to {most}")
        assert isinstance(units, int)  # checked above
        pack = CreditPack(
            name=name,
            metric=metric,
            units=units,
            expires_after_days=days,
            stripe_prices=_strings(f"credit_packs.{name}", "stripe_prices", body.get("stripe_prices")),
            revenuecat_products=_strings(
                f"credit_packs.{name}", "revenuecat_products", body.get("revenuecat_products")
            ),
        )
        for list_key in ("stripe_prices", "revenuecat_products"):
            for v in getattr(pack, list_key):
                other = seen.setdefault((list_key, v), key)
                if other != key:
                    owner = other if other.startswith("credit_packs.") else f"plans.{other}"
                    raise PlanConfigError(
                        f"{list_key} {v!r} is listed by both {owner} and {key}: a price or product "
                        "belongs to one plan or one credit pack"
                    )
        packs[name] = pack
    return packs


def _kinds(raw: Any, metrics: tuple[str, ...]) -> dict[str, Metric]:
    """The [metrics] table: each entry `{ kind = "consumable" | "allocation", reset = "month" | "day" }`."""
    if not isinstance(raw, dict):
        raise PlanConfigError("metrics: expected a table of metric = { kind, reset }")
    kinds: dict[str, Metric] = {}
    for name, body in raw.items():
        key = f"metrics.{name}"
        if name not in metrics:
            raise PlanConfigError(f"{key}: no plan lists this metric in its limits")
        body = _table(key, body, _METRIC_KEYS, expected='a table such as { kind = "allocation" }')
        kind = body.get("kind", MetricKind.CONSUMABLE)
        if kind not in KINDS:
            raise PlanConfigError(f"{key}.kind: expected one of {', '.join(KINDS)}")
        if kind == MetricKind.ALLOCATION:
            if "reset" in body:
                raise PlanConfigError(f"{key}.reset: an allocation is never reset; remove the key")
            kinds[name] = Metric(name=name, kind=MetricKind.ALLOCATION, reset=None)
            continue
        reset = body.get("reset", ResetInterval.MONTH)
        if reset not in RESETS:
            raise PlanConfigError(f"{key}.reset: expected one of {', '.join(RESETS)}")
        kinds[name] = Metric(name=name, kind=MetricKind.CONSUMABLE, reset=ResetInterval(reset))
    return kinds


def load_plans(path: Path) -> PlanConfig:
    """Read and validate the plan config file."""
    try:
        data = tomllib.loads(Path(path).read_text())
    except FileNotFoundError:
        raise PlanConfigError(f"plan config {path} not found") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
        raise PlanConfigError(f"plan config {path}: {e}") from None
    return parse_plans(data)
