"""docker-compose.yml without a Docker engine: every long-running service says how to tell it is
healthy, and the checks of the front, web, worker and beat, run here against a real nginx, `serve`,
worker and state file with the compose file's commands, pass when the service is up and fail when
it is not. `docker compose config`, where the plugin is installed, reads the file the same way."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml

from service.cli import build_parser
from tests.deploy.test_nginx import Front
from tests.http.test_serve import serve_env, serving
from tests.workers.conftest import Worker

ROOT = Path(__file__).resolve().parents[2]


def services() -> dict[str, dict[str, Any]]:
    return yaml.safe_load((ROOT / "docker-compose.yml").read_text())["services"]  # type: ignore[no-any-return]


def one_shot(all_services: dict[str, dict[str, Any]]) -> set[str]:
    """The services another one waits to finish (`service_completed_successfully`): the rest run
    for good."""
    return {
        name
        for svc in all_services.values()
        for name, dep in (svc.get("depends_on") or {}).items()
        if isinstance(dep, dict) and dep.get("condition") == "service_completed_successfully"
    }


def missing_healthchecks(all_services: dict[str, dict[str, Any]]) -> dict[str, str]:
    """Each long-running service without a working healthcheck or restart policy, and what it lacks."""
    done = one_shot(all_services)
    out = {}
    for name, svc in all_services.items():
        if name in done:
            if svc.get("restart") != "no":
                out[name] = "a one-shot service restarts only with restart: no"
            continue
        check = svc.get("healthcheck") or {}
        test = check.get("test")
        if check.get("disable") or not test or test in (["NONE"], "NONE"):
            out[name] = "no healthcheck"
        elif svc.get("restart", "no") == "no":
            out[name] = "no restart policy"
    return out


def test_every_long_running_service_has_a_healthcheck() -> None:
    every = services()
    assert one_shot(every) == {"migrate", "citus-setup"}
    assert {"postgres", "redis", "web", "front", "worker", "beat"} <= set(every) - one_shot(every)
    assert missing_healthchecks(every) == {}
    # the check itself catches a service added without one, or one whose check is switched off
    assert missing_healthchecks({**every, "relay": {"image": "x", "restart": "unless-stopped"}}) == {
        "relay": "no healthcheck"
    }
    off = {**every["worker"], "healthcheck": {"disable": True}}
    assert missing_healthchecks({**every, "worker": off}) == {"worker": "no healthcheck"}


def _docker_compose_unavailable() -> str:
    if shutil.which("docker") is None:
        return "no docker client"
    done = subprocess.run(["docker", "compose", "version"], capture_output=True, text=True, timeout=30)
    if done.returncode != 0:
        said = (done.stderr.strip() or done.stdout.strip()).splitlines()
        return f"the docker compose plugin is not installed ({said[0] if said else done.returncode})"
    return ""


def test_docker_compose_config_agrees() -> None:
    """compose's own reading of the file (anchors, merges, profiles), which needs no engine."""
    if reason := _docker_compose_unavailable():
        pytest.skip(reason)
    done = subprocess.run(
        ["docker", "compose", "--profile", "citus", "config", "--format", "json"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    normalized = json.loads(done.stdout)["services"]
    assert set(normalized) == set(services())
    assert missing_healthchecks(normalized) == {}


def test_the_fronts_healthcheck_passes_against_nginx(tmp_path: Path) -> None:
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


def test_the_web_healthcheck_passes_against_serve(app_db_url: str, redis_url: str, tmp_path: Path) -> None:
    web = services()["web"]
    kind, python, *args = web["healthcheck"]["test"]
    assert (kind, python) == ("CMD", "python")
    bind = build_parser().parse_args(web["command"][1:]).bind
    port = int(bind.rpartition(":")[2])
    assert f"127.0.0.1:{port}/" in " ".join(args)  # the check asks the port web listens on
    with serving(serve_env(app_db_url, redis_url), "--workers", "1", log=tmp_path / "serve.log") as (ours, _):
        check = [sys.executable, *(a.replace(f"127.0.0.1:{port}/", f"127.0.0.1:{ours}/") for a in args)]
        assert subprocess.run(check, timeout=30).returncode == 0
    assert subprocess.run(check, capture_output=True, timeout=30).returncode != 0  # and fails once it is gone


def test_the_worker_healthcheck_pings_the_worker(db_url: str, redis_url: str, tmp_path: Path) -> None:
    worker = services()["worker"]
    kind, command = worker["healthcheck"]["test"]
    assert kind == "CMD-SHELL"
    # the worker's node name, as the check names it: compose's $$ is the shell's $
    hostname = build_parser().parse_args(worker["command"][1:]).hostname
    assert hostname == "quota-ledger@%h" and "--destination quota-ledger@$$HOSTNAME " in command
    node = Worker(db_url=db_url, redis_url=redis_url, log=tmp_path / "worker.log")
    env = {**node.env, "HOSTNAME": socket.gethostname()}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"  # celery
    check = ["sh", "-c", command.replace("$$", "$").replace("quota-ledger@", f"{node.queue}@")]
    assert shlex.split(check[2])[:2] == ["celery", "-A"]
    node.start()
    try:
        assert subprocess.run(check, env=env, cwd=ROOT, capture_output=True, timeout=60).returncode == 0
    finally:
        node.stop()
    assert subprocess.run(check, env=env, cwd=ROOT, capture_output=True, timeout=60).returncode != 0


def test_the_beat_healthcheck_follows_its_state_file(tmp_path: Path) -> None:
    beat = services()["beat"]
    kind, python, *args = beat["healthcheck"]["test"]
    assert (kind, python) == ("CMD", "python")
    schedule = Path(build_parser().parse_args(beat["command"][1:]).schedule)
    assert f"'{schedule}*'" in args[-1]  # the check reads the file beat writes
    check = [sys.executable, *(a.replace(str(schedule), str(tmp_path / schedule.name)) for a in args)]
    assert subprocess.run(check, timeout=30).returncode != 0  # no state yet
    state = tmp_path / f"{schedule.name}.db"
    state.write_bytes(b"")
    assert subprocess.run(check, timeout=30).returncode == 0
    stale = time.time() - 3600
    os.utime(state, (stale, stale))
    assert subprocess.run(check, timeout=30).returncode != 0  # beat stopped writing it


def test_the_relay_healthcheck_follows_its_heartbeat(tmp_path: Path) -> None:
    relay = services()["relay"]
    assert relay["command"][:2] == ["quota-ledger", "relay"]
    kind, python, *args = relay["healthcheck"]["test"]
    assert (kind, python) == ("CMD", "python")
    heartbeat = str(build_parser().parse_args(relay["command"][1:]).heartbeat)
    assert f"'{heartbeat}'" in args[-1]  # the check reads the file the relay touches
    beat = tmp_path / "relay-alive"
    check = [sys.executable, *(a.replace(heartbeat, str(beat)) for a in args)]
    assert subprocess.run(check, timeout=30).returncode != 0  # not started
    beat.touch()
    assert subprocess.run(check, timeout=30).returncode == 0
    stale = time.time() - 3600
    os.utime(beat, (stale, stale))
    assert subprocess.run(check, timeout=30).returncode != 0  # the relay's loop stopped


def test_the_relay_alone_connects_as_the_relay_role_migrate_creates() -> None:
    """migrate makes two login roles; the relay connects as the one in quota_relay (which reads the
    endpoints' signing secrets), every other service as the one in quota_app, with the passwords
    migrate sets."""
    every = services()
    migrate = build_parser().parse_args(every["migrate"]["command"][1:])
    assert (migrate.login_role, migrate.relay_role) == ("quota_service", "quota_relay_service")
    users = {}
    for name, service in every.items():
        url = (service.get("environment") or {}).get("DATABASE_URL")
        if url and name != "migrate" and service.get("command", [""])[0] == "quota-ledger":
            users[name] = urlsplit(url).username, urlsplit(url).password
    env = every["migrate"]["environment"]
    assert users.pop("relay") == ("quota_relay_service", env["RELAY_ROLE_PASSWORD"])
    assert set(users) == {"web", "worker", "beat"}
    assert set(users.values()) == {("quota_service", env["LOGIN_ROLE_PASSWORD"])}
