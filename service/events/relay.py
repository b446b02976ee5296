"""The relay (`quota-ledger relay`): fans the outbox out into deliveries and sends each due delivery,
at least once, with the Standard Webhooks signature (docs/events.md).

A delivery is claimed with FOR UPDATE SKIP LOCKED and stays locked while it is sent; its outcome is
recorded and committed with the lock's release. So several relays never send one delivery at once,
and a relay killed mid-send leaves it pending and unlocked: another relay, or its own restart,
sends it again (the receiver dedupes on webhook-id). Each worker thread has its own connection; a
relay sends at most `per_endpoint` deliveries to one endpoint at once, so that a slow endpoint holds
that many workers, not all of them. Idle, the relay looks for new events and due deliveries every
POLL seconds: a committed event's first attempt starts within about twice that."""

from __future__ import annotations

import logging
import random
import threading
import time
from collections import Counter
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import psycopg
from psycopg.rows import class_row

from service.config import Settings
from service.db import Connection, Q, connect
from service.events import outbox, signing, transport

log = logging.getLogger(__name__)

ACTOR = "system:relay"  # the audit log's actor for an endpoint the relay disables
POLL = 0.5  # seconds between looks for new events and due deliveries while idle
PURGE_EVERY = 3600.0  # seconds between purges of what the retention no longer keeps
REPORT_EVERY = 60.0  # seconds between progress lines in the log
FAILING_FOR = timedelta(days=5)  # an endpoint failing this long is disabled
JITTER = 0.2  # each retry's wait is the schedule's, times a random factor within 1 +- JITTER
RECONNECT_PAUSE = 1.0


@dataclass(frozen=True)
class Claimed:
    """A due delivery, locked for its attempt, with what sending it needs."""

    id: int
    event_id: int
    endpoint_id: str
    body: str
    attempts: int
    url: str
    secret: str
    previous_secret: str | None
    failing: bool  # the endpoint is in a run of failures


def retry_wait(schedule: tuple[float, ...], attempts: int, rng: random.Random) -> float | None:
    """Seconds to wait after the attempt that makes `attempts` failed attempts, or None when the
    schedule has run out (the delivery is failed)."""
    if attempts > len(schedule):
        return None
    return schedule[attempts - 1] * rng.uniform(1 - JITTER, 1 + JITTER)


@dataclass
class Stats:
    delivered: int = 0
    failed_attempts: int = 0
    failed: int = 0
    disabled: int = 0

    def add(self, other: Stats) -> None:
        for name in ("delivered", "failed_attempts", "failed", "disabled"):
            setattr(self, name, getattr(self, name) + getattr(other, name))


def attempt(conn: Connection, settings: Settings, row: Claimed, rng: random.Random) -> Stats:
    """Send one claimed delivery and record its outcome, in the claim's transaction (not committed
    here). Returns what it came to."""
    msg_id = signing.webhook_id(row.event_id)
    keys = [row.secret] + ([row.previous_secret] if row.previous_secret else [])
    at = datetime.now(UTC).replace(microsecond=0)
    headers = signing.headers(keys, msg_id=msg_id, at=at, body=row.body)
    outcome = transport.post(
        row.url, row.body.encode(), headers, allow_private=settings.webhook_out_allow_private
    )
    stats = record(conn, row, outcome, schedule=settings.webhook_out_retry_schedule, rng=rng)
    if not outcome.ok or row.failing:  # else nothing to tell the endpoint's row: a round trip saved
        stats.disabled = int(tell_endpoint(conn, row, outcome))
    return stats


def record(
    conn: Connection,
    row: Claimed,
    outcome: transport.Outcome,
    *,
    schedule: tuple[float, ...],
    rng: random.Random,
) -> Stats:
    """The delivery's row after an attempt: delivered, due again after the schedule's next wait, or
    failed (the schedule ran out, or 410 Gone)."""
    msg_id = signing.webhook_id(row.event_id)
    if outcome.ok:
        conn.execute(Q.relay_delivered, {"id": row.id, "status": outcome.status})
        log.debug("delivered %s to %s (%s)", msg_id, row.endpoint_id, outcome.status)
        return Stats(delivered=1)
    wait = None if outcome.gone else retry_wait(schedule, row.attempts + 1, rng)
    conn.execute(
        Q.relay_failed_attempt,
        {
            "id": row.id,
            "status": outcome.status,
            "error": outcome.error,
            "final": wait is None,
            "wait": timedelta(seconds=wait or 0),
        },
    )
    log.info(
        "attempt %d of %s to %s failed: %s; %s",
        row.attempts + 1,
        msg_id,
        row.endpoint_id,
        outcome.error,
        "failed for good" if wait is None else f"next in {wait:.0f} s",
    )
    return Stats(failed_attempts=1, failed=int(wait is None))


