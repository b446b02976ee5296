"""The relay against a real Postgres and a real local HTTP receiver: signed Standard Webhooks that the
`standardwebhooks` package verifies, retries with the same webhook-id, rotation, 410, at least once
and never twice by two relays."""

from __future__ import annotations

import dataclasses
import json
import threading
import time
from datetime import timedelta
from typing import Any

import pytest
from standardwebhooks import Webhook

from service.config import Settings
from service.events import endpoints, outbox
from service.events.relay import Relay, retry_wait
from tests.conftest import connect
from tests.events.helpers import ALL_TYPES, SAMPLES, Receiver, add_endpoint, delivery, emit


def relay(settings: Settings, **kwargs: Any) -> Relay:
    return Relay(settings, workers=kwargs.pop("workers", 2), poll=0.05, **kwargs)


def test_each_event_type_is_delivered_signed(conn, relay_settings, receiver):
    endpoint = add_endpoint(conn, receiver.url)
    ids = {t: emit(conn, t) for t in ALL_TYPES}
    stats = relay(relay_settings).once()
    assert stats.delivered == len(ALL_TYPES)
    assert sorted(receiver.ids()) == sorted(f"evt_{i}" for i in ids.values())
    for headers, body in receiver.requests:
        payload = Webhook(endpoint.secret).verify(body, headers)
        assert set(payload) == {"type", "timestamp", "data"}
        assert headers["webhook-id"] == f"evt_{ids[payload['type']]}"
        assert headers["content-type"] == "application/json"
        data = payload["data"]
        assert {**SAMPLES[payload["type"]], "occurred_at": data["occurred_at"]} == data
        assert payload["timestamp"].endswith("Z")
    for event_id in ids.values():
        d = delivery(conn, event_id, endpoint.id)
        assert (d["status"], d["attempts"], d["last_status"]) == ("delivered", 1, 200)
        assert d["finished_at"] is not None
    assert conn.execute("SELECT bool_and(fanned_out) FROM event_outbox").fetchone()[0]


def test_an_endpoint_gets_only_the_types_it_subscribed_to_and_ids_are_shared(conn, relay_settings, receiver):
    a = add_endpoint(conn, receiver.url, ["credits.granted"])
    b = add_endpoint(conn, receiver.url + "/b", ["credits.granted", "credits.voided"])
    granted, voided = emit(conn, "credits.granted"), emit(conn, "credits.voided")
    relay(relay_settings).once()
    assert sorted(receiver.ids()) == sorted([f"evt_{granted}", f"evt_{granted}", f"evt_{voided}"])
    for endpoint in (a, b):
        assert delivery(conn, granted, endpoint.id)["status"] == "delivered"
    assert (
        conn.execute("SELECT count(*) FROM webhook_deliveries WHERE event_id = %s", (voided,)).fetchone()[0]
        == 1
    )


def test_a_receiver_failing_twice_gets_the_same_id_on_the_third_attempt(conn, relay_settings, receiver):
    endpoint = add_endpoint(conn, receiver.url)
    event = emit(conn)
    receiver.answers = [500, 503]
    relay(relay_settings).once()
    assert receiver.ids() == [f"evt_{event}"] * 3
    bodies = {body for _, body in receiver.requests}
    assert len(bodies) == 1  # the same bytes every time
    for headers, body in receiver.requests:
        Webhook(endpoint.secret).verify(body, headers)
    d = delivery(conn, event, endpoint.id)
    assert (d["status"], d["attempts"], d["last_status"], d["last_error"]) == ("delivered", 3, 200, None)
    # a success ends the endpoint's run of failures
    assert conn.execute("SELECT failing_since FROM webhook_endpoints").fetchone()[0] is None


def test_a_delivery_fails_when_the_schedule_runs_out(conn, relay_settings, receiver):
    endpoint = add_endpoint(conn, receiver.url)
    event = emit(conn)
    receiver.answers = [500] * 10
    relay(relay_settings).once()
    assert len(receiver.requests) == 4  # the first attempt and the schedule's three retries
    d = delivery(conn, event, endpoint.id)
    assert (d["status"], d["attempts"], d["last_status"]) == ("failed", 4, 500)
    assert d["last_error"] == "answered 500" and d["finished_at"] is not None
    assert conn.execute("SELECT failing_since IS NOT NULL FROM webhook_endpoints").fetchone()[0]


