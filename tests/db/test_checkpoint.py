"""Signed ledger checkpoints (service/quota/checkpoint.py): a chain rewritten consistently by the
owner passes the plain verify but not `verify --checkpoint`; a checkpoint changed after it was
signed, or proved with another key, is refused; a broken ledger is not signed; the daily task
writes one file per day; the commands' exit codes. Keys are made by openssl, as an operator would."""

from __future__ import annotations

import base64
import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from service.quota import chain, checkpoint, takes
from tests.db.helpers import new_account
from tests.db.test_chain import METRIC, rewrite, rows, tamper
from tests.db.test_finance_commands import cli


def openssl_key(path: Path) -> tuple[Path, Path]:
    """An Ed25519 key pair in PEM files made by openssl: (private, public)."""
    private, public = path / "ledger-key.pem", path / "ledger-key.pub.pem"
    subprocess.run(["openssl", "genpkey", "-algorithm", "ed25519", "-out", str(private)], check=True)
    subprocess.run(["openssl", "pkey", "-in", str(private), "-pubout", "-out", str(public)], check=True)
    return private, public


@pytest.fixture
def keys(tmp_path: Path) -> tuple[Path, Path]:
    return openssl_key(tmp_path)


def _ledger(conn: Any, plans: Any) -> list[str]:
    accounts = [new_account(conn, plans) for _ in range(3)]
    for a in accounts:
        for _ in range(3):
            takes.take(conn, plans, account_id=a, metric=METRIC, actor="t")
        takes.take(conn, plans, account_id=a, metric="seats", actor="t")
    return accounts


def _write(conn: Any, private: Path, path: Path) -> checkpoint.Written:
    return checkpoint.write_file(conn, checkpoint.load_private_key(private), path)


def test_a_consistent_rewrite_passes_verify_but_not_the_checkpoint(
    conn: Any, plans: Any, keys: tuple[Path, Path], tmp_path: Path
) -> None:
    accounts = _ledger(conn, plans)
    target = tmp_path / "cp.json"
    written = _write(conn, keys[0], target)
    assert (written.counters, written.rows) == (6, 12)
    public = checkpoint.load_public_key(keys[1])
    cp = checkpoint.read(target.read_text(), public)
    assert checkpoint.verify_against(conn, cp).ok
    takes.take(conn, plans, account_id=accounts[0], metric=METRIC, actor="t")  # the ledger grows on
    assert checkpoint.verify_against(conn, cp).ok

    old = rows(conn, accounts[1])
    rewrite(conn, accounts[1], METRIC, {2: {"actor": "someone else"}})  # every hash and the head recomputed

    assert chain.verify(conn).ok
    result = checkpoint.verify_against(conn, cp)
    assert not result.ok
    [finding] = result.findings
    assert (finding.account_id, finding.metric, finding.row_id) == (accounts[1], METRIC, old[2].id)
    assert "the row at seq 3 has hash" in finding.problem and "the chain was rewritten" in finding.problem
    assert checkpoint.verify_against(conn, cp, account_id=accounts[0]).ok
    assert not checkpoint.verify_against(conn, cp, account_id=accounts[1]).ok


def test_a_chain_cut_back_below_its_checkpoint_is_named(
    conn: Any, plans: Any, keys: tuple[Path, Path], tmp_path: Path
) -> None:
    """Rows removed from the end and the head moved back: plain verify holds, the checkpoint does not."""
    accounts = _ledger(conn, plans)
    target = tmp_path / "cp.json"
    _write(conn, keys[0], target)
    last = rows(conn, accounts[2])[-1]
    tamper(conn, "DELETE FROM ledger WHERE account_id = %s AND id = %s", accounts[2], last.id)
    rewrite(conn, accounts[2], METRIC, {})  # the head back on the row before
    assert chain.verify(conn).ok

    cp = checkpoint.read(target.read_text(), checkpoint.load_public_key(keys[1]))
    [finding] = checkpoint.verify_against(conn, cp).findings
    assert (finding.account_id, finding.row_id) == (accounts[2], None)
    assert "the checkpoint's row at seq 3 is gone" in finding.problem


