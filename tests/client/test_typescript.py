"""The TypeScript client (clients/typescript) against this service: its own test run (node's test
runner, `npm test`) with the real service on a socket behind FlakyProxy, as the Python client's
contract tests have it (tests/client/conftest.py), so the same contract tests run on the service
and on the package's InMemoryQuota, and its types are checked against the service's /openapi.json.

The node tests reach the service through the proxy (QUOTA_TEST_URL) with a product key
(QUOTA_TEST_API_KEY), and set up what is not under test through a control server of this test
(QUOTA_TEST_CONTROL): the proxy's plan (refuse, drop, stall), overrides and soft deletes, as
ServiceBackend does. Skips, saying why, where node or npm is missing."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import psycopg
import pytest

from service import vocabulary as v
from service.http.schemas import fields, requests
from service.quota import features, periods, takes
from tests.client.conftest import PLANS
from tests.client.proxy import FlakyProxy
from tests.db.helpers import set_override, soft_delete

PACKAGE = Path(__file__).resolve().parents[2] / "clients" / "typescript"
NODE, NPM = shutil.which("node"), shutil.which("npm")


def _node_major() -> int:
    if NODE is None:
        return 0
    version = subprocess.run([NODE, "--version"], capture_output=True, text=True, check=True).stdout
    return int(version.strip().lstrip("v").split(".")[0])


pytestmark = pytest.mark.skipif(
    NODE is None or NPM is None or _node_major() < 18,
    reason="the TypeScript client's tests need node >= 18 and npm on PATH",
)


def _free_plan() -> dict[str, Any]:
    """tests/plans.toml's free plan in the shape of the node tests' FREE_PLAN (test/backend.ts)."""
    free = PLANS.plans[PLANS.free_plan]
    return {
        "limits": dict(free.limits),
        "metrics": {m: {"reset": k.reset} if k.reset else {"kind": k.kind} for m, k in PLANS.kinds.items()},
        "features": {f: f in free.features for f in PLANS.features},
    }


def _vocabulary() -> dict[str, Any]:
    """The service's words and bounds that the TypeScript fake copies (its VOCABULARY), as
    tests/client/test_vocabulary.py holds the Python fake's."""
    return {
        "accountKinds": [str(k) for k in v.AccountKind],
        "accountId": v.ACCOUNT_ID_PATTERN,
        "accountIdRule": v.ACCOUNT_ID_RULE,
        "releaseReasons": [str(r) for r in v.ReleaseReason],
        "limitSources": [str(s) for s in v.LimitSource],
        "noSubscription": str(v.SubscriptionStatus.NONE),
        "metricKinds": [str(k) for k in v.MetricKind],
        "resets": [str(r) for r in v.ResetInterval],
        "held": periods.HELD,
        "usagePeriod": periods.MONTH_OR_DAY_RE.pattern,
        "maxUnits": fields.MAX_UNITS,
        "maxLines": takes.MAX_LINES,
        "maxItems": requests.MAX_ITEMS,
        "lineSeparator": fields.LINE_SEPARATOR,
    }


class Control:
    """What the node tests' ServiceBackend asks for, each a POST of a JSON object to /<action>."""

    def __init__(self, proxy: FlakyProxy, conn: psycopg.Connection[Any]) -> None:
        self.proxy, self.conn = proxy, conn
        self.lock = threading.Lock()  # one connection, requests from several threads

    def act(self, action: str, body: dict[str, Any]) -> dict[str, Any]:
        plans: dict[str, Callable[[int], None]] = {
            "refuse": self.proxy.refuse_next,
            "drop": self.proxy.drop_next,
            "stall": self.proxy.stall_next,
        }
        if action in plans:
            plans[action](int(body["count"]))
        elif action == "reset":
            self.proxy.reset()
        elif action == "stats":
            return {"requests": self.proxy.requests, "dropped": self.proxy.dropped}
        else:
            with self.lock:
                self._database(action, body)
        return {}

    def _database(self, action: str, body: dict[str, Any]) -> None:
        if action == "set_limit":
            set_override(self.conn, body["account_id"], body["metric"], body["limit"])
        elif action == "delete":
            soft_delete(self.conn, body["account_id"])
        elif action == "set_feature":
            who = {"account_id": body["account_id"], "feature": body["feature"], "actor": "test"}
            if body["enabled"] is None:
                features.clear_override(self.conn, PLANS, **who)
            else:
                features.set_override(self.conn, PLANS, enabled=bool(body["enabled"]), **who)
        else:
            raise KeyError(action)


@pytest.fixture
def control(_proxy: FlakyProxy, service_db: str) -> Iterator[str]:
    with psycopg.connect(service_db, autocommit=True) as conn:
        handler = Control(_proxy, conn)

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(length) or b"{}")
                try:
                    answer, status = handler.act(self.path.strip("/"), body), 200
                except Exception as error:  # the node test reports it
                    answer, status = {"error": repr(error)}, 500
                data = json.dumps(answer).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
        thread.start()
        try:
            yield f"http://127.0.0.1:{server.server_port}"
        finally:
            server.shutdown()
            thread.join(5)
            server.server_close()


def _npm(
    *args: str, env: dict[str, str] | None = None, timeout: float = 600
) -> subprocess.CompletedProcess[str]:
    assert NPM is not None
    return subprocess.run(
        [NPM, *args], cwd=PACKAGE, env=env, capture_output=True, text=True, timeout=timeout, check=False
    )


def test_the_typescript_client_against_the_service_and_its_fake(
    live_service: str, _proxy: FlakyProxy, product_key: str, control: str
) -> None:
    if not (PACKAGE / "node_modules").is_dir():
        installed = _npm("ci")
        assert installed.returncode == 0, installed.stdout + installed.stderr
    built = _npm("run", "build")
    assert built.returncode == 0, built.stdout + built.stderr
    env = {
        **os.environ,
        "QUOTA_TEST_URL": _proxy.url,
        "QUOTA_TEST_SERVICE_URL": live_service,
        "QUOTA_TEST_CONTROL": control,
        "QUOTA_TEST_API_KEY": product_key,
        "QUOTA_TEST_FREE_PLAN": json.dumps(_free_plan()),
        "QUOTA_TEST_VOCABULARY": json.dumps(_vocabulary()),
    }
    ran = _npm("test", env=env)
    out = ran.stdout + ran.stderr
    assert ran.returncode == 0, out
    # The service side ran (not only the fake's), and so did the check against /openapi.json.
    assert "contract (service)" in out and "openapi" in out, out
    assert "# fail 0" in out and "# skipped 0" in out, out