def tell_endpoint(conn: Connection, row: Claimed, outcome: transport.Outcome) -> bool:
    """What the attempt says about its endpoint (webhook_endpoint_attempted): a success ends its run
    of failures; a 410, or failures for FAILING_FOR, disable it. True when it was disabled now."""
    disabled = conn.execute(
        Q.relay_endpoint_attempted,
        {
            "endpoint_id": row.endpoint_id,
            "ok": outcome.ok,
            "gone": outcome.gone,
            "failing_for": FAILING_FOR,
            "actor": ACTOR,
        },
    ).fetchone()
    if disabled and disabled[0]:
        log.warning("endpoint %s disabled: %s", row.endpoint_id, disabled[0])
        return True
    return False


class CannotSign(RuntimeError):
    """The relay's database role may not read the endpoints' signing secrets."""


def check_can_sign(conn: Connection) -> None:
    """Raise CannotSign, saying what to do, unless this connection's role may read the secrets
    (only quota_relay's members may: migrations/0028, docs/events.md "Who can do what")."""
    row = conn.execute(Q.relay_can_sign).fetchone()
    if not (row and row[0]):
        user = conn.info.user
        raise CannotSign(
            f"the database role {user!r} may not read the webhook endpoints' signing secrets: run the "
            "relay as a member of quota_relay (`quota-ledger migrate --relay-role NAME` creates one; "
            "then give the relay a DATABASE_URL with that role)"
        )