def _tampered(text: str, change: Any) -> str:
    doc = json.loads(text)
    change(doc)
    return json.dumps(doc)


def _other_signature(doc: dict[str, Any]) -> None:
    sig = bytearray(base64.b64decode(doc["signature"]))
    sig[0] ^= 1
    doc["signature"] = base64.b64encode(bytes(sig)).decode()


TAMPERS = {
    "a counter's hash": (lambda d: d["counters"][0].update(hash="00" * 32), "do not match its signed digest"),
    "a counter removed": (lambda d: d["counters"].pop(), "do not match its signed digest"),
    "the digest": (lambda d: d.update(digest="00" * 32), "the signature does not verify"),
    "the time": (
        lambda d: d.update(created_at="2001-01-01T00:00:00.000000Z"),
        "the signature does not verify",
    ),
    "the signature": (_other_signature, "the signature does not verify"),
    "the version": (lambda d: d.update(version=2), "version 2"),
    "no signature": (lambda d: d.pop("signature"), "malformed"),
}


@pytest.mark.parametrize("what", list(TAMPERS))
def test_a_changed_checkpoint_is_refused(
    conn: Any, plans: Any, keys: tuple[Path, Path], tmp_path: Path, what: str
) -> None:
    _ledger(conn, plans)
    target = tmp_path / "cp.json"
    _write(conn, keys[0], target)
    public = checkpoint.load_public_key(keys[1])
    checkpoint.read(target.read_text(), public)
    change, words = TAMPERS[what]
    with pytest.raises(checkpoint.CheckpointRefused, match=words):
        checkpoint.read(_tampered(target.read_text(), change), public)


def test_another_key_is_refused(conn: Any, plans: Any, keys: tuple[Path, Path], tmp_path: Path) -> None:
    _ledger(conn, plans)
    target = tmp_path / "cp.json"
    _write(conn, keys[0], target)
    (tmp_path / "other").mkdir()
    _, other_public = openssl_key(tmp_path / "other")
    with pytest.raises(checkpoint.CheckpointRefused, match=r"signed by key .* not by the key given"):
        checkpoint.read(target.read_text(), checkpoint.load_public_key(other_public))
    # the key id is not what is trusted: a file claiming the other key's id still fails its signature
    other = checkpoint.load_public_key(other_public)
    claimed = _tampered(target.read_text(), lambda d: d.update(key_id=checkpoint.key_id(other)))
    with pytest.raises(checkpoint.CheckpointRefused, match="the signature does not verify"):
        checkpoint.read(claimed, other)


def test_a_broken_ledger_is_not_signed(
    conn: Any, plans: Any, keys: tuple[Path, Path], tmp_path: Path
) -> None:
    accounts = _ledger(conn, plans)
    tamper(conn, "UPDATE ledger SET actor = 'x' WHERE account_id = %s AND seq = 2", accounts[0])
    target = tmp_path / "cp.json"
    with pytest.raises(checkpoint.LedgerBroken):
        _write(conn, keys[0], target)
    assert list(tmp_path.glob("*cp.json*")) == []  # nothing, not even half a file


def test_key_files(tmp_path: Path, keys: tuple[Path, Path]) -> None:
    public = keys[1]
    with pytest.raises(checkpoint.KeyFileError, match="not an unencrypted private key"):
        checkpoint.load_private_key(public)
    with pytest.raises(checkpoint.KeyFileError, match="No such file"):
        checkpoint.load_private_key(tmp_path / "missing.pem")
    rsa = tmp_path / "rsa.pem"
    subprocess.run(
        ["openssl", "genpkey", "-algorithm", "rsa", "-pkeyopt", "rsa_keygen_bits:1024", "-out", str(rsa)],
        check=True,
        capture_output=True,
    )
    with pytest.raises(checkpoint.KeyFileError, match="not an Ed25519 key"):
        checkpoint.load_private_key(rsa)


