"""Webhook benchmark: signed Stripe subscription events posted concurrently to
`quota-ledger serve --workers 4`, against the baseline app.py `POST /take` under gunicorn with the
same worker count, in the same run, on the same Postgres, with the same wrk settings.

    bench/run webhooks [--reps 7] [--wrk "-t2 -c32 -d10s"] [--accounts 10000] [--change-rate 1.0]

Needs DATABASE_URL (any database on the server; this creates the scratch databases bench_wh and
bench_wh_bl, or DB and DB_bl with --db DB), wrk and psql on PATH. Run by hand; it is not a test.

Every delivery is distinct (its own event id), signed with the configured secret just before its
repetition, and newer than anything stored for its subscription, so every request takes the full
path: verify, allowlist, dedupe, store, order, apply (tier and status: billing_set_tier), commit.
Events are `customer.subscription.updated` for one subscription per account, spread uniformly over
--accounts accounts (each starts on Basic, active). --change-rate is the share of events that move
their subscription to another price (basic, pro) or status (active, past_due, trialing), so that the
account's tier or status changes (billing_set_tier: limits and audit rows); the others repeat the
subscription's state, as renewals do. The default, 1.0, is the worst case. The bodies have the
vendored fixture's full shape (about 4 kB).

Prints each repetition, then medians of throughput, p50 and p99 (the acknowledgement latency a
provider sees), and the median of the per-repetition throughput ratios (ours / baseline; target
>= 0.5). Absolute figures move with the machine's load; the ratio is the result.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
BASELINE = HERE / "baseline"
PLANS_FILE = HERE / "webhooks_plans.toml"
LUA = HERE / "webhooks.lua"
# The provider sample `webhooks send-test` sends too (shipped in the package since the dev work of issue 22).
FIXTURE = ROOT / "service" / "webhooks" / "samples" / "stripe" / "customer.subscription.updated.json"
SECRET = "whsec_bench_secret"
PRICES = ("basic_monthly", "pro_monthly")
STATUSES = ("active", "past_due", "trialing")
sys.path.insert(0, str(ROOT))

import psycopg  # noqa: E402
import stripe  # noqa: E402
from common import recreate_database, server, server_urls, wrk_ms, wrk_seconds  # noqa: E402

from service.migrate import migrate  # noqa: E402
from service.plans import load_plans  # noqa: E402
from service.quota import periods  # noqa: E402


@dataclass(frozen=True)
class WrkResult:
    rps: float
    p50_ms: float
    p99_ms: float
    non_2xx: int
    wraps: int
    errors: str

    def __str__(self) -> str:
        bad = f", non-2xx {self.non_2xx}" if self.non_2xx else ""
        wraps = f", REUSED DELIVERIES x{self.wraps}" if self.wraps else ""
        tail = f"{bad}{wraps}{self.errors}"
        return f"{self.rps:,.0f} req/s, p50 {self.p50_ms:.1f} ms, p99 {self.p99_ms:.1f} ms{tail}"


def account_name(i: int) -> str:
    return f"acct-{i}"


def setup(pg: str, accounts: int, db: str = "bench_wh") -> tuple[str, str]:
    """Scratch databases: ours, `db` (migrated; `accounts` accounts on Basic, each with an active
    Stripe subscription stored, as after its first event) and the baseline's, `db`_bl
    (baseline/schema.sql)."""
    ours = recreate_database(pg, db)
    migrate(ours)
    plans = load_plans(PLANS_FILE)
    metrics = list(plans.metrics)
    with psycopg.connect(ours, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO accounts (id, kind, plan, subscription_status)"
            " SELECT 'acct-' || g, 'user', 'basic', 'active' FROM generate_series(1, %s) g",
            (accounts,),
        )
        conn.execute(
            "INSERT INTO quotas (account_id, metric, plan_limit, free_limit, period)"
            " SELECT 'acct-' || g, m.metric, m.lim, m.free, %s"
            "   FROM generate_series(1, %s) g,"
            "        unnest(%s::text[], %s::bigint[], %s::bigint[]) AS m (metric, lim, free)",
            (
                periods.current_period(),
                accounts,
                metrics,
                [plans.limit("basic", m) for m in metrics],
                [plans.limit(plans.free_plan, m) for m in metrics],
            ),
        )
        conn.execute(
            "INSERT INTO subscriptions"
            " (provider, subscription_id, account_id, plan, status, event_at, event_id)"
            " SELECT 'stripe', 'sub_bench_' || g, 'acct-' || g, 'basic', 'active',"
            "        now() - make_interval(secs => %s), 'evt_seed_' || g FROM generate_series(1, %s) g",
            (SEED_AGE, accounts),
        )
        # ... and what that first event left besides: its inbox row and the customer link. A
        # service in use has both tables populated; left empty here, ANALYZE would record them as
        # empty and the planner would pick sequential scans of them for the whole run.
        conn.execute(
            "INSERT INTO webhook_events (provider, event_id, type, occurred_at, status, account_id,"
            "                            subscription_id, customer_id, payload, processed_at)"
            " SELECT 'stripe', 'evt_seed_' || g, 'customer.subscription.created',"
            "        now() - make_interval(secs => %s), 'applied', 'acct-' || g, 'sub_bench_' || g,"
            "        'cus_bench_' || g, %s::json, now()"
            "   FROM generate_series(1, %s) g",
            (SEED_AGE, FIXTURE.read_text(), accounts),
        )
        conn.execute(
            "INSERT INTO customer_links (provider, customer_id, account_id, event_id)"
            " SELECT 'stripe', 'cus_bench_' || g, 'acct-' || g, 'evt_seed_' || g"
            "   FROM generate_series(1, %s) g",
            (accounts,),
        )
        conn.execute("VACUUM ANALYZE")
    base = recreate_database(pg, f"{db}_bl")
    subprocess.run(
        ["psql", "-q", "-v", "ON_ERROR_STOP=1", "-f", str(BASELINE / "schema.sql"), base],
        check=True,
        capture_output=True,
    )
    return ours, base


STATES = [(price, status) for price in PRICES for status in STATUSES]


# The deliveries' `created` starts this long ago (seconds; 60 days hold 5 million events), and the
# seeded first events are older still.
HISTORY = 60 * 86_400
SEED_AGE = HISTORY + 86_400


class Deliveries:
    """Signed `customer.subscription.updated` deliveries, each with a new event id and a `created`
    newer than every earlier one, so each applies. With probability `change_rate` an event moves
    its subscription to another (price, status), which changes the account's tier or status
    (billing_set_tier writes its limits); otherwise it repeats the subscription's state, as a renewal
    does."""

    def __init__(self, accounts: int, change_rate: float, prefix: str = "evt_bench") -> None:
        self.accounts, self.change_rate, self.prefix = accounts, change_rate, prefix
        self.event = json.loads(FIXTURE.read_text())
        self.event["data"].pop("previous_attributes", None)
        self.seq = 0
        # In the past, advancing a second per event: an event time more than an hour after its
        # receipt is not applied (issue 11), and a run signs far more than 3,600 events.
        self.created = int(time.time()) - HISTORY
        self.state = dict.fromkeys(range(1, accounts + 1), ("basic_monthly", "active"))

    def next_body(self) -> str:
        """The next event's JSON body: a new id, `created` one second later."""
        self.seq += 1
        self.created += 1
        a = random.randint(1, self.accounts)
        if random.random() < self.change_rate:
            self.state[a] = random.choice([s for s in STATES if s != self.state[a]])
        price, status = self.state[a]
        event, sub = self.event, self.event["data"]["object"]
        event.update(id=f"{self.prefix}_{self.seq}", created=self.created)
        sub.update(
            id=f"sub_bench_{a}",
            customer=f"cus_bench_{a}",  # one Stripe customer per account, as in life
            status=status,
            metadata={"account_id": account_name(a)},
        )
        item = sub["items"]["data"][0]
        item["price"].update(id=f"price_{price}", lookup_key=price)
        item["plan"].update(id=f"price_{price}")
        return json.dumps(event, separators=(",", ":"))

    def write(self, path: Path, n: int) -> None:
        signed_at = int(time.time())
        with open(path, "w") as out:
            for _ in range(n):
                body = self.next_body()
                header = stripe.WebhookSignature.generate_signature_header(body, SECRET, timestamp=signed_at)
                out.write(f"{header}\t{body}\n")


