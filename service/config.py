"""Settings, read from the environment in one place."""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

_PACKAGE = Path(__file__).resolve().parent


def shipped(name: str) -> Path:
    """A file or folder of the repository root that the service reads at run time (`migrations`,
    `plans.toml`). An installed package carries its own copy inside the package (setup.py puts it
    there); a source checkout, editable installs included, reads the repository's."""
    inside = _PACKAGE / name
    return inside if inside.exists() else _PACKAGE.parent / name


DEFAULT_PLANS_FILE = shipped("plans.toml")
# Provider environments a deployment can restrict its webhooks to (WEBHOOK_ENVIRONMENT); `any`
# applies both, and must be said as explicitly as the others where webhooks are served.
WEBHOOK_ENVIRONMENTS = ("production", "sandbox")
WEBHOOK_ENVIRONMENT_ANY = "any"
# The relay's waits before each retry of a failed delivery, in seconds (docs/events.md): 5 s, 5 min,
# 30 min, 2 h, 5 h, 10 h, 24 h; each stretched or shrunk by up to RETRY_JITTER at random.
DEFAULT_RETRY_SCHEDULE = (5.0, 300.0, 1800.0, 7200.0, 18000.0, 36000.0, 86400.0)
_SWITCH = {"on": True, "true": True, "1": True, "off": False, "false": False, "0": False}


def _path(value: str | None) -> Path | None:
    """An optional path setting: unset or blank is None."""
    return Path(value) if value and value.strip() else None


