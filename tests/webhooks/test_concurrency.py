"""Concurrent deliveries, each a real request through the app on its own thread and connection."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from tests.webhooks.helpers import (
    body_of,
    create_account,
    fixture,
    inbox,
    now,
    post_stripe,
    sign,
    state,
    stripe_subscription_event,
)


def run_together(n: int, request: Callable[[Any, int], Any], app: Any) -> list[Any]:
    """Run `request(client, i)` on n threads released together by a barrier; their responses."""
    barrier = threading.Barrier(n)
    results: list[Any] = [None] * n

    def worker(i: int) -> None:
        client = app.test_client()
        barrier.wait()
        try:
            results[i] = request(client, i)
        except Exception as e:  # surfaced by the assertion below
            results[i] = e

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    return results


def test_ten_copies_of_one_delivery(app: Any, client: Any, keys: Any, conn: Any, acc: str) -> None:
    body = body_of(fixture("stripe", "customer.subscription.updated"))
    header = sign(body)  # the very same delivery, ten times

    responses = run_together(10, lambda c, i: post_stripe(c, body, header=header), app)

    assert [r.status_code for r in responses] == [200] * 10
    assert sorted(r.json["duplicate"] for r in responses) == [False] + [True] * 9
    assert {r.json["id"] for r in responses} == {inbox(conn)[0]["id"]}
    [row] = inbox(conn)
    assert row["status"] == "applied"
    # one state change: one subscription row, one set of limit changes (urls, api_calls, seats)
    assert conn.execute("SELECT count(*) FROM subscriptions").fetchone() == (1,)
    audit = conn.execute("SELECT count(*), count(DISTINCT actor) FROM audit_log WHERE actor LIKE 'webhook:%'")
    assert audit.fetchone() == (4, 1)
    assert state(client, keys, acc) == ("pro", "active", 500, "plan")


def test_concurrent_events_of_one_subscription_end_in_the_newest(
    app: Any, client: Any, keys: Any, acc: str
) -> None:
    t = now() - 100
    events = [
        stripe_subscription_event(
            event_id=f"evt_{i}",
            created=t + i,
            price="basic_monthly" if i % 2 else "pro_monthly",
            status="past_due" if i % 3 else "active",
        )
        for i in range(10)
    ]
    responses = run_together(10, lambda c, i: post_stripe(c, events[i]), app)
    assert [r.status_code for r in responses] == [200] * 10
    assert state(client, keys, acc)[:2] == ("basic", "active")  # event 9: basic, active


def test_concurrent_events_of_many_subscriptions_of_one_account(app: Any, client: Any, keys: Any) -> None:
    """One active and nine ended subscriptions of one account, delivered at once: each transaction
    recomputes the account under its lock after its own writes, so no interleaving leaves the
    account on an ended subscription while the active one exists."""
    t = now() - 100
    for round_ in range(8):
        account_id = f"acc_round_{round_}"
        create_account(client, keys, account_id)
        events = [
            stripe_subscription_event(
                event_id=f"evt_{round_}_{i}",
                created=t + i,
                sub_id=f"sub_{round_}_{i}",
                account_id=account_id,
                status="active" if i == 0 else "canceled",
                price="pro_monthly" if i == 0 else "basic_monthly",
            )
            for i in range(10)
        ]
        responses = run_together(10, lambda c, i, ev=events: post_stripe(c, ev[i]), app)
        assert [r.status_code for r in responses] == [200] * 10
        assert state(client, keys, account_id) == ("pro", "active", 500, "plan"), round_
