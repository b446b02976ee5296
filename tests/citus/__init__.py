"""The suite on a Citus cluster.

`QUOTA_TEST_CITUS=1 pytest -m citus` (what .ci/run does after its plain run) starts a local cluster
(tests/citus/cluster.py) and runs the tests marked `citus` against it: every test database is a clone
of one migrated cluster database, so migration 0012 has distributed the tables. The marked subset is
the tests in CLUSTER_SUITE (the per-account operations, their races, the jobs, finance) plus
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
    "tests/http/test_takes.py",
    "tests/http/test_release_route.py",
    "tests/http/test_admin.py",
    "tests/http/test_finance_api.py",
    "tests/http/test_usage.py",
    "tests/http/test_accounts.py",
    "tests/workers/test_reset.py",
    "tests/workers/test_plan_sync.py",
    "tests/webhooks/test_ordering.py",
    "tests/webhooks/test_replay.py",
)

# What of CLUSTER_SUITE does not hold on the cluster yet, and why (README "Scaling out", "Not yet on
# Citus"). A module is skipped there (its statements are refused outright; running them would only
# make the cluster run longer); a test is marked xfail(strict), so that one that starts passing
# fails the run until it leaves this list.
_SET_ROLE = (
    "SET ROLE to the NOLOGIN group quota_app: Citus opens the shards' connections as the current role, "
    "which may not log in (the service's login role works: tests/citus)"
)
_PLAN_LIMITS = (
    "a plan change brings the counters' limits in line through quotas_follow_targets "
    "(migrations/repeatable/billing_rules.sql), which locks counters by a join with its targets, "
    "not by one account: Citus refuses FOR UPDATE across shards"
)
CLUSTER_GAPS: dict[str, str] = {
    "tests/webhooks/test_ordering.py": (
        "a delivery resolves its account by provider ids (subscriptions, customer links, "
        "accounts.stripe_customer_id) in the statement that changes the account, and then " + _PLAN_LIMITS
    ),
    "tests/webhooks/test_replay.py": "as tests/webhooks/test_ordering.py",
    "tests/workers/test_plan_sync.py": (
        "the sync's batches lock one shard each, but its apply step and apply_plan (the tests' set-up) "
        "reach quotas_follow_targets, which locks counters by a join with its targets, not by their "
        "accounts: Citus refuses FOR UPDATE across shards"
    ),
    "tests/citus/test_jobs.py::test_plan_sync_applies_by_shard": (
        "plan sync's apply step reaches quotas_follow_targets: see tests/workers/test_plan_sync.py"
    ),
    "tests/workers/test_reset.py::test_reset_task_through_redis_worker": (
        "the worker also runs the plan sync, whose apply step reaches quotas_follow_targets: "
        "see tests/workers/test_plan_sync.py"
    ),
    "tests/db/test_append_only.py::test_application_role_lacks_the_privilege": _SET_ROLE,
    "tests/db/test_append_only.py::test_application_role_can_read_and_append": _SET_ROLE,
    "tests/db/test_chain.py::test_every_writer_chains_as_the_application_role": _SET_ROLE,
    "tests/http/test_accounts.py::test_customer_linked_to_another_account_is_409": (
        "UNIQUE (stripe_customer_id) cannot stay on a table distributed by account (0012): the product "
        "link is not checked across accounts on the cluster"
    ),
    "tests/http/test_admin.py::test_lapsed_paid_plan_falls_back_to_free": _PLAN_LIMITS,
    "tests/http/test_admin.py::test_override_beats_a_lapsed_plan_and_survives_plan_changes": _PLAN_LIMITS,
    "tests/http/test_admin.py::test_free_plan_is_never_lapsed": _PLAN_LIMITS,
    "tests/http/test_admin.py::test_apply_plan_counts_and_audits_each_limit_it_changes": _PLAN_LIMITS,
}


def on_cluster() -> bool:
    """Whether this run's databases are on a Citus cluster."""
    return os.environ.get(CITUS_ENV, "") not in ("", "0")
