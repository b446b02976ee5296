"""The console's pages. Each view reads or changes through the functions the JSON API's views call
(service/quota, service/billing; service/http/finance.py's CSV export): no rule or query of its own.

Reading is for admin and finance sessions alike; changing (the account forms, a replay) for admin
ones: any other POST is 403, and so is one without the session's CSRF token, before anything runs."""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable
from datetime import date
from typing import Any, ParamSpec, TypeVar

import psycopg
import psycopg_pool
import redis
from flask import Blueprint, Response, abort, current_app, g, redirect, render_template, request, url_for
from werkzeug.exceptions import HTTPException
from werkzeug.wrappers import Response as BaseResponse

from service import webhooks
from service.billing import delivery, inbox, standing
from service.console import plot
from service.console.sessions import COOKIE, LOGIN_COOKIE, PATH, Session, Sessions, same
from service.errors import QuotaError
from service.http import ledger_csv
from service.http.auth import key_owner
from service.http.errors import Answer, ValidationFailed
from service.http.inbound import ascii_id
from service.http.runtime import runtime
from service.http.schemas import requests as rq
from service.http.validation import account_id, load
from service.keys import hash_key
from service.plans import PlanConfig
from service.quota import accounts, admin, chain, grants, history, ledger, overrides, periods
from service.vocabulary import InboxStatus, MetricKind, Provider, Role

bp = Blueprint(
    "console",
    __name__,
    url_prefix=PATH,
    template_folder="templates",
    static_folder="static",
    static_url_path="/static",
)
P = ParamSpec("P")
R = TypeVar("R")
ROLES = (Role.ADMIN, Role.FINANCE)
PAGE = 50
# No script at all, nothing from elsewhere, forms only to the console itself, never in a frame.
CSP = (
    "default-src 'none'; style-src 'self'; img-src 'self'; form-action 'self'; "
    "frame-ancestors 'none'; base-uri 'none'"
)
_OPEN = {"console.login", "console.static"}


def sessions() -> Sessions:
    s: Sessions = current_app.extensions["console"]
    return s


def session() -> Session:
    s: Session = g.console_session
    return s


@bp.before_request
def _signed_in() -> BaseResponse | None:
    if request.endpoint in _OPEN:
        return None
    s = sessions().load(request.cookies.get(COOKIE))
    if s is None and request.method == "POST":
        abort(403, "not signed in, or the session has ended: sign in again")
    if s is None:
        return _to_login("expired" if request.cookies.get(COOKIE) else None)
    owner = key_owner(bytes.fromhex(s.key_hash))
    if owner is None or owner.role not in ROLES:
        sessions().end(s)
        return _to_login("revoked")
    g.console_session = s
    if request.method == "POST" and not same(request.form.get("csrf_token"), s.csrf):
        abort(403, "the form's CSRF token is missing or not this session's: reload the page")
    return None


def _to_login(why: str | None) -> BaseResponse:
    resp = redirect(url_for("console.login", why=why) if why else url_for("console.login"))
    resp.delete_cookie(COOKIE, path=PATH)
    return resp


@bp.context_processor
def _context() -> dict[str, Any]:
    return {"me": g.get("console_session")}


@bp.after_request
def _headers(resp: Response) -> Response:
    resp.headers["Content-Security-Policy"] = CSP
    resp.headers["X-Content-Type-Options"] = "nosniff"
    resp.headers["Referrer-Policy"] = "no-referrer"
    if request.endpoint != "console.static":
        resp.headers["Cache-Control"] = "no-store"
    return resp


def admin_only(view: Callable[P, R]) -> Callable[P, R]:
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        if not session().admin:
            abort(403, "only an admin may change this")
        return view(*args, **kwargs)

    wrapper.__name__ = view.__name__
    wrapper.__doc__ = view.__doc__
    return wrapper


def _error_page(status: int, message: str) -> tuple[str, int]:
    return render_template("error.html", status=status, message=message), status


@bp.errorhandler(QuotaError)
@bp.errorhandler(Answer)
def _refused(e: QuotaError | Answer) -> tuple[str, int]:
    fields = e.details.get("fields") if isinstance(e, ValidationFailed) else None
    detail = "; ".join(f"{k}: {' '.join(v)}" for k, v in (fields or {}).items())
    return _error_page(e.status, f"{e.message} ({detail})" if detail else e.message)


