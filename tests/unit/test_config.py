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