@dataclass(frozen=True, kw_only=True)
class Settings:
    database_url: str
    redis_url: str = "redis://127.0.0.1:6379/0"
    stripe_webhook_secrets: tuple[str, ...] = ()
    revenuecat_webhook_auth: str = ""
    plans_file: Path = DEFAULT_PLANS_FILE
    # Apply only webhook events of this provider environment (Stripe livemode, RevenueCat
    # environment); None applies both (WEBHOOK_ENVIRONMENT=any). Events of the other one are stored
    # as ignored.
    webhook_environment: str | None = None
    # Connections per web process for requests (not exports); serve's app threads are as many by
    # default (service/serve.py DEFAULT_THREADS), so that a request never waits for one behind another
    # thread of its own process.
    db_pool_size: int = 8
    # How long a request waits for a pooled connection before it is answered 503.
    db_pool_timeout: float = 2.0
    # Off behind a transaction pooler that cannot keep prepared statements across transactions
    # (PgBouncer before 1.21, or without max_prepared_statements): every statement is sent unprepared.
    db_prepared_statements: bool = True
    # Exports (GET /v1/ledger.csv) run on a pool of their own, this many per process at once; one
    # more is answered 503 at once. Their connections are never the takes' (DB_POOL_SIZE).
    export_pool_size: int = 2
    # An export whose reader takes nothing for this long is ended: the socket's send times out, and
    # PostgreSQL ends its transaction when idle this long (idle_in_transaction_session_timeout).
    export_idle_timeout: float = 300.0
    # Verified API keys are remembered this long per process: a revoked key stops working within it.
    key_cache_seconds: float = 5.0
    # The Ed25519 private key (PEM) that signs ledger checkpoints; kept where the database's owner
    # cannot read it (docs/ledger-checkpoints.md).
    ledger_checkpoint_key: Path | None = None
    # Where the daily beat task writes a signed ledger checkpoint (with the key set; else none).
    ledger_checkpoint_dir: Path | None = None
    # The webhook inbox's retention (service/billing/inbox.py): applied events kept this many days
    # (0: for ever, until finance says otherwise), ignored ones this many days, and at most this many
    # unmatched events per provider (the oldest beyond it are removed, counted and logged).
    inbox_applied_days: int = 0
    inbox_ignored_days: int = 30
    inbox_unmatched_limit: int = 10_000
    # Signs the web console's cookies (docs/console.md); at least 32 bytes, else the console is off
    # (its routes answer 404).
    console_secret_key: str = ""
    # A console session ends after this many minutes without a request.
    console_idle_minutes: float = 30.0
    # Events out (docs/events.md). True lets webhook endpoints be http and reach loopback, private and
    # other reserved addresses: for development and tests only, never in production.
    webhook_out_allow_private: bool = False
    # The waits before the retries of a failed delivery (seconds); after the last, it is failed.
    webhook_out_retry_schedule: tuple[float, ...] = DEFAULT_RETRY_SCHEDULE
    # Finished deliveries and fanned-out events are purged after this many days.
    webhook_out_retention_days: int = 7

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None, *, serving: bool = False) -> Settings:
        """Read settings from `env` (default: os.environ). DATABASE_URL is required; so is
        WEBHOOK_ENVIRONMENT when `serving` (the web app, which applies webhook events): a production
        deployment must not be one forgotten variable away from applying sandbox purchases."""
        e = os.environ if env is None else env
        url = e.get("DATABASE_URL", "")
        if not url:
            raise RuntimeError("DATABASE_URL is not set (see docs/operations.md)")
        choices = (*WEBHOOK_ENVIRONMENTS, WEBHOOK_ENVIRONMENT_ANY)
        environment = e.get("WEBHOOK_ENVIRONMENT", "").strip().lower()
        if environment and environment not in choices:
            raise RuntimeError(
                f"WEBHOOK_ENVIRONMENT must be one of {', '.join(choices)}, not {e['WEBHOOK_ENVIRONMENT']!r}"
            )
        if serving and not environment:
            raise RuntimeError(
                "WEBHOOK_ENVIRONMENT is not set: production on a production deployment, sandbox on "
                "one that takes provider test events only, any to apply both (docs/operations.md)"
            )
        prepared = e.get("DB_PREPARED_STATEMENTS", "on").strip().lower()
        if prepared not in _SWITCH:
            raise RuntimeError(
                f"DB_PREPARED_STATEMENTS must be on or off, not {e['DB_PREPARED_STATEMENTS']!r}"
            )
        allow_private = e.get("WEBHOOK_OUT_ALLOW_PRIVATE", "off").strip().lower()
        if allow_private not in _SWITCH:
            raise RuntimeError(
                f"WEBHOOK_OUT_ALLOW_PRIVATE must be true or false, not {e['WEBHOOK_OUT_ALLOW_PRIVATE']!r}"
            )
        return cls(
            database_url=url,
            redis_url=e.get("REDIS_URL", cls.redis_url),
            stripe_webhook_secrets=tuple(
                s.strip() for s in e.get("STRIPE_WEBHOOK_SECRETS", "").split(",") if s.strip()
            ),
            revenuecat_webhook_auth=e.get("REVENUECAT_WEBHOOK_AUTH", ""),
            plans_file=Path(e.get("PLANS_FILE") or DEFAULT_PLANS_FILE),
            webhook_environment=environment if environment in WEBHOOK_ENVIRONMENTS else None,  # any: None
            db_pool_size=int(e.get("DB_POOL_SIZE", cls.db_pool_size)),
            db_pool_timeout=float(e.get("DB_POOL_TIMEOUT", cls.db_pool_timeout)),
            db_prepared_statements=_SWITCH[prepared],
            export_pool_size=int(e.get("EXPORT_POOL_SIZE", cls.export_pool_size)),
            export_idle_timeout=float(e.get("EXPORT_IDLE_TIMEOUT", cls.export_idle_timeout)),
            key_cache_seconds=float(e.get("KEY_CACHE_SECONDS", cls.key_cache_seconds)),
            ledger_checkpoint_key=_path(e.get("LEDGER_CHECKPOINT_KEY")),
            ledger_checkpoint_dir=_path(e.get("LEDGER_CHECKPOINT_DIR")),
            inbox_applied_days=_count(e, "INBOX_APPLIED_DAYS", cls.inbox_applied_days),
            inbox_ignored_days=_count(e, "INBOX_IGNORED_DAYS", cls.inbox_ignored_days),
            inbox_unmatched_limit=_count(e, "INBOX_UNMATCHED_LIMIT", cls.inbox_unmatched_limit, minimum=1),
            console_secret_key=e.get("CONSOLE_SECRET_KEY", ""),
            console_idle_minutes=_minutes(e, "CONSOLE_IDLE_MINUTES", cls.console_idle_minutes),
            webhook_out_allow_private=_SWITCH[allow_private],
            webhook_out_retry_schedule=_schedule(e, "WEBHOOK_OUT_RETRY_SCHEDULE", DEFAULT_RETRY_SCHEDULE),
            webhook_out_retention_days=_count(
                e, "WEBHOOK_OUT_RETENTION_DAYS", cls.webhook_out_retention_days, minimum=1
            ),
        )


def _minutes(env: Mapping[str, str], name: str, default: float) -> float:
    """A finite number of minutes > 0 from the environment, or `default` when unset."""
    raw = env.get(name, "").strip()
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value <= 0:
        raise RuntimeError(f"{name} must be a number of minutes > 0, not {raw!r}")
    return value


def _count(env: Mapping[str, str], name: str, default: int, *, minimum: int = 0) -> int:
    """A whole number >= `minimum` from the environment, or `default` when unset."""
    raw = env.get(name, "").strip()
    if not raw:
        return default
    if not raw.isdigit() or int(raw) < minimum:
        raise RuntimeError(f"{name} must be a whole number >= {minimum}, not {raw!r}")
    return int(raw)


def _schedule(env: Mapping[str, str], name: str, default: tuple[float, ...]) -> tuple[float, ...]:
    """Comma-separated finite seconds >= 0 (at most a day's worth of entries), or `default` when
    unset; an empty list is not a schedule (a delivery that fails once would never be retried)."""
    raw = env.get(name, "").strip()
    if not raw:
        return default
    try:
        waits = tuple(float(part) for part in raw.split(","))
    except ValueError:
        waits = (math.nan,)
    if len(waits) > 100 or not all(math.isfinite(w) and 0 <= w <= 30 * 86400 for w in waits):
        raise RuntimeError(
            f"{name} must be seconds, comma-separated, each 0 to 2592000 (at most 100), not {raw!r}"
        )
    return waits
