"""The suite on a Citus cluster.

`QUOTA_TEST_CITUS=1 pytest -m citus` (what .ci/run does after its plain run) starts a local cluster
(tests/citus/cluster.py) and runs the tests marked `citus` against it: every test database is a clone
of one migrated cluster database, so migration 0012 has distributed the tables. The marked subset is
the tests in CLUSTER_SUITE (the per-account operations, their races, the jobs, finance, webhook
deliveries and their races) plus
tests/citus itself, which checks what only a cluster shows (router plans, append-only on shards).
"""

from __future__ import annotations

import os

CITUS_ENV = "QUOTA_TEST_CITUS"
# Modules of the suite that also run on the cluster, marked `citus` at collection (tests/conftest.py).
CLUSTER_SUITE = (
    "tests/db/test_takes.py",
    "tests/db/test_race.py",
    "tests/db/test_idempotency.py",
    "tests/db/test_rollover.py",
    "tests/db/test_append_only.py",
    "tests/db/test_chain.py",
    "tests/db/test_checkpoint.py",
    "tests/db/test_ledger_writers.py",
    "tests/db/test_grants.py",
    "tests/db/test_events_produced.py",
    "tests/http/test_takes.py",
    "tests/http/test_release_route.py",
    "tests/http/test_admin.py",
    "tests/http/test_finance_api.py",
    "tests/http/test_usage.py",
    "tests/http/test_grants.py",
    "tests/http/test_accounts.py",
    "tests/workers/test_reset.py",
    "tests/workers/test_plan_sync.py",
    "tests/webhooks/test_ordering.py",
    "tests/webhooks/test_replay.py",
    "tests/webhooks/test_one_statement.py",
    "tests/webhooks/test_concurrency.py",
    "tests/webhooks/test_isolation.py",
    "tests/webhooks/test_retention.py",
    "tests/webhooks/test_plan_events.py",
    "tests/webhooks/test_credit_purchases.py",
    "tests/events/test_relay.py",
    "tests/events/test_endpoints_api.py",
    "tests/events/test_end_to_end.py",
    "tests/db/test_least_privilege.py",
)

# What of CLUSTER_SUITE does not hold on the cluster yet, and why (README "Scaling out", "Not yet on
# Citus"). A module is skipped there (its statements are refused outright; running them would only
# make the cluster run longer); a test is marked xfail(strict), so that one that starts passing
# fails the run until it leaves this list.
CLUSTER_GAPS: dict[str, str] = {}


def on_cluster() -> bool:
    """Whether this run's databases are on a Citus cluster."""
    return os.environ.get(CITUS_ENV, "") not in ("", "0")