class Relay:
    """Fan-out and delivery workers over one database. `run` until `stop` is set; `once` delivers
    what is due and returns."""

    def __init__(
        self,
        settings: Settings,
        *,
        workers: int = 4,
        per_endpoint: int = 2,
        poll: float = POLL,
        heartbeat: Path | None = None,
        stop: threading.Event | None = None,
    ) -> None:
        if workers < 1 or per_endpoint < 1:
            raise ValueError("a relay needs at least one worker and one send per endpoint")
        self.settings, self.workers, self.per_endpoint, self.poll = settings, workers, per_endpoint, poll
        self.heartbeat = heartbeat
        self.stop = stop or threading.Event()
        self.stats = Stats()
        self._lock = threading.Lock()
        self._sending: Counter[str] = Counter()
        self._rng = random.Random()
        self.cannot_sign = False  # a worker's claim was refused for the role's privileges

    def _connect(self) -> Connection:
        return connect(self.settings, application_name="quota-ledger-relay")

    def deliver_one(self, conn: Connection) -> bool:
        """Claim, send and record one due delivery; False when none is due (or every due one is for
        an endpoint at its cap in this relay)."""
        with conn.transaction():
            # The outcome's commit need not wait for the disk: a record lost with a database crash
            # means only that the delivery is sent again, which at least once allows (receivers
            # dedupe on webhook-id); waiting for the flush cost about a fifth of the relay's
            # throughput (bench/README.md, "Events out").
            conn.execute("SET LOCAL synchronous_commit = off")
            with self._lock:
                busy = [e for e, n in self._sending.items() if n >= self.per_endpoint]
                with conn.cursor(row_factory=class_row(Claimed)) as cur:
                    row = cur.execute(Q.relay_claim, {"busy": busy}).fetchone()
                if row is None:
                    return False
                self._sending[row.endpoint_id] += 1
            try:
                stats = self._attempt(conn, row)
            finally:
                with self._lock:
                    self._sending[row.endpoint_id] -= 1
                    if not self._sending[row.endpoint_id]:
                        del self._sending[row.endpoint_id]
        with self._lock:
            self.stats.add(stats)
        return True

    def _attempt(self, conn: Connection, row: Claimed) -> Stats:
        """`attempt`, in a savepoint: a bug met while sending or recording undoes only what the
        attempt wrote, and the attempt is recorded as failed under the claim's lock, still held, so
        the delivery follows its schedule instead of being claimed again at once (by this relay or
        another), and `once` still ends."""
        try:
            with conn.transaction():
                return attempt(conn, self.settings, row, self._rng)
        except psycopg.OperationalError:
            raise
        except Exception as e:
            log.exception("relay: attempt of delivery %d failed unexpectedly", row.id)
            failed = transport.Outcome(None, transport.printable(f"relay error: {type(e).__name__}: {e}"))
            return record(conn, row, failed, schedule=self.settings.webhook_out_retry_schedule, rng=self._rng)

    def _worker(self, *, until_idle: bool) -> None:
        conn: Connection | None = None
        while not self.stop.is_set():
            try:
                conn = conn or self._connect()
                if self.deliver_one(conn):
                    continue
                if until_idle:
                    break
            except psycopg.errors.InsufficientPrivilege:
                # The role lost the secrets under a running relay (migrations/0028 applied, the
                # relay still on the service's role): every claim would fail the same way, while
                # fan-out and the heartbeat went on looking healthy. Stop, and say why.
                self.cannot_sign = True
                self.stop.set()
            except psycopg.OperationalError as e:
                log.warning("relay worker: database error, reconnecting: %s", e)
                if conn is not None:
                    conn.close()
                conn = None
            except Exception:  # a bug: the attempt's transaction rolled back; the worker goes on
                log.exception("relay worker: unexpected error")
            self.stop.wait(self.poll)
        if conn is not None:
            conn.close()

    def fan_out_all(self, conn: Connection) -> int:
        """Fan out every event not fanned out yet (0 while another relay holds the turn)."""
        total = 0
        while not self.stop.is_set():
            n = outbox.fan_out(conn)
            total += n or 0
            if n != outbox.BATCH:
                return total
        return total

    def purge(self, conn: Connection) -> None:
        purged = outbox.purge(conn, keep=timedelta(days=self.settings.webhook_out_retention_days))
        if purged.orphans or purged.deliveries or purged.events:
            log.info(
                "purged %d finished deliveries and %d events; failed %d waiting for a gone endpoint",
                purged.deliveries,
                purged.events,
                purged.orphans,
            )

    def _threads(self, *, until_idle: bool) -> list[threading.Thread]:
        threads = [
            threading.Thread(target=self._worker, kwargs={"until_idle": until_idle}, name=f"relay-{n}")
            for n in range(self.workers)
        ]
        for t in threads:
            t.start()
        return threads

    def once(self) -> Stats:
        """Fan out, purge, and deliver every delivery due now (and any retry that falls due meanwhile)."""
        with self._connect() as conn:
            self.fan_out_all(conn)
            self.purge(conn)
        for t in self._threads(until_idle=True):
            t.join()
        self._raise_if_cannot_sign()
        return self.stats

    def run(self) -> None:
        """Until `stop` is set (SIGTERM): a sending worker finishes its attempt (at most the
        transport's timeout) and commits its outcome before the relay returns."""
        log.info(
            "relay running: %d workers, %d sends per endpoint at once, polling every %.1f s",
            self.workers,
            self.per_endpoint,
            self.poll,
        )
        threads = self._threads(until_idle=False)
        conn: Connection | None = None
        purged = reported = 0.0
        try:
            while not self.stop.is_set():
                try:
                    conn = conn or self._connect()
                    self.fan_out_all(conn)
                    if time.monotonic() - purged > PURGE_EVERY:
                        self.purge(conn)
                        purged = time.monotonic()
                except psycopg.Error as e:  # the connection's or a statement's: log it and go on
                    log.warning("relay: database error, reconnecting: %s", e)
                    if conn is not None:
                        conn.close()
                    conn = None
                if self.heartbeat is not None:
                    self.heartbeat.touch()
                if time.monotonic() - reported > REPORT_EVERY:
                    self._report()
                    reported = time.monotonic()
                self.stop.wait(self.poll)
        finally:
            self.stop.set()
            for t in threads:
                t.join()
            if conn is not None:
                conn.close()
            self._report()
            log.info("relay stopped")
        self._raise_if_cannot_sign()

    def _raise_if_cannot_sign(self) -> None:
        if self.cannot_sign:
            with self._connect() as conn:
                check_can_sign(conn)  # raises CannotSign, naming the role to use
            raise CannotSign("a claim was refused for the relay's database role: permission denied")

    def _report(self) -> None:
        s = self.stats
        log.info(
            "relay so far: %d delivered, %d failed attempts, %d failed for good, %d endpoints disabled",
            s.delivered,
            s.failed_attempts,
            s.failed,
            s.disabled,
        )
