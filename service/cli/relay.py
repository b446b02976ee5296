"""`quota-ledger relay`: deliver events out to webhook endpoints (service/events/relay.py,
docs/events.md). Long-running until SIGTERM or Ctrl-C; `--once` delivers what is due and exits."""

from __future__ import annotations

import argparse
import logging
import signal
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from service.cli import _settings

if TYPE_CHECKING:
    from service.events.relay import Relay


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    relay = sub.add_parser("relay", help="deliver events out to the webhook endpoints (long-running)")
    relay.add_argument("--once", action="store_true", help="deliver what is due now, then exit")
    relay.add_argument("--workers", type=int, default=4, help="sending threads, each with a connection")
    relay.add_argument(
        "--per-endpoint", type=int, default=2, metavar="N", help="at most N sends to one endpoint at once"
    )
    relay.add_argument(
        "--heartbeat", type=Path, metavar="FILE", help="touch FILE at every turn (a health check reads it)"
    )
    relay.set_defaults(func=cmd_relay)


def cmd_relay(args: argparse.Namespace) -> int:
    from service.cli import UsageError, _connect, _job_plans
    from service.events.relay import CannotSign, Relay, check_can_sign
    from service.quota.alerts import sync_thresholds

    settings = _settings()
    logging.basicConfig(
        level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    if settings.webhook_out_allow_private:
        logging.getLogger(__name__).warning(
            "WEBHOOK_OUT_ALLOW_PRIVATE is on: webhooks may reach internal addresses (never in production)"
        )
    # The plan file's thresholds reach the takes with the plan sync; the relay's start copies them
    # too, so a deployment that runs a relay fires them from its first minute (service/quota/alerts.py).
    with _connect(settings) as conn:
        try:
            check_can_sign(conn)  # before anything is claimed: a relay that cannot sign sends nothing
        except CannotSign as e:
            raise UsageError(str(e)) from None
        sync_thresholds(conn, _job_plans(settings))
    try:
        relay = Relay(
            settings, workers=args.workers, per_endpoint=args.per_endpoint, heartbeat=args.heartbeat
        )
    except ValueError as e:
        raise UsageError(str(e)) from None
    try:
        return _run(relay, once=args.once)
    except CannotSign as e:  # the role lost the secrets while the relay ran (an upgrade: 0028)
        raise UsageError(str(e)) from None


def _run(relay: Relay, *, once: bool) -> int:
    if once:
        stats = relay.once()
        print(
            f"{stats.delivered} delivered, {stats.failed_attempts} failed attempts, "
            f"{stats.failed} failed for good, {stats.disabled} endpoints disabled"
        )
        return 0

    def stop(*_: Any) -> None:
        relay.stop.set()

    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, stop)
    relay.run()
    return 0