def run_wrk(url: str, wrk_args: list[str], script: Path, *script_args: str) -> WrkResult:
    cmd = ["wrk", *wrk_args, "--latency", "-s", str(script), url, "--", *script_args]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout

    def find(pattern: str) -> str:
        m = re.search(pattern, out, re.M)
        if not m:
            raise RuntimeError(f"unexpected wrk output:\n{out}")
        return m.group(1)

    non = re.search(r"Non-2xx or 3xx responses:\s+(\d+)", out)
    wraps = re.search(r"^Wraps: (\d+)", out, re.M)
    err = re.search(r"Socket errors:.*", out)
    return WrkResult(
        rps=float(find(r"Requests/sec:\s+([0-9.]+)")),
        p50_ms=wrk_ms(find(r"^\s+50%\s+(\S+)")),
        p99_ms=wrk_ms(find(r"^\s+99%\s+(\S+)")),
        non_2xx=int(non.group(1)) if non else 0,
        wraps=int(wraps.group(1)) if wraps else 0,
        errors=f", {err.group(0)}" if err else "",
    )


def wrk_threads(wrk_args: list[str]) -> int:
    for i, a in enumerate(wrk_args):
        v = a[2:] if a.startswith("-t") and len(a) > 2 else (wrk_args[i + 1] if a == "-t" else None)
        if v:
            return int(v)
    return 2


