"""Static checks: Celery settings that exactly-once relies on, the beat schedule, the broker URL
conversion, and docker-compose.yml (no Docker engine here, so the file is parsed and its commands
are checked against the real `quota-ledger` parser)."""

from __future__ import annotations

import ast
from datetime import UTC, datetime, timedelta
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import yaml
from celery.schedules import crontab

from service.cli import build_parser
from workers.app import BEAT_SCHEDULE, TASK_TIME_LIMIT, VISIBILITY_TIMEOUT, broker_url, make_app

ROOT = Path(__file__).resolve().parents[2]
README_ENV = {
    "DATABASE_URL",
    "REDIS_URL",
    "STRIPE_WEBHOOK_SECRETS",
    "REVENUECAT_WEBHOOK_AUTH",
    "PLANS_FILE",
    "WEBHOOK_ENVIRONMENT",
}


def test_celery_settings() -> None:
    conf = make_app(redis_url="redis://127.0.0.1:6379/3", queue="q").conf
    assert conf.broker_url == "redis://127.0.0.1:6379/3"
    assert conf.task_acks_late is True
    assert conf.task_reject_on_worker_lost is True
    assert conf.worker_prefetch_multiplier == 1
    assert conf.worker_cancel_long_running_tasks_on_connection_loss is True
    assert conf.task_serializer == "json" and list(conf.accept_content) == ["json"]
    assert conf.timezone == "UTC" and conf.enable_utc is True
    assert conf.task_default_queue == "q"
    # no message may be redelivered while its task can still be running
    assert conf.broker_transport_options["visibility_timeout"] == VISIBILITY_TIMEOUT
    assert conf.task_time_limit == TASK_TIME_LIMIT < VISIBILITY_TIMEOUT
    assert conf.task_soft_time_limit < conf.task_time_limit


def test_no_task_is_sent_with_an_eta_or_countdown() -> None:
    """A countdown/ETA longer than the visibility timeout is redelivered again and again."""
    for path in [*ROOT.joinpath("workers").glob("*.py"), *ROOT.joinpath("service").rglob("*.py")]:
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.keyword) and node.arg in ("eta", "countdown"):
                raise AssertionError(f"{path}:{node.value.lineno}: {node.arg}= is not allowed")
    for entry in BEAT_SCHEDULE.values():
        assert not {"eta", "countdown"} & set(entry.get("options", {}))
        assert entry.get("options", {}).get("expires", 0) < VISIBILITY_TIMEOUT


def fires(schedule: crontab, start: datetime, hours: int) -> list[datetime]:
    """Every minute in [start, start + hours) at which `schedule` matches."""
    out = []
    t = start
    while t < start + timedelta(hours=hours):
        if (
            t.minute in schedule.minute
            and t.hour in schedule.hour
            and t.day in schedule.day_of_month
            and t.month in schedule.month_of_year
            and t.isoweekday() % 7 in schedule.day_of_week
        ):
            out.append(t)
        t += timedelta(minutes=1)
    return out


def test_beat_schedule() -> None:
    tasks = {entry["task"] for entry in BEAT_SCHEDULE.values()}
    assert tasks == {
        "quota.monthly_reset",
        "quota.daily_reset",
        "quota.reset_catch_up",
        "quota.plan_sync",
        "billing.purge_inbox",
        "billing.expire_access",
        "ledger.checkpoint",
        "quota.expire_grants",
    }
    monthly = BEAT_SCHEDULE["monthly-reset"]["schedule"]
    assert monthly == crontab(minute=5, hour=0, day_of_month=1)
    # over two months (one starting on a Sunday, so a day_of_week trap would show), it fires on the
    # 1st at 00:05 UTC and nowhere else
    start = datetime(2026, 10, 31, tzinfo=UTC)
    assert fires(monthly, start, 24 * 62) == [
        datetime(2026, 11, 1, 0, 5, tzinfo=UTC),
        datetime(2026, 12, 1, 0, 5, tzinfo=UTC),
    ]
    daily = fires(BEAT_SCHEDULE["daily-reset"]["schedule"], start, 72)
    assert [(t.hour, t.minute) for t in daily] == [(0, 1)] * 3  # every day at 00:01 UTC
    tick = BEAT_SCHEDULE["reset-catch-up"]["schedule"]
    assert len(fires(tick, start, 24)) == 24  # hourly
    assert len(fires(BEAT_SCHEDULE["plan-sync"]["schedule"], start, 72)) == 3  # daily
    assert len(fires(BEAT_SCHEDULE["expire-access"]["schedule"], start, 24)) == 24  # hourly
    assert len(fires(BEAT_SCHEDULE["ledger-checkpoint"]["schedule"], start, 72)) == 3  # daily