@bp.errorhandler(HTTPException)
def _http(e: HTTPException) -> tuple[str, int]:
    return _error_page(e.code or 500, e.description or e.name)


@bp.errorhandler(psycopg.OperationalError)
@bp.errorhandler(psycopg_pool.PoolTimeout)
@bp.errorhandler(redis.RedisError)
def _unavailable(e: Exception) -> tuple[str, int]:
    current_app.logger.warning("console: unavailable: %s", e)
    return _error_page(503, "the database or Redis is unavailable; retry later")


# --- signing in and out


@bp.route("/login", methods=["GET", "POST"])
def login() -> BaseResponse | tuple[str, int] | str:
    """The login form: an API key of role admin or finance."""
    s = sessions()
    message, status = _WHY.get(request.args.get("why", ""), ""), 200
    if request.method == "POST":
        expected = s.login_token_of(request.cookies.get(LOGIN_COOKIE))
        if expected is None or not same(request.form.get("csrf_token"), expected):
            abort(403, "the login form's CSRF token is missing or stale: reload the page")
        key = request.form.get("api_key", "").strip()
        digest = hash_key(key)
        owner = key_owner(digest) if key else None
        if owner is None:
            message, status = "Unknown, revoked or expired API key.", 401
        elif owner.role not in ROLES:
            message, status = f"A {owner.role} key cannot sign in here: use an admin or finance key.", 403
        else:
            earlier = s.load(request.cookies.get(COOKIE))
            if earlier is not None:  # signing in again ends the session the browser held
                s.end(earlier)
            _, signed = s.create(key_hash=digest, name=owner.name, role=owner.role)
            resp = redirect(url_for("console.account_list"))
            resp.set_cookie(COOKIE, signed, **_cookie_flags())
            resp.delete_cookie(LOGIN_COOKIE, path=PATH)
            return resp
    # The token of a login form still open in another tab stays valid: reuse it.
    token = s.login_token_of(request.cookies.get(LOGIN_COOKIE))
    fresh = None
    if token is None:
        token, fresh = s.login_token()
    resp = Response(render_template("login.html", csrf=token, message=message), status)
    if fresh is not None:
        resp.set_cookie(LOGIN_COOKIE, fresh, **_cookie_flags(max_age=3600))
    return resp


_WHY = {
    "expired": "Your session has ended (idle, or signed out). Sign in again.",
    "revoked": "The key of your session is no longer accepted. Sign in again with a live key.",
    "out": "Signed out.",
}


def _cookie_flags(max_age: int | None = None) -> dict[str, Any]:
    return {
        "path": PATH,
        "httponly": True,
        "samesite": "Strict",
        "secure": request.is_secure,
        "max_age": max_age,
    }


@bp.post("/logout")
def logout() -> BaseResponse:
    sessions().end(session())
    resp = redirect(url_for("console.login", why="out"))
    resp.delete_cookie(COOKIE, path=PATH)
    return resp


@bp.get("/")
def home() -> BaseResponse:
    return redirect(url_for("console.account_list"))


# --- accounts


@bp.get("/accounts")
def account_list() -> str:
    """Accounts by id prefix, Stripe customer or plan, in id order, PAGE at a time."""
    # No control characters (PostgreSQL text refuses NUL): such a search finds nothing.
    q = _printable(request.args.get("q", "").strip()[:255]) or None
    by = request.args.get("by", "id")
    after = _printable(request.args.get("after", "")[:255])
    rt = runtime()
    criteria = {"prefix": q if by == "id" else None, "customer_id": q if by == "customer" else None}
    criteria["plan"] = q if by == "plan" else None
    with rt.connection() as conn:
        found = accounts.search(conn, after=after, limit=PAGE, **criteria)
    more = found[-1].id if len(found) == PAGE else None
    return render_template(
        "accounts.html", found=found, q=q or "", by=by, after=after, more=more, plans=list(rt.plans.plans)
    )


def _printable(text: str) -> str:
    """`text` without its control characters (C0, DEL, C1)."""
    return "".join(c for c in text if c.isprintable() or c == " ")


@bp.get("/accounts/<id>")
def account_page(id: str) -> str:
    return _account_page(account_id(id))


