"""WEBHOOK_ENVIRONMENT is a choice every server makes explicitly (docs/operations.md: Configuration)."""

from __future__ import annotations

import pytest

from service.config import Settings

BASE = {"DATABASE_URL": "postgresql://x/y"}


@pytest.mark.parametrize(
    ("value", "applies"), [("production", "production"), ("sandbox", "sandbox"), ("any", None)]
)
def test_each_choice_is_read(value: str, applies: str | None) -> None:
    env = {**BASE, "WEBHOOK_ENVIRONMENT": value}
    assert Settings.from_env(env).webhook_environment == applies
    assert Settings.from_env(env, serving=True).webhook_environment == applies


def test_a_server_refuses_to_start_without_it_and_other_commands_do_not_need_it() -> None:
    with pytest.raises(RuntimeError, match="WEBHOOK_ENVIRONMENT is not set: production"):
        Settings.from_env(BASE, serving=True)
    assert Settings.from_env(BASE).webhook_environment is None  # migrate, keys, the jobs: no webhooks


@pytest.mark.parametrize("value", ["nan", "inf", "-5", "0", "soon"])
def test_the_consoles_idle_time_is_a_number_of_minutes_above_zero(value: str) -> None:
    with pytest.raises(RuntimeError, match="CONSOLE_IDLE_MINUTES must be a number of minutes > 0"):
        Settings.from_env({**BASE, "CONSOLE_IDLE_MINUTES": value})
    assert Settings.from_env({**BASE, "CONSOLE_IDLE_MINUTES": "2.5"}).console_idle_minutes == 2.5


def test_events_out_settings() -> None:
    default = Settings.from_env(BASE)
    assert default.webhook_out_allow_private is False
    assert default.webhook_out_retry_schedule == (5, 300, 1800, 7200, 18000, 36000, 86400)
    assert default.webhook_out_retention_days == 7
    env = {**BASE, "WEBHOOK_OUT_ALLOW_PRIVATE": "true", "WEBHOOK_OUT_RETRY_SCHEDULE": " 0, 0,1.5 "}
    s = Settings.from_env({**env, "WEBHOOK_OUT_RETENTION_DAYS": "30"})
    assert (s.webhook_out_allow_private, s.webhook_out_retry_schedule) == (True, (0, 0, 1.5))
    assert s.webhook_out_retention_days == 30


@pytest.mark.parametrize(
    ("name", "value", "says"),
    [
        ("WEBHOOK_OUT_ALLOW_PRIVATE", "yes please", "must be true or false"),
        ("WEBHOOK_OUT_RETRY_SCHEDULE", "5,,10", "must be seconds, comma-separated"),
        ("WEBHOOK_OUT_RETRY_SCHEDULE", "5,-1", "must be seconds"),
        ("WEBHOOK_OUT_RETRY_SCHEDULE", "nan", "must be seconds"),
        ("WEBHOOK_OUT_RETRY_SCHEDULE", "9999999", "must be seconds"),
        ("WEBHOOK_OUT_RETRY_SCHEDULE", ",".join(["1"] * 101), "must be seconds"),
        ("WEBHOOK_OUT_RETENTION_DAYS", "0", "must be a whole number >= 1"),
        ("WEBHOOK_OUT_RETENTION_DAYS", "a week", "must be a whole number >= 1"),
    ],
)
def test_events_out_settings_are_refused_clearly(name: str, value: str, says: str) -> None:
    with pytest.raises(RuntimeError, match=f"{name} {says}"):
        Settings.from_env({**BASE, name: value})
