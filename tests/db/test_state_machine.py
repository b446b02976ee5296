"""Model-based test of one account's counters: take / release / rollover / override and plan changes
in any order, checked after every step against an in-memory model and against the ledger.

Every example gets a new account in one database (Hypothesis and function-scoped fixtures do not
mix, so the machine is built inside the test and shares its connection)."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from service.errors import IdempotencyKeyReused, QuotaExhausted
from service.plans import PlanConfig
from service.quota import overrides, periods, takes
from tests.db.helpers import counter, ledger_rows, ledger_used, new_account, set_plan

# Monthly metrics (the rollover moves them between months): free plan urls 50; pro urls 500, api_calls
# unlimited; an override of 1 on api_calls makes exhaustion as likely as seats' limit of 1 used to.
METRICS = ("api_calls", "urls")
KEYS = st.none() | st.sampled_from([f"key-{i}" for i in range(4)])
UNSET = object()
# The model's own copy of the lapse rule (DESIGN: these statuses keep a paid plan's limits), so that
# the machine checks the SQL rule (billing_is_lapsed) rather than restating it.
MODEL_ACCESS_STATUSES = frozenset({"active", "trialing", "past_due"})


@dataclass
class Counter:
    period: str
    used: int = 0
    override: Any = UNSET  # UNSET, None (unlimited) or an int


@dataclass
class ModelTake:
    take_id: int
    metric: str
    units: int
    period: str
    used_after: int
    released: bool = False


@dataclass
class Model:
    clock: str
    plan: str = "free"
    status: str = "none"
    counters: dict[str, Counter] = field(default_factory=dict)
    takes: dict[int, ModelTake] = field(default_factory=dict)
    keys: dict[str, int] = field(default_factory=dict)
    closed: dict[tuple[str, str], int] = field(default_factory=dict)  # final used per closed period
    resets: dict[tuple[str, str], int] = field(default_factory=dict)  # (metric, period opened) -> cleared

    def limit(self, plans: PlanConfig, metric: str) -> tuple[int | None, str]:
        c = self.counters[metric]
        if c.override is not UNSET:
            return c.override, "override"
        if self.plan != plans.free_plan and self.status not in MODEL_ACCESS_STATUSES:
            return plans.limit(plans.free_plan, metric), "free_fallback"
        return plans.limit(self.plan, metric), "plan"


def make_machine(conn: Any, plans: PlanConfig) -> type[RuleBasedStateMachine]:
    class Ledger(RuleBasedStateMachine):
        def __init__(self) -> None:
            super().__init__()
            self.account = new_account(conn, plans)
            start = periods.current_period()
            self.model = Model(clock=start, counters={m: Counter(period=start) for m in METRICS})

        # --- rules

        @rule(metric=st.sampled_from(METRICS), units=st.integers(1, 4), key=KEYS)
        def take(self, metric: str, units: int, key: str | None) -> None:
            m = self.model
            try:
                got = takes.take(
                    conn,
                    plans,
                    account_id=self.account,
                    metric=metric,
                    units=units,
                    idempotency_key=key,
                    actor="machine",
                    period=m.clock,
                )
            except IdempotencyKeyReused as e:
                assert key in m.keys
                original = m.takes[m.keys[key]]
                assert (original.metric, original.units) != (metric, units)
                assert e.details["take_id"] == original.take_id
                return
            except QuotaExhausted as e:
                self._roll_over(metric)
                c = m.counters[metric]
                limit, source = m.limit(plans, metric)
                assert key not in m.keys
                assert limit is not None and c.used + units > limit
                assert (e.details["used"], e.details["limit"], e.details["limit_source"]) == (
                    c.used,
                    limit,
                    source,
                )
                return
            if key in m.keys:
                original = m.takes[m.keys[key]]
                assert got.replayed
                assert (got.take_id, got.metric, got.units, got.used, got.period) == (
                    original.take_id,
                    original.metric,
                    original.units,
                    original.used_after,
                    original.period,
                )
                return
            assert not got.replayed
            self._roll_over(metric)
            c = m.counters[metric]
            limit, source = m.limit(plans, metric)
            assert limit is None or c.used + units <= limit, "granted over the limit"
            c.used += units
            assert (got.used, got.limit, got.limit_source, got.period) == (c.used, limit, source, m.clock)
            m.takes[got.take_id] = ModelTake(
                take_id=got.take_id, metric=metric, units=units, period=m.clock, used_after=c.used
            )
            if key is not None:
                m.keys[key] = got.take_id

        @precondition(lambda self: self.model.takes)
        @rule(data=st.data())
        def release(self, data: st.DataObject) -> None:
            m = self.model
            t = m.takes[data.draw(st.sampled_from(sorted(m.takes)), label="take_id")]
            got = takes.release(conn, take_id=t.take_id, actor="machine", period=m.clock)
            if t.released:
                assert (got.released, got.reason) == (False, "already_released")
                return
            c = m.counters[t.metric]
            if t.period != m.clock:
                assert (got.released, got.reason) == (False, "period_closed")
                return
            assert c.period == t.period
            back = min(t.units, c.used)
            c.used -= back
            t.released = True
            assert got.released and (got.units, got.used) == (back, c.used)

        @rule()
        def next_month(self) -> None:
            self.model.clock = periods.next_period(self.model.clock)

        @rule(metric=st.sampled_from(METRICS), limit=st.none() | st.integers(0, 8))
        def set_override(self, metric: str, limit: int | None) -> None:
            c = self.model.counters[metric]
            previous = overrides.set_override(
                conn, plans, account_id=self.account, metric=metric, limit=limit, actor="machine"
            )
            assert previous == (None if c.override is UNSET else {"limit": c.override})
            c.override = limit

        @rule(metric=st.sampled_from(METRICS))
        def clear_override(self, metric: str) -> None:
            c = self.model.counters[metric]
            previous = overrides.clear_override(
                conn, plans, account_id=self.account, metric=metric, actor="machine"
            )
            assert previous == (None if c.override is UNSET else {"limit": c.override})
            c.override = UNSET

        @rule(
            plan=st.sampled_from(["free", "pro"]), status=st.sampled_from(["active", "past_due", "canceled"])
        )
        def change_plan(self, plan: str, status: str) -> None:
            set_plan(conn, plans, account_id=self.account, plan=plan, status=status, actor="machine")
            self.model.plan, self.model.status = plan, status

        # --- the model's lazy rollover, mirroring the service's

        def _roll_over(self, metric: str) -> None:
            m = self.model
            c = m.counters[metric]
            if c.period < m.clock:
                m.closed[(metric, c.period)] = c.used
                if c.used:  # a counter that held nothing needs no reset row
                    m.resets[(metric, m.clock)] = c.used
                c.period, c.used = m.clock, 0

        # --- checked after every step

        @invariant()
        def counters_agree_with_model_and_ledger(self) -> None:
            m = self.model
            for metric, c in m.counters.items():
                row = counter(conn, self.account, metric)
                limit, source = m.limit(plans, metric)
                assert row["used"] >= 0
                assert (row["period"], row["used"]) == (c.period, c.used)
                assert (row["lim"], row["limit_source"]) == (limit, source)
                assert row["used"] == ledger_used(conn, self.account, metric, row["period"])

        @invariant()
        def ledger_is_consistent(self) -> None:
            rows = ledger_rows(conn, self.account)
            for r in rows:
                assert r["units"] >= 0 and r["used_after"] >= 0
                if r["kind"] == "take":
                    assert r["lim"] is None or r["used_after"] <= r["lim"], r
            assert {r["id"] for r in rows if r["kind"] == "take"} == set(self.model.takes)
            released = {r["take_id"] for r in rows if r["kind"] == "release"}
            assert released == {t for t, mt in self.model.takes.items() if mt.released}
            resets = [(r["metric"], r["period"], r["units"]) for r in rows if r["kind"] == "reset"]
            assert sorted(resets) == sorted((m, p, u) for (m, p), u in self.model.resets.items())
            for (metric, period), final in self.model.closed.items():
                assert ledger_used(conn, self.account, metric, period) == final

    return Ledger


def test_counters_stay_equal_to_the_ledger(conn, plans):
    machine = make_machine(conn, plans)
    run_state_machine_as_test(
        machine,
        settings=settings(
            max_examples=int(os.environ.get("QL_STATEFUL_EXAMPLES", "60")),
            stateful_step_count=40,
            deadline=None,
            suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
        ),
    )