def test_registered_tasks() -> None:
    from workers.app import app

    app.loader.import_default_modules()
    assert {
        "quota.monthly_reset",
        "quota.daily_reset",
        "quota.reset_catch_up",
        "quota.plan_sync",
        "billing.expire_access",
        "ledger.checkpoint",
    } <= set(app.tasks)


@pytest.mark.parametrize(
    ("redis_url", "expected"),
    [
        ("redis://127.0.0.1:6379/0", "redis://127.0.0.1:6379/0"),
        ("rediss://:pw@host:6380/2", "rediss://:pw@host:6380/2"),
        ("unix:///tmp/x/redis.socket", "redis+socket:///tmp/x/redis.socket"),
        ("unix:///tmp/x/redis.socket?db=7", "redis+socket:///tmp/x/redis.socket?virtual_host=7"),
    ],
)
def test_broker_url(redis_url: str, expected: str) -> None:
    assert broker_url(redis_url) == expected


def test_docker_compose() -> None:
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    services = compose["services"]
    assert {"postgres", "redis", "migrate", "web", "worker", "beat"} <= set(services)
    parser = build_parser()
    ours = {name: svc for name, svc in services.items() if "build" in svc}
    assert set(ours) == {"migrate", "web", "worker", "beat", "relay"}
    commands = {}
    for name, svc in ours.items():
        command = svc["command"]
        assert command[0] == "quota-ledger", name
        args = parser.parse_args(command[1:])  # exits (fails the test) on an unknown command
        commands[name] = args.command
        assert set(svc["environment"]) >= README_ENV, name
    assert commands == {
        "migrate": "migrate",
        "web": "serve",
        "worker": "worker",
        "beat": "beat",
        "relay": "relay",
    }
    assert services["migrate"]["restart"] == "no"
    for name in ("web", "worker", "relay"):
        assert services[name]["depends_on"]["migrate"]["condition"] == "service_completed_successfully"
    assert "replicas" not in services["beat"].get("deploy", {})  # exactly one beat
    assert (ROOT / "Dockerfile").exists()


def _compose_default(value: str) -> str:
    """`${VAR:-default}` as compose reads it when VAR is unset."""
    return value.split(":-", 1)[1].rstrip("}") if value.startswith("${") else value


def test_docker_compose_least_privilege_and_front() -> None:
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    services = compose["services"]
    owner = services["postgres"]["environment"]["POSTGRES_USER"]
    parser = build_parser()

    def user(name: str) -> str:
        url = services[name]["environment"]["DATABASE_URL"]
        return str(urlsplit(url.replace("${", "").replace(":-", "-").replace("}", "")).username)

    migrate = parser.parse_args(services["migrate"]["command"][1:])
    assert user("migrate") == owner and migrate.login_role not in (None, owner)
    for name in ("web", "worker", "beat"):
        assert user(name) == migrate.login_role, name  # the login role migrate creates, not the owner
        assert _compose_default(services[name]["environment"]["WEBHOOK_ENVIRONMENT"]) == "production"
    # Only the front is published; the web server and its /metrics stay on the compose network.
    published = {name for name, svc in services.items() if svc.get("ports")}
    assert published == {"front"}
    front = (ROOT / "deploy" / "nginx.conf").read_text()
    assert "set $web web:8000;" in front and "location = /metrics" in front
    assert "proxy_request_buffering on" in front and "client_body_timeout" in front