def wait_ready(url: str, timeout: float = 30) -> None:
    deadline = time.time() + timeout
    while True:
        try:
            with urllib.request.urlopen(url, timeout=2):
                return
        except urllib.error.HTTPError:
            return  # it answers
        except (urllib.error.URLError, ConnectionError, TimeoutError) as e:
            if time.time() > deadline:
                raise RuntimeError(f"{url} not ready: {e}") from None
        time.sleep(0.3)


def inbox_counts(url: str) -> dict[str, int]:
    with psycopg.connect(url, autocommit=True) as conn:
        return dict(conn.execute("SELECT status, count(*) FROM webhook_events GROUP BY 1").fetchall())


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reps", type=int, default=7, help="repetitions; the ratio is their median")
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--wrk", default="-t2 -c32 -d10s", help="wrk settings, the same for both servers")
    ap.add_argument("--accounts", type=int, default=10_000)
    ap.add_argument(
        "--change-rate",
        type=float,
        default=1.0,
        help="share of events that change their subscription's price or status (1.0: every one)",
    )
    ap.add_argument("--max-rate", type=int, default=4000, help="deliveries signed per second of a run")
    ap.add_argument("--port", type=int, default=8111, help="ours on PORT, the baseline on PORT+1")
    ap.add_argument(
        "--db",
        default="bench_wh",
        help="scratch database names (DB and DB_bl), so runs on a shared server do not collide",
    )
    ap.add_argument(
        "--log",
        default=str(Path(tempfile.gettempdir()) / "webhooks_bench.log"),
        help="server output goes here",
    )
    args = ap.parse_args(argv)
    pg, redis_url = server_urls(ap)
    print(f"setting up {args.db} and {args.db}_bl ...", flush=True)
    ours_db, base_db = setup(pg, args.accounts, args.db)
    wrk_args = shlex.split(args.wrk)
    threads, seconds = wrk_threads(wrk_args), wrk_seconds(wrk_args)
    log = Path(args.log)
    ours_url, base_url = f"http://127.0.0.1:{args.port}", f"http://127.0.0.1:{args.port + 1}"
    py = sys.executable
    ours_env = {
        **os.environ,
        "DATABASE_URL": ours_db,
        "REDIS_URL": redis_url,
        "PLANS_FILE": str(PLANS_FILE),
        "STRIPE_WEBHOOK_SECRETS": SECRET,
        "WEBHOOK_ENVIRONMENT": "any",  # as measured before it was required: every event applied
    }
    ours_env.pop("PROMETHEUS_MULTIPROC_DIR", None)  # serve makes its own
    base_env = {**os.environ, "DATABASE_URL": base_db}
    ours_cmd = [py, "-m", "service.cli", "serve", "--bind", ours_url[7:], "--workers", str(args.workers)]
    base_cmd = [py, "-m", "gunicorn", "-w", str(args.workers), "-b", base_url[7:], "app:app"]
    deliveries = Deliveries(args.accounts, args.change_rate)
    runs: list[tuple[WrkResult, WrkResult]] = []
    with tempfile.TemporaryDirectory(prefix="bench-wh-") as tmp, ExitStack() as stack:
        file = Path(tmp) / "deliveries.txt"
        stack.enter_context(server(ours_cmd, cwd=ROOT, env=ours_env, log=log))
        stack.enter_context(server(base_cmd, cwd=BASELINE, env=base_env, log=log))
        wait_ready(ours_url + "/healthz")
        wait_ready(base_url + "/noop")
        warm = [a for a in wrk_args if not a.startswith("-d")] + ["-d3s"]
        deliveries.write(file, args.max_rate * 3)
        run_wrk(ours_url, warm, LUA, str(file), str(threads))  # every worker connected, code warm
        run_wrk(base_url + "/take", warm, BASELINE / "post.lua")
        for rep in range(args.reps):
            got: dict[str, WrkResult] = {}
            for side in ("baseline", "ours") if rep % 2 == 0 else ("ours", "baseline"):
                if side == "ours":
                    deliveries.write(file, int(args.max_rate * seconds))  # signed now: within 300 s
                    got[side] = run_wrk(ours_url, wrk_args, LUA, str(file), str(threads))
                else:
                    got[side] = run_wrk(base_url + "/take", wrk_args, BASELINE / "post.lua")
            runs.append((got["baseline"], got["ours"]))
            print(
                f"rep {rep + 1}: ours {got['ours']}; baseline {got['baseline']}; "
                f"ratio {got['ours'].rps / got['baseline'].rps:.2f}",
                flush=True,
            )
    med = statistics.median
    ours_runs, base_runs = [o for _, o in runs], [b for b, _ in runs]
    print(f"inbox after the runs: {inbox_counts(ours_db)}")
    for name, rs in (("ours", ours_runs), ("baseline", base_runs)):
        print(
            f"median {name}: {med(r.rps for r in rs):,.0f} req/s, "
            f"p50 {med(r.p50_ms for r in rs):.1f} ms, p99 {med(r.p99_ms for r in rs):.1f} ms"
        )
    print(f"median ratio ours/baseline: {med(o.rps / b.rps for b, o in runs):.2f} (target >= 0.5)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