def test_a_refused_connection_and_a_timeout_are_retried_on_the_schedule(conn, relay_settings, receiver):
    endpoint = add_endpoint(conn, "http://127.0.0.1:9/nothing-listens")
    event = emit(conn)
    schedule = dataclasses.replace(relay_settings, webhook_out_retry_schedule=(3600,))
    relay(schedule).once()
    d = delivery(conn, event, endpoint.id)
    assert (d["status"], d["attempts"], d["last_status"]) == ("pending", 1, None)
    assert "refused" in d["last_error"].lower() or "connect" in d["last_error"].lower()
    wait = conn.execute("SELECT next_attempt_at - now() FROM webhook_deliveries").fetchone()[0]
    assert timedelta(seconds=3600 * 0.75) < wait <= timedelta(seconds=3600 * 1.2)


def test_retry_waits_follow_the_schedule_with_jitter():
    import random

    rng = random.Random(1)
    schedule = (5.0, 300.0)
    assert 4 <= retry_wait(schedule, 1, rng) <= 6
    assert 240 <= retry_wait(schedule, 2, rng) <= 360
    assert retry_wait(schedule, 3, rng) is None


def test_a_rotation_sends_both_signatures_and_each_verifies(conn, relay_settings, receiver):
    endpoint = add_endpoint(conn, receiver.url)
    rotated = endpoints.rotate(conn, endpoint_id=endpoint.id, actor="test")
    assert rotated.secret != endpoint.secret and rotated.previous_secret_until is not None
    emit(conn)
    relay(relay_settings).once()
    [(headers, body)] = receiver.requests
    assert len(headers["webhook-signature"].split(" ")) == 2
    for secret in (endpoint.secret, rotated.secret):
        Webhook(secret).verify(body, headers)
    # after the grace, only the new secret signs
    conn.execute("UPDATE webhook_endpoints SET previous_until = now() - interval '1 s'")
    emit(conn)
    relay(relay_settings).once()
    headers, body = receiver.requests[1]
    assert " " not in headers["webhook-signature"]
    Webhook(rotated.secret).verify(body, headers)
    with pytest.raises(Exception, match="No matching signature"):
        Webhook(endpoint.secret).verify(body, headers)


def _audit(conn, action):
    return conn.execute(
        "SELECT actor, account_id, old, new FROM audit_log WHERE action = %s ORDER BY id", (action,)
    ).fetchall()


def test_410_gone_disables_the_endpoint_with_an_audit_row(conn, relay_settings, receiver):
    endpoint = add_endpoint(conn, receiver.url)
    receiver.answers = [410]
    first = emit(conn)
    relay(dataclasses.replace(relay_settings, webhook_out_retry_schedule=(3600,))).once()
    d = delivery(conn, first, endpoint.id)
    assert (d["status"], d["attempts"], d["last_status"]) == ("failed", 1, 410)
    row = conn.execute("SELECT enabled, disabled_reason FROM webhook_endpoints").fetchone()
    assert row == (False, "410 Gone")
    [(actor, account, _old, new)] = _audit(conn, "webhook_endpoint_disabled")
    assert (actor, account, new["reason"], new["id"]) == ("system:relay", "", "410 Gone", endpoint.id)
    # nothing more is fanned out to it or sent
    emit(conn)
    relay(relay_settings).once()
    assert len(receiver.requests) == 1
    assert conn.execute("SELECT count(*) FROM webhook_deliveries").fetchone()[0] == 1
    assert [e.enabled for e in endpoints.list_endpoints(conn)] == [False]


def test_an_endpoint_failing_for_five_days_is_disabled(conn, relay_settings, receiver):
    endpoint = add_endpoint(conn, receiver.url)
    waiting, now = emit(conn), emit(conn, "credits.granted")
    outbox.fan_out(conn)
    conn.execute(
        "UPDATE webhook_deliveries SET next_attempt_at = now() + interval '1 h' WHERE event_id = %s",
        (waiting,),
    )
    conn.execute("UPDATE webhook_endpoints SET failing_since = now() - interval '5 days 1 minute'")
    receiver.answers = [500]
    relay(relay_settings).once()
    assert len(receiver.requests) == 1
    row = conn.execute("SELECT enabled, disabled_reason FROM webhook_endpoints").fetchone()
    assert row[0] is False and row[1].startswith("failing since ")
    assert len(_audit(conn, "webhook_endpoint_disabled")) == 1
    # its waiting delivery is failed with it, so the backlog ends (and is purged)
    d = delivery(conn, waiting, endpoint.id)
    assert d["status"] == "failed" and d["last_error"].startswith("endpoint disabled: failing since")
    assert delivery(conn, now, endpoint.id)["status"] == "failed"


