"""The project as an operator installs it: non-editable, into a fresh venv, run from another folder.
Its migrations and sample plan config must come with the package (they live at the repository root
in a checkout)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
import venv
from pathlib import Path

import pytest

from service import migrate as migrate_module

ROOT = Path(__file__).resolve().parents[2]


def _run(cmd: list[str], **kw: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=False, **kw)  # type: ignore[call-overload, no-any-return]


@pytest.mark.slow
def test_a_non_editable_install_migrates_from_another_folder_and_creates_a_key(empty_db, tmp_path):
    # A copy of the source, so that the build writes nothing into the checkout.
    src = tmp_path / "src"
    shutil.copytree(
        ROOT,
        src,
        ignore=shutil.ignore_patterns(".*", "build", "*.egg-info", "__pycache__", "tests", "bench"),
    )
    # A fresh venv whose own site-packages come first; the test venv's are appended only to lend it
    # the dependencies (not the editable install: a path line does not run that folder's .pth files).
    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=False)
    py = env_dir / "bin" / "python"
    own_site = _run([str(py), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"]).stdout.strip()
    Path(own_site, "lend-test-deps.pth").write_text(sysconfig.get_path("purelib") + "\n")
    pip = [str(py), "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation", "--no-index"]
    installed = _run([*pip, str(src)], cwd=tmp_path)
    assert installed.returncode == 0, installed.stderr

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("PLANS_FILE", "PYTHONPATH")}
    env["DATABASE_URL"] = empty_db
    where = _run([str(py), "-c", "import service; print(service.__file__)"], cwd=elsewhere, env=env)
    assert where.stdout.startswith(own_site), where  # the installed copy, not the checkout

    cli = str(env_dir / "bin" / "quota-ledger")
    migrated = _run([cli, "migrate"], cwd=elsewhere, env=env)
    assert migrated.returncode == 0, migrated.stderr
    assert migrated.stdout.startswith("applied: 0001.core"), migrated.stdout
    key = _run([cli, "keys", "create", "--role", "admin", "--name", "ops"], cwd=elsewhere, env=env)
    assert key.returncode == 0, key.stderr
    assert key.stdout.splitlines()[-1].startswith("qlk_")
    plans = _run([cli, "sync-plans", "--dry-run"], cwd=elsewhere, env=env)  # the shipped plans.toml
    assert plans.returncode == 0, plans.stderr
    # the console's templates and style sheet come with the package
    page = (
        "from service import create_app; c = create_app().test_client(); "
        "r = c.get('/console/login'); s = c.get('/console/static/console.css'); "
        "print(r.status_code, 'api_key' in r.get_data(as_text=True), s.status_code, len(s.data) > 1000)"
    )
    console_env = {**env, "CONSOLE_SECRET_KEY": "k" * 32, "WEBHOOK_ENVIRONMENT": "any"}
    console = _run([str(py), "-c", page], cwd=elsewhere, env=console_env)
    assert console.stdout.split() == ["200", "True", "200", "True"], console


def test_migrate_fails_loudly_when_it_finds_no_migration(empty_db, tmp_path, monkeypatch):
    monkeypatch.setattr(migrate_module, "MIGRATIONS_DIR", tmp_path)
    with pytest.raises(migrate_module.NoMigrations, match="no migration found"):
        migrate_module.migrate(empty_db)


def test_the_migrate_command_exits_non_zero_without_migrations(empty_db, tmp_path):
    """The command as an install without its migrations runs it: a package whose folder has none."""
    code = (
        "import sys; from pathlib import Path; import service.migrate as m; "
        f"m.MIGRATIONS_DIR = Path({str(tmp_path)!r}); "
        "from service.cli import main; sys.exit(main(['migrate']))"
    )
    done = _run([sys.executable, "-c", code], env={**os.environ, "DATABASE_URL": empty_db})
    assert done.returncode == 2, done  # the install's error, not a finding
    assert "no migration found" in done.stderr and "database is up to date" not in done.stdout
