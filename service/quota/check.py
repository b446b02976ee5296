"""The check: whether a take would be granted now, written nowhere. It reads the counter the take
would move with the take's own diagnosis query (takes.read_counter: `take_refusal`, one read by the
counter's key) and answers as the take would: a counter still in an earlier period holds nothing of the new
one. Only a take enforces a limit: a check is outdated as soon as another take or a release moves
the counter, so a caller that acts on it still takes and handles a refusal."""

from __future__ import annotations

from dataclasses import dataclass

from service.db import Connection
from service.errors import AccountDeleted, UnknownAccount
from service.plans import PlanConfig
from service.quota import grants, periods
from service.quota.accounts import ensure_quotas, require_metric
from service.quota.takes import read_counter, refuse_kind_change


@dataclass(frozen=True, kw_only=True)
class MetricCheck:
    """Whether a take of `units` would be granted now, and the counter it would move. `period` is
    None for an allocation, which has none."""

    allowed: bool
    metric: str
    units: int
    limit: int | None
    used: int
    limit_source: str
    period: str | None

    @property
    def remaining(self) -> int | None:
        return None if self.limit is None else max(self.limit - self.used, 0)

    @property
    def resets_at(self) -> str | None:
        return None if self.period is None else periods.resets_at(self.period)


def check_metric(
    conn: Connection, plans: PlanConfig, *, account_id: str, metric: str, units: int = 1
) -> MetricCheck:
    """Would a take of `units` of `metric` be granted now? Raises UnknownMetric, UnknownAccount,
    AccountDeleted. Writes nothing, except an account's missing counter (created as a take would)."""
    require_metric(plans, metric)
    period = plans.period(metric)
    counter = read_counter(conn, account_id=account_id, metric=metric)
    if counter is not None and counter.period is None and not counter.deleted:  # rare: created first
        ensure_quotas(conn, plans, account_id=account_id)
        counter = read_counter(conn, account_id=account_id, metric=metric)
    if counter is None:
        raise UnknownAccount(f"unknown account {account_id!r}")
    if counter.deleted:
        raise AccountDeleted(f"account {account_id!r} was deleted")
    assert counter.period is not None and counter.used is not None  # ensure_quotas made every counter
    refuse_kind_change(metric, counter, period)  # as the take
    # As the take: an earlier period, or an empty one of another kind, is over (its rollover empties
    # the counter); a later one (another server's clock opened it) is the one the take counts in.
    if periods.same_kind(counter.period, period) and counter.period >= period:
        used, period = counter.used, counter.period
    else:
        used = 0
    allowed = counter.limit is None or used + units <= counter.limit
    if not allowed:  # as the take: the account's live grants after the allowance (README "Credits")
        room = max(counter.limit - used, 0) if counter.limit is not None else 0
        allowed = room + grants.credits(conn, account_id=account_id).get(metric, 0) >= units
    return MetricCheck(
        allowed=allowed,
        metric=metric,
        units=units,
        limit=counter.limit,
        used=used,
        limit_source=str(counter.limit_source),
        period=periods.shown(period),
    )