def test_events_committed_out_of_order_are_all_fanned_out(conn, db_url, relay_settings, receiver):
    add_endpoint(conn, receiver.url)
    with connect(db_url) as late:
        late.execute("BEGIN")
        low = emit(late)  # the lower id, committed last
        high = emit(conn)
        relay(relay_settings).once()
        assert receiver.ids() == [f"evt_{high}"]
        late.execute("COMMIT")
    relay(relay_settings).once()
    assert sorted(receiver.ids()) == sorted([f"evt_{high}", f"evt_{low}"])


def test_a_rolled_back_event_is_never_sent(conn, relay_settings, receiver):
    add_endpoint(conn, receiver.url)
    conn.execute("BEGIN")
    emit(conn)
    conn.execute("ROLLBACK")
    assert relay(relay_settings).once().delivered == 0
    assert receiver.requests == []


def test_a_redirect_is_not_followed(conn, relay_settings, receiver):
    endpoint = add_endpoint(conn, receiver.url)
    event = emit(conn)
    receiver.answers = [(302, {"Location": "http://10.0.0.1/internal"})]
    relay(dataclasses.replace(relay_settings, webhook_out_retry_schedule=(3600,))).once()
    assert len(receiver.requests) == 1
    d = delivery(conn, event, endpoint.id)
    assert (d["status"], d["last_status"]) == ("pending", 302)
    assert d["last_error"] == "redirect to http://10.0.0.1/internal not followed"


def test_a_slow_endpoint_does_not_starve_the_others(conn, relay_settings, receiver):
    slow = Receiver()
    try:
        add_endpoint(conn, slow.url, ["credits.granted"])
        add_endpoint(conn, receiver.url, ["credits.voided"])
        for _ in range(3):
            emit(conn, "credits.granted")
        fast = [emit(conn, "credits.voided") for _ in range(5)]
        slow.hold = True
        r = Relay(relay_settings, workers=2, per_endpoint=1, poll=0.05)
        t = threading.Thread(target=r.run)
        t.start()
        try:
            receiver.wait_for(len(fast))  # while one worker waits on the slow endpoint
            assert len(slow.requests) == 1
        finally:
            slow.release()
            r.stop.set()
            t.join(30)
        assert sorted(receiver.ids()) == sorted(f"evt_{i}" for i in fast)
    finally:
        slow.close()


def test_two_relays_at_once_send_each_event_once(conn, relay_settings, receiver):
    add_endpoint(conn, receiver.url)
    events = [emit(conn, ALL_TYPES[n % 4], account_id=f"acc-{n % 7}") for n in range(120)]
    relays = [relay(relay_settings, workers=3) for _ in range(2)]
    threads = [threading.Thread(target=r.run) for r in relays]
    for t in threads:
        t.start()
    try:
        receiver.wait_for(len(events))
        time.sleep(0.5)  # room for a duplicate to show up
    finally:
        for r in relays:
            r.stop.set()
        for t in threads:
            t.join(30)
    ids = receiver.ids()
    assert sorted(ids) == sorted(f"evt_{e}" for e in events) and len(set(ids)) == len(ids)
    assert sum(r.stats.delivered for r in relays) == len(events)
    assert all(r.stats.delivered for r in relays), "both relays took part"


def test_the_first_attempt_comes_within_two_seconds_of_the_commit(conn, relay_settings, receiver):
    from service.events.relay import POLL

    add_endpoint(conn, receiver.url)
    r = Relay(relay_settings, workers=1, poll=POLL)
    t = threading.Thread(target=r.run)
    t.start()
    try:
        time.sleep(0.3)
        started = time.monotonic()
        emit(conn)
        receiver.wait_for(1, timeout=5)
        assert time.monotonic() - started < 2.0
    finally:
        r.stop.set()
        t.join(30)