def _account_page(id: str, *, message: str | None = None, error: str | None = None) -> str:
    rt = runtime()
    today = periods.now().date()
    with rt.connection() as conn:
        view = accounts.get_account(conn, rt.plans, account_id=id)
        account_grants = grants.list_grants(conn, account_id=id)
        why = standing.standing(conn, account_id=id)
        rows = ledger.recent(conn, account_id=id, limit=50)
        plots = []
        for m in view.limits:
            first, last = plot.window(m.kind, m.reset, today)
            days = history.daily_usage(conn, account_id=id, metric=m.metric, first=first, last=last)
            start = _period_start(m.counter_period, today)
            plots.append(plot.plot(m.metric, days, limit=m.limit, current_start=start))
    return render_template(
        "account.html",
        a=view,
        why=why,
        rows=rows,
        plots=plots,
        resettable=[m.metric for m in view.limits if m.kind != "allocation"],
        grantable=[m.metric for m in view.limits if m.kind == MetricKind.CONSUMABLE],
        grants=account_grants,
        # a new key per form shown: a form sent twice (a double click, a reload) grants once
        grant_key=f"console-{uuid.uuid4()}",
        message=_DONE.get(request.args.get("done", ""), message),
        error=error,
    )


def _period_start(period: str, today: date) -> date | None:
    if period == periods.HELD:
        return None
    if periods.is_day(period):
        return date.fromisoformat(period)
    return periods.period_start(period).date() if periods.is_period(period) else today


_DONE = {
    "override": "Override saved.",
    "cleared": "Override cleared.",
    "reset": "Counter reset.",
    "deleted": "Account deleted (soft): takes are refused until it is restored.",
    "restored": "Account restored.",
    "granted": "Credits granted.",
    "voided": "Grant voided: what was left of it is forfeited.",
}


def _form_metric(plans: PlanConfig) -> str:
    """The metric the form names (UnknownMetric if the plan config has none of that name)."""
    metric = request.form.get("metric", "")
    accounts.require_metric(plans, metric)
    return metric


def _done(id: str, what: str) -> BaseResponse:
    return redirect(url_for("console.account_page", id=id, done=what), code=303)


@bp.post("/accounts/<id>/override")
@admin_only
def override(id: str) -> BaseResponse:
    """Set (limit, or blank for unlimited) or clear a metric's sticky override."""
    rt = runtime()
    id, metric = account_id(id), _form_metric(rt.plans)
    with rt.connection() as conn:
        if request.form.get("action") == "clear":
            overrides.clear_override(conn, rt.plans, account_id=id, metric=metric, actor=session().name)
            return _done(id, "cleared")
        raw = request.form.get("limit", "").strip()
        # ASCII digits only: isdigit() takes "²" and full-width digits
        digits = ascii_id(raw) if raw else None
        if raw and digits is None:
            raise ValidationFailed("the limit is a whole number, or blank for unlimited", fields={})
        limit = load(rq.OVERRIDE_PUT, {"limit": digits})["limit"]
        overrides.set_override(
            conn, rt.plans, account_id=id, metric=metric, limit=limit, actor=session().name
        )
    return _done(id, "override")


@bp.post("/accounts/<id>/reset")
@admin_only
def reset(id: str) -> BaseResponse:
    """An admin reset of a counter's current period (as POST /v1/admin/accounts/{id}/reset)."""
    rt = runtime()
    id, metric = account_id(id), _form_metric(rt.plans)
    with rt.connection() as conn:
        admin.reset_counter(
            conn, rt.plans, account_id=id, metric=metric, actor=session().name, period=rt.plans.period(metric)
        )
    return _done(id, "reset")


@bp.post("/accounts/<id>/grant")
@admin_only
def grant(id: str) -> BaseResponse:
    """Grant credits (as POST /v1/admin/accounts/{id}/grants), checked by the API's own schema."""
    rt = runtime()
    id = account_id(id)
    form = request.form
    units = ascii_id(form.get("units", "").strip())
    if units is None:
        raise ValidationFailed("units: a whole number of at least 1", fields={"units": ["a whole number"]})
    expires = form.get("expires_at", "").strip()
    if len(expires) == len("YYYY-MM-DDTHH:MM"):  # the form's datetime-local has no offset: UTC, as it says
        expires += ":00+00:00"
    body = load(
        rq.GRANT_REQUEST,
        {
            "metric": form.get("metric", ""),
            "units": units,
            "expires_at": expires or None,
            "note": form.get("note", "").strip() or None,
            "idempotency_key": form.get("idempotency_key", ""),
        },
    )
    with rt.connection() as conn:
        grants.admin_grant(conn, rt.plans, account_id=id, actor=session().name, **body)
    return _done(id, "granted")


