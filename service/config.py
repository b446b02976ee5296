"""Settings, read from the environment in one place."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

DEFAULT_PLANS_FILE = Path(__file__).resolve().parent.parent / "plans.toml"
# Provider environments a deployment can restrict its webhooks to (WEBHOOK_ENVIRONMENT).
WEBHOOK_ENVIRONMENTS = ("production", "sandbox")
_SWITCH = {"on": True, "true": True, "1": True, "off": False, "false": False, "0": False}


@dataclass(frozen=True, kw_only=True)
class Settings:
    database_url: str
    redis_url: str = "redis://127.0.0.1:6379/0"
    stripe_webhook_secrets: tuple[str, ...] = ()
    revenuecat_webhook_auth: str = ""
    plans_file: Path = DEFAULT_PLANS_FILE
    # Apply only webhook events of this provider environment (Stripe livemode, RevenueCat
    # environment); None applies both. Events of the other one are stored as ignored.
    webhook_environment: str | None = None
    db_pool_size: int = 4
    # How long a request waits for a pooled connection before it is answered 503.
    db_pool_timeout: float = 2.0
    # Off behind a transaction pooler that cannot keep prepared statements across transactions
    # (PgBouncer before 1.21, or without max_prepared_statements): every statement is sent unprepared.
    db_prepared_statements: bool = True
    # Verified API keys are remembered this long per process: a revoked key stops working within it.
    key_cache_seconds: float = 5.0

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None) -> Settings:
        """Read settings from `env` (default: os.environ). DATABASE_URL is required."""
        e = os.environ if env is None else env
        url = e.get("DATABASE_URL", "")
        if not url:
            raise RuntimeError("DATABASE_URL is not set (see README: Configuration)")
        environment = e.get("WEBHOOK_ENVIRONMENT", "").strip().lower() or None
        if environment not in (None, *WEBHOOK_ENVIRONMENTS):
            raise RuntimeError(
                f"WEBHOOK_ENVIRONMENT must be one of {', '.join(WEBHOOK_ENVIRONMENTS)} or unset, not "
                f"{e['WEBHOOK_ENVIRONMENT']!r}"
            )
        prepared = e.get("DB_PREPARED_STATEMENTS", "on").strip().lower()
        if prepared not in _SWITCH:
            raise RuntimeError(
                f"DB_PREPARED_STATEMENTS must be on or off, not {e['DB_PREPARED_STATEMENTS']!r}"
            )
        return cls(
            database_url=url,
            redis_url=e.get("REDIS_URL", cls.redis_url),
            stripe_webhook_secrets=tuple(
                s.strip() for s in e.get("STRIPE_WEBHOOK_SECRETS", "").split(",") if s.strip()
            ),
            revenuecat_webhook_auth=e.get("REVENUECAT_WEBHOOK_AUTH", ""),
            plans_file=Path(e.get("PLANS_FILE") or DEFAULT_PLANS_FILE),
            webhook_environment=environment,
            db_pool_size=int(e.get("DB_POOL_SIZE", cls.db_pool_size)),
            db_pool_timeout=float(e.get("DB_POOL_TIMEOUT", cls.db_pool_timeout)),
            db_prepared_statements=_SWITCH[prepared],
            key_cache_seconds=float(e.get("KEY_CACHE_SECONDS", cls.key_cache_seconds)),
        )
