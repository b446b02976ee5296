"""Signed checkpoints of the ledger: what every counter's chain held at a moment, signed with a key
the database never holds, so that a later rewrite of history shows even when it is consistent.

The hash chain (service/quota/chain.py) finds a row changed behind the writers' back, but not a
whole chain rewritten by someone who can also recompute its hashes and move its head (the tables'
owner, a superuser). A checkpoint closes that: it states each counter's row count, last position
and last hash, and one digest over all of them, signed with an Ed25519 private key kept away from
the database (as transparency logs sign their tree heads). `verify_against` then proves that the
ledger still extends it: every checkpointed row is still at its position with its hash, and the
chain from it to today's head verifies. A checkpoint is only signed over a ledger that verifies.
The file format and the threat model: docs/ledger-checkpoints.md.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import os
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, Any, cast

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from service.db import Connection
from service.quota import chain

VERSION = 1
# Prepended to the signed statement, so that a signature over a checkpoint can mean nothing else.
DOMAIN = b"quota-ledger ledger checkpoint\n"


class KeyFileError(Exception):
    """The key file cannot be used: unreadable, or not an Ed25519 key in PEM."""


class CheckpointRefused(Exception):
    """The checkpoint file cannot be trusted: malformed, its counters do not match its digest, or
    its signature does not verify with the key given (changed, or signed by another key)."""


class LedgerBroken(Exception):
    """The ledger does not verify, so no checkpoint was signed over it."""

    def __init__(self, result: chain.Verification) -> None:
        super().__init__(f"{result.breaks} break(s) in {result.broken_accounts} account(s)")
        self.result = result


def _load_pem(path: Path, load: Callable[[bytes], object], what: str, kind: type[Any]) -> Any:
    """The Ed25519 key `load` reads from the PEM file at `path`; KeyFileError naming what is wrong."""
    try:
        key = load(path.read_bytes())
    except OSError as e:
        raise KeyFileError(f"{path}: {e.strerror or e}") from None
    except (ValueError, TypeError) as e:
        raise KeyFileError(f"{path}: not {what} in PEM ({e})") from None
    if not isinstance(key, kind):
        raise KeyFileError(f"{path}: not an Ed25519 key")
    return key


def load_private_key(path: Path) -> Ed25519PrivateKey:
    """An Ed25519 private key in PEM (PKCS#8, as `openssl genpkey -algorithm ed25519` writes it)."""
    return cast(
        Ed25519PrivateKey,
        _load_pem(
            path,
            lambda data: serialization.load_pem_private_key(data, password=None),
            "an unencrypted private key",
            Ed25519PrivateKey,
        ),
    )


def load_public_key(path: Path) -> Ed25519PublicKey:
    """An Ed25519 public key in PEM (`openssl pkey -in KEY -pubout`)."""
    return cast(
        Ed25519PublicKey, _load_pem(path, serialization.load_pem_public_key, "a public key", Ed25519PublicKey)
    )


def key_id(key: Ed25519PublicKey) -> str:
    """Which key signed: the first 16 hex digits of sha256 of the raw 32-byte public key."""
    raw = key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return hashlib.sha256(raw).hexdigest()[:16]


def counter_entry(head: chain.Head) -> dict[str, Any]:
    """A counter as the file lists it."""
    return {
        "account_id": head.account_id,
        "metric": head.metric,
        "rows": head.rows,
        "seq": head.seq,
        "hash": head.hash.hex(),
    }


def _digested(entry: dict[str, Any]) -> bytes:
    """What the digest covers of one counter: its five fields in the ledger's canonical form."""
    return chain.fields(entry["account_id"], entry["metric"], entry["rows"], entry["seq"], entry["hash"])


def statement(header: dict[str, Any]) -> bytes:
    """The signed bytes: DOMAIN, then the header (every field but `signature` and `counters`, which
    the digest covers) as JSON with sorted keys, no spaces, ASCII only."""
    fields = {k: header[k] for k in ("version", "created_at", "key_id", "counters_total", "rows", "digest")}
    return DOMAIN + json.dumps(fields, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode()


@dataclass(frozen=True, kw_only=True)
class Written:
    """A checkpoint taken: its time, counters, rows and digest (hex)."""

    created_at: str
    counters: int
    rows: int
    digest: str
    path: Path | None = None

    @property
    def message(self) -> str:
        where = f" into {self.path}" if self.path else ""
        return (
            f"ledger checkpoint {self.created_at}: {self.counters:,} counters, {self.rows:,} rows, "
            f"digest {self.digest[:16]}…{where}"
        )

    def as_dict(self) -> dict[str, object]:
        return {
            "status": "written",
            "created_at": self.created_at,
            "counters": self.counters,
            "rows": self.rows,
            "digest": self.digest,
            "path": str(self.path) if self.path else None,
        }


def write(
    conn: Connection,
    key: Ed25519PrivateKey,
    out: IO[str],
    *,
    on_progress: Callable[[int], None] | None = None,
    on_finding: Callable[[chain.Finding], None] | None = None,
) -> Written:
    """Walk the whole ledger (chain.verify) and, if it verifies, write a signed checkpoint of every
    counter's head to `out`; if it does not, raise LedgerBroken and write nothing. The counters are
    spooled to a temporary file during the walk, so this process holds none of them."""
    digest = hashlib.sha256()
    counters = 0
    with tempfile.TemporaryFile("w+", encoding="utf-8") as spool:

        def add(head: chain.Head) -> None:
            nonlocal counters
            entry = counter_entry(head)
            digest.update(_digested(entry))
            spool.write(
                ("," if counters else "") + json.dumps(entry, ensure_ascii=True, separators=(",", ":"))
            )
            counters += 1

        created = datetime.now(UTC)
        result = chain.verify(conn, on_progress=on_progress, on_finding=on_finding, on_counter=add)
        if not result.ok:
            raise LedgerBroken(result)
        header: dict[str, Any] = {
            "version": VERSION,
            "created_at": created.isoformat(timespec="microseconds").replace("+00:00", "Z"),
            "key_id": key_id(key.public_key()),
            "counters_total": counters,
            "rows": result.rows,
            "digest": digest.hexdigest(),
        }
        header["signature"] = base64.b64encode(key.sign(statement(header))).decode()
        # The header first, then the counters: a reader sees what it is before the long list.
        out.write(json.dumps(header, indent=1)[:-2] + ',\n "counters": [\n')
        spool.seek(0)
        while chunk := spool.read(1 << 20):
            out.write(chunk)
        out.write("\n ]\n}\n")
    return Written(
        created_at=header["created_at"], counters=counters, rows=result.rows, digest=header["digest"]
    )


@contextmanager
def _replacing(path: Path) -> Iterator[IO[str]]:
    """A file written beside `path` and moved onto it once complete, so that no reader (nor a
    crash) ever sees half a checkpoint."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_file(conn: Connection, key: Ed25519PrivateKey, path: Path, **kwargs: Any) -> Written:
    """`write` into `path`, whole or not at all."""
    with _replacing(path) as f:
        written = write(conn, key, f, **kwargs)
    return replace(written, path=path)


def daily_path(directory: Path, at: datetime) -> Path:
    return directory / f"ledger-checkpoint-{at.astimezone(UTC):%Y-%m-%d}.json"


def write_daily(
    conn: Connection, key: Ed25519PrivateKey, directory: Path, *, at: datetime | None = None
) -> Written | None:
    """The day's checkpoint into `directory` (ledger-checkpoint-YYYY-MM-DD.json, UTC), once: None
    when that file exists already, so a task run twice writes one."""
    path = daily_path(directory, at or datetime.now(UTC))
    if path.exists():
        return None
    return write_file(conn, key, path)


@dataclass(frozen=True, kw_only=True)
class Checkpoint:
    """A checkpoint whose digest and signature have been checked."""

    created_at: str
    key_id: str
    rows: int
    counters: dict[tuple[str, str], tuple[int, bytes]]  # (account, metric) -> (seq, hash)


def read(text: str, key: Ed25519PublicKey) -> Checkpoint:
    """Parse a checkpoint and prove it: its counters against its digest, its signature with `key`.
    Raises CheckpointRefused naming what does not hold."""
    try:
        doc = json.loads(text)
        if not isinstance(doc, dict):
            raise CheckpointRefused("not a JSON object")
        if doc.get("version") != VERSION:
            raise CheckpointRefused(f"version {doc.get('version')!r}, where {VERSION} is understood")
        header = {k: doc[k] for k in ("version", "created_at", "key_id", "counters_total", "rows", "digest")}
        entries = doc["counters"]
        signature = base64.b64decode(doc["signature"], validate=True)
        digest = hashlib.sha256()
        counters: dict[tuple[str, str], tuple[int, bytes]] = {}
        for entry in entries:
            digest.update(_digested(entry))
            counters[(entry["account_id"], entry["metric"])] = (
                int(entry["seq"]),
                bytes.fromhex(entry["hash"]),
            )
    except CheckpointRefused:
        raise
    except (ValueError, KeyError, TypeError, binascii.Error) as e:
        raise CheckpointRefused(f"malformed ({type(e).__name__}: {e})") from None
    if header["key_id"] != key_id(key):
        raise CheckpointRefused(f"signed by key {header['key_id']}, not by the key given ({key_id(key)})")
    try:
        key.verify(signature, statement(header))
    except InvalidSignature:
        raise CheckpointRefused(
            "the signature does not verify: the checkpoint was changed after it was signed"
        ) from None
    if digest.hexdigest() != header["digest"] or len(entries) != header["counters_total"]:
        raise CheckpointRefused("its counters do not match its signed digest: the list was changed")
    return Checkpoint(
        created_at=header["created_at"], key_id=header["key_id"], rows=header["rows"], counters=counters
    )


def verify_against(
    conn: Connection,
    checkpoint: Checkpoint,
    *,
    account_id: str | None = None,
    on_progress: Callable[[int], None] | None = None,
    on_finding: Callable[[chain.Finding], None] | None = None,
) -> chain.Verification:
    """The whole walk (chain.verify), with each checkpointed row pinned: a row at its checkpointed
    position with another hash, or gone, is a finding besides every break of the walk itself."""
    pinned = checkpoint.counters
    if account_id is not None:
        pinned = {k: v for k, v in pinned.items() if k[0] == account_id}
    return chain.verify(
        conn, account_id=account_id, pinned=pinned, on_progress=on_progress, on_finding=on_finding
    )