@bp.post("/accounts/<id>/grants/<grant_id>/void")
@admin_only
def void(id: str, grant_id: str) -> BaseResponse:
    """Void a grant of this account forward-only (as POST /v1/admin/grants/{id}/void)."""
    id = account_id(id)
    number = ascii_id(grant_id)
    if number is None:
        abort(404)
    with runtime().connection() as conn:
        grants.grant_of(conn, account_id=id, grant_id=number)  # UnknownGrant: not this account's
        grants.void_grant(conn, grant_id=number, account_id=id, actor=session().name)
    return _done(id, "voided")


@bp.post("/accounts/<id>/delete")
@admin_only
def delete(id: str) -> BaseResponse:
    with runtime().connection() as conn:
        admin.soft_delete(conn, account_id=account_id(id), actor=session().name)
    return _done(id, "deleted")


@bp.post("/accounts/<id>/restore")
@admin_only
def restore(id: str) -> BaseResponse:
    with runtime().connection() as conn:
        admin.restore(conn, account_id=account_id(id), actor=session().name)
    return _done(id, "restored")


# --- the ledger


def _period_arg() -> str:
    """The period asked for (the API's PeriodQuery checks it), else the current month."""
    period: str = load(rq.PERIOD_QUERY, {"period": request.args.get("period") or periods.current_period()})[
        "period"
    ]
    return period


@bp.get("/ledger")
def ledger_page() -> str:
    """A period's reconciliation; the chain's verify when asked (it walks the whole ledger)."""
    period = _period_arg()
    rt = runtime()
    with rt.connection() as conn:
        check = ledger.reconcile(conn, period=period)
        verified = chain.verify(conn) if request.args.get("verify") else None
    return render_template("ledger.html", period=period, check=check, verified=verified)


@bp.get("/ledger.csv")
def ledger_download() -> Response:
    return ledger_csv.response(_period_arg())


# --- the webhook inbox


@bp.get("/events")
def event_list() -> str:
    # the API's EventsQuery checks the filters; empty ones are none
    args = load(rq.EVENTS_QUERY, {k: v for k, v in request.args.items() if k in ("status", "provider") and v})
    status, provider = args.get("status"), args.get("provider")
    after = ascii_id(request.args.get("after", "0")) or 0
    with runtime().connection() as conn:
        rows = inbox.page(conn, after=after, limit=PAGE, status=status, provider=provider)
    more = rows[-1].id if len(rows) == PAGE else None
    return render_template(
        "events.html",
        rows=rows,
        status=status or "",
        provider=provider or "",
        more=more,
        statuses=list(InboxStatus),
        providers=list(Provider),
    )


def _event_id(inbox_id: str) -> int:
    number = ascii_id(inbox_id)
    if number is None:
        abort(404, f"no stored webhook event has id {inbox_id!r}")
    return number


@bp.get("/events/<inbox_id>")
def event_page(inbox_id: str) -> str:
    number = _event_id(inbox_id)
    with runtime().connection() as conn:
        event = inbox.get(conn, number)
        body = inbox.payload(conn, number)
    return render_template(
        "event.html", e=event, payload=_pretty(body), replayed=request.args.get("replayed") == "1"
    )


def _pretty(body: str) -> str:
    try:
        return json.dumps(json.loads(body), indent=2, ensure_ascii=False)
    except ValueError:
        return body


@bp.post("/events/<inbox_id>/replay")
@admin_only
def replay(inbox_id: str) -> BaseResponse:
    """Apply a stored event again (as POST /v1/admin/events/{id}/replay)."""
    number = _event_id(inbox_id)
    rt = runtime()
    with rt.connection() as conn:
        translate_for = webhooks.translators(rt.settings.webhook_environment)
        delivery.replay(conn, rt.plans, number, translate_for=translate_for, actor=session().name)
    return redirect(url_for("console.event_page", inbox_id=number, replayed=1), code=303)


# --- the audit log


@bp.get("/audit")
def audit_page() -> str:
    raw = request.args.get("account_id", "").strip()
    account = account_id(raw) if raw else None
    after = ascii_id(request.args.get("after", "0")) or 0
    with runtime().connection() as conn:
        rows = ledger.audit_page(conn, after=after, limit=PAGE, account_id=account)
    more = rows[-1]["id"] if len(rows) == PAGE else None
    return render_template("audit.html", rows=rows, account_id=raw, more=more)
