"""docker-compose.yml without a Docker engine: every long-running service says how to tell it is
healthy, and the front's check, run here against a real nginx with the compose file's config, passes."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import yaml

from tests.deploy.test_nginx import Front

ROOT = Path(__file__).resolve().parents[2]


def services() -> dict[str, dict[str, Any]]:
    return yaml.safe_load((ROOT / "docker-compose.yml").read_text())["services"]  # type: ignore[no-any-return]


def test_every_long_running_service_has_a_healthcheck():
    # one-shot services (migrate, citus-setup) say so with restart "no"; every other one runs for good
    long_running = {name: s for name, s in services().items() if s.get("restart", "no") != "no"}
    assert {"postgres", "redis", "web", "front", "worker", "beat"} <= set(long_running)
    missing = [name for name, s in long_running.items() if not s.get("healthcheck", {}).get("test")]
    assert not missing, f"no healthcheck: {missing}"


def test_the_fronts_healthcheck_passes_against_nginx(tmp_path):
    (tmp_path / "f").mkdir()
    front = Front("127.0.0.1:9", tmp_path / "f")  # the check is nginx's own answer, not web's
    try:
        kind, *argv = services()["front"]["healthcheck"]["test"]
        assert kind == "CMD"
        argv = [a.replace("127.0.0.1/8080", f"127.0.0.1/{front.port}") for a in argv]
        assert subprocess.run(argv, timeout=10).returncode == 0
        front.close()
        assert subprocess.run(argv, timeout=10).returncode != 0  # and fails when nginx is gone
    finally:
        if front.proc.poll() is None:
            front.close()
