"""Console sessions: a signed cookie that names a session kept in Redis, and its CSRF token.

The cookie holds only a random session id, signed with CONSOLE_SECRET_KEY (itsdangerous, as Flask's
own sessions) and dated, so that it cannot be forged and is refused after MAX_AGE whatever Redis
says. The session itself is a Redis key with the key's hash, name and role and the CSRF token,
whose time to live is the idle time (CONSOLE_IDLE_MINUTES), renewed by every request: idle sessions
end by themselves, and logout deletes the key, so the old cookie names nothing. Redis rather than a
table: it is there already (Celery's broker), a write per console request stays off the database
(on Citus a table of sessions would be a reference table, written on every node), and expiry
needs no job. A session's key is checked again through the API's key cache on every request
(service/http/auth.key_owner), so a revoked key ends it within KEY_CACHE_SECONDS.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import secrets
from dataclasses import asdict, dataclass

import redis
from itsdangerous import BadSignature, URLSafeTimedSerializer

from service.config import Settings

COOKIE = "ql_console"
LOGIN_COOKIE = "ql_console_login"  # the login form's CSRF token, before there is a session
PATH = "/console"
MAX_AGE = 12 * 3600  # a session ends after 12 hours however busy
_PREFIX = "quota-ledger:console:session:"


@dataclass(frozen=True, kw_only=True)
class Session:
    sid: str
    key_hash: str  # hex of service.keys.hash_key(the API key): never the key itself
    name: str
    role: str
    csrf: str

    @property
    def admin(self) -> bool:
        return self.role == "admin"


def same(a: str | None, b: str) -> bool:
    """Constant-time comparison of a submitted token with the expected one."""
    return a is not None and hmac.compare_digest(a.encode(), b.encode())


class Sessions:
    def __init__(self, settings: Settings) -> None:
        self.idle_seconds = max(int(settings.console_idle_minutes * 60), 1)
        self._signer = URLSafeTimedSerializer(settings.console_secret_key, salt="quota-ledger-console")
        self._login_signer = URLSafeTimedSerializer(settings.console_secret_key, salt="quota-ledger-login")
        self._redis = redis.Redis.from_url(settings.redis_url, socket_timeout=2, socket_connect_timeout=2)

    @staticmethod
    def _key(sid: str) -> str:
        return _PREFIX + hashlib.sha256(sid.encode()).hexdigest()

    def create(self, *, key_hash: bytes, name: str, role: str) -> tuple[Session, str]:
        """A new session and its cookie's value."""
        session = Session(
            sid=secrets.token_urlsafe(32),
            key_hash=key_hash.hex(),
            name=name,
            role=role,
            csrf=secrets.token_urlsafe(32),
        )
        self._redis.set(self._key(session.sid), json.dumps(asdict(session)), ex=self.idle_seconds)
        return session, self._signer.dumps(session.sid)

    def load(self, cookie: str | None) -> Session | None:
        """The live session the cookie names, its idle time renewed; None for a missing, forged, too
        old, idle-expired or logged-out one."""
        if not cookie:
            return None
        try:
            sid = self._signer.loads(cookie, max_age=MAX_AGE)
        except BadSignature:  # SignatureExpired included
            return None
        key = self._key(str(sid))
        # GET then EXPIRE (a no-op on a missing key) rather than GETEX, which needs Redis 6.2
        pipe = self._redis.pipeline(transaction=False)
        pipe.get(key)
        pipe.expire(key, self.idle_seconds)
        raw, _ = pipe.execute()
        if raw is None:
            return None
        return Session(**json.loads(raw))

    def end(self, session: Session) -> None:
        self._redis.delete(self._key(session.sid))

    def login_token(self) -> tuple[str, str]:
        """A token for the login form, and the signed cookie that carries it."""
        token = secrets.token_urlsafe(32)
        return token, self._login_signer.dumps(token)

    def login_token_of(self, cookie: str | None) -> str | None:
        if not cookie:
            return None
        try:
            return str(self._login_signer.loads(cookie, max_age=3600))
        except BadSignature:
            return None