def test_the_purge_keeps_what_the_retention_keeps(conn, relay_settings, receiver):
    endpoint = add_endpoint(conn, receiver.url)
    old, recent = emit(conn), emit(conn)
    waiting = emit(conn)
    outbox.fan_out(conn)
    conn.execute(
        "UPDATE webhook_deliveries SET next_attempt_at = now() + interval '1 h' WHERE event_id = %s",
        (waiting,),
    )
    relay(relay_settings).once()
    conn.execute(
        "UPDATE webhook_deliveries SET finished_at = now() - interval '8 days' WHERE event_id = %s", (old,)
    )
    conn.execute(
        "UPDATE event_outbox SET occurred_at = now() - interval '8 days' WHERE id IN (%s, %s)", (old, waiting)
    )
    purged = outbox.purge(conn, keep=timedelta(days=relay_settings.webhook_out_retention_days))
    assert (purged.deliveries, purged.events) == (1, 2)
    left = conn.execute("SELECT event_id, status FROM webhook_deliveries ORDER BY event_id").fetchall()
    assert left == [(recent, "delivered"), (waiting, "pending")]  # a waiting one stays, whatever its age
    assert conn.execute("SELECT array_agg(id) FROM event_outbox").fetchone()[0] == [recent]
    assert endpoint.id


def test_the_body_is_the_stored_bytes(conn, relay_settings, receiver):
    endpoint = add_endpoint(conn, receiver.url)
    event = emit(conn)
    relay(relay_settings).once()
    stored = delivery(conn, event, endpoint.id)["body"]
    assert receiver.requests[0][1] == stored.encode()
    assert json.loads(stored)["type"] == "quota.threshold_crossed"


def test_deleting_an_endpoint_mid_send_waits_for_nothing(conn, relay_settings, receiver):
    endpoint = add_endpoint(conn, receiver.url)
    sent, waiting = emit(conn), emit(conn)
    outbox.fan_out(conn)
    conn.execute(
        "UPDATE webhook_deliveries SET next_attempt_at = now() + interval '1 h' WHERE event_id = %s",
        (waiting,),
    )
    receiver.hold = True
    r = relay(relay_settings, workers=1)
    t = threading.Thread(target=r.run)
    t.start()
    try:
        receiver.wait_for(1)  # the relay holds `sent`'s row while the receiver holds the request
        started = time.monotonic()
        endpoints.delete(conn, endpoint_id=endpoint.id, actor="test")
        assert time.monotonic() - started < 1.0
        assert delivery(conn, waiting, endpoint.id)["last_error"] == "endpoint deleted"
        receiver.release()
        deadline = time.monotonic() + 10
        while delivery(conn, sent, endpoint.id)["attempts"] == 0 and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        receiver.release()
        r.stop.set()
        t.join(30)
    assert delivery(conn, sent, endpoint.id)["status"] == "delivered"  # the attempt in flight is recorded


def test_the_purge_fails_what_waits_for_an_endpoint_that_is_gone(conn, relay_settings, receiver):
    endpoint = add_endpoint(conn, receiver.url)
    event = emit(conn)
    outbox.fan_out(conn)
    conn.execute("UPDATE webhook_endpoints SET enabled = false")  # as if disabled while it was sent
    purged = outbox.purge(conn, keep=timedelta(days=7))
    assert (purged.orphans, purged.deliveries, purged.events) == (1, 0, 0)
    d = delivery(conn, event, endpoint.id)
    assert (d["status"], d["last_error"]) == ("failed", "endpoint disabled or deleted")


def test_a_receiver_that_answers_too_late_is_a_failed_attempt(conn, relay_settings, receiver, monkeypatch):
    from service.events import transport

    monkeypatch.setattr(transport, "TIMEOUT", 0.5)  # 10 s in production
    endpoint = add_endpoint(conn, receiver.url)
    event = emit(conn)
    receiver.hold = True
    relay(dataclasses.replace(relay_settings, webhook_out_retry_schedule=(3600,))).once()
    receiver.release()
    d = delivery(conn, event, endpoint.id)
    assert (d["status"], d["attempts"], d["last_status"]) == ("pending", 1, None)
    assert d["last_error"] == "no answer within 0.5 s"


def test_an_unexpected_error_in_an_attempt_is_recorded_and_once_still_ends(
    conn, relay_settings, receiver, monkeypatch
):
    endpoint = add_endpoint(conn, receiver.url)
    event = emit(conn)

    def broken(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("a bug")

    monkeypatch.setattr("service.events.transport.post", broken)
    settings = dataclasses.replace(relay_settings, webhook_out_retry_schedule=(3600,))
    stats = relay(settings).once()  # returns: the delivery is not claimed again at once
    assert stats.failed_attempts == 1
    d = delivery(conn, event, endpoint.id)
    assert (d["status"], d["attempts"], d["last_error"]) == ("pending", 1, "relay error: RuntimeError: a bug")