def test_the_commands(conn: Any, db_url: str, plans: Any, keys: tuple[Path, Path], tmp_path: Path) -> None:
    accounts = _ledger(conn, plans)
    private, public = keys
    target = tmp_path / "cp.json"

    written = cli(db_url, "ledger", "checkpoint", "--key", str(private), "--output", str(target))
    assert written.returncode == 0, written.stderr
    assert "6 counters, 12 rows" in written.stderr
    to_stdout = cli(db_url, "ledger", "checkpoint", "--key", str(private))
    assert to_stdout.returncode == 0 and json.loads(to_stdout.stdout)["counters_total"] == 6

    ok = cli(db_url, "ledger", "verify", "--checkpoint", str(target), "--public-key", str(public))
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert "signature and digest OK" in ok.stdout and ok.stdout.rstrip().endswith(
        "OK (extends the checkpoint)"
    )
    by_private = cli(db_url, "ledger", "verify", "--checkpoint", str(target), "--key", str(private))
    assert by_private.returncode == 0

    rewrite(conn, accounts[0], METRIC, {1: {"actor": "someone else"}})
    assert cli(db_url, "ledger", "verify").returncode == 0
    caught = cli(db_url, "ledger", "verify", "--checkpoint", str(target), "--public-key", str(public))
    assert caught.returncode == 1
    assert f"account {accounts[0]} urls row" in caught.stdout and "the chain was rewritten" in caught.stdout

    changed = tmp_path / "changed.json"
    changed.write_text(_tampered(target.read_text(), lambda d: d["counters"].pop()))
    refused = cli(db_url, "ledger", "verify", "--checkpoint", str(changed), "--public-key", str(public))
    assert refused.returncode == 1 and "refused: its counters do not match" in refused.stdout

    # bad usage: no key, a key that is not one, --since with --checkpoint
    env_free = cli(db_url, "ledger", "checkpoint")
    assert env_free.returncode != 0 and "LEDGER_CHECKPOINT_KEY" in env_free.stderr
    assert cli(db_url, "ledger", "checkpoint", "--key", str(public)).returncode == 2
    assert (
        cli(
            db_url, "ledger", "verify", "--checkpoint", str(target), "--since", "5", "--key", str(private)
        ).returncode
        == 2
    )
    assert cli(db_url, "ledger", "verify", "--checkpoint", str(target)).returncode != 0

    tamper(conn, "UPDATE ledger SET actor = 'x' WHERE account_id = %s AND seq = 2", accounts[1])
    broken = cli(db_url, "ledger", "checkpoint", "--key", str(private))
    assert broken.returncode == 1 and broken.stdout == "" and "not signed" in broken.stderr


def test_the_daily_task_writes_one_file_a_day(
    app_db_url: str,
    conn: Any,
    plans: Any,
    keys: tuple[Path, Path],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from workers import tasks

    _ledger(conn, plans)
    out = tmp_path / "checkpoints"
    out.mkdir()
    monkeypatch.setenv("DATABASE_URL", app_db_url)  # as the workers run: the service's login role
    monkeypatch.delenv("LEDGER_CHECKPOINT_DIR", raising=False)
    monkeypatch.delenv("LEDGER_CHECKPOINT_KEY", raising=False)
    assert tasks.ledger_checkpoint() == {"status": "skipped"}
    monkeypatch.setenv("LEDGER_CHECKPOINT_DIR", str(out))
    assert tasks.ledger_checkpoint() == {"status": "skipped"}  # a directory but no key
    monkeypatch.setenv("LEDGER_CHECKPOINT_KEY", str(keys[0]))

    first = tasks.ledger_checkpoint(at="2026-12-01T03:25:00+00:00")
    again = tasks.ledger_checkpoint(at="2026-12-01T23:00:00+00:00")
    next_day = tasks.ledger_checkpoint(at="2026-12-02T03:25:00+00:00")

    assert first["status"] == "written" and first["counters"] == 6
    assert again == {"status": "exists"}
    assert next_day["status"] == "written"
    files = sorted(p.name for p in out.iterdir())
    assert files == ["ledger-checkpoint-2026-12-01.json", "ledger-checkpoint-2026-12-02.json"]
    cp = checkpoint.read((out / files[0]).read_text(), checkpoint.load_public_key(keys[1]))
    assert checkpoint.verify_against(conn, cp).ok
