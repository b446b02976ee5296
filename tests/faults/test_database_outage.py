"""Postgres stopped under load and started again, behind a real `quota-ledger serve`: requests are
refused fast with the JSON error while it is down, /readyz answers within a second, and service
resumes within a couple of seconds of its return, with no request failing on a dead pooled
connection afterwards."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.faults.outage import ACCOUNT, call, run_outage, serve_env
from tests.servers import PrivatePostgres, Serve


@pytest.fixture
def server(private_db: str, redis_url: str, tmp_path: Path) -> Iterator[Serve]:
    srv = Serve(serve_env(private_db, redis_url), workers=2, log=tmp_path / "serve.log")
    try:
        yield srv
    finally:
        srv.close()


def test_outage_is_refused_fast_and_service_resumes_fast(
    private_pg: PrivatePostgres, server: Serve, product_key: dict[str, str]
) -> None:
    out = run_outage(private_pg, server.base, headers=product_key, account=ACCOUNT, outage_seconds=4.0)
    log = server.log.read_text(errors="replace")[-3000:]
    summary = out.summary()

    assert out.before and all(c.status == 201 for c in out.before), (summary, log)
    assert out.during, summary
    # every request while the database is down: 503 with the JSON error, within a few seconds
    assert all(c.status == 503 and c.error == "unavailable" for c in out.during), (summary, log)
    assert max(c.took for c in out.during) < 3.0, summary
    # /readyz within a second, saying unavailable
    probes = out.readyz(out.down_at, out.starting_at)
    assert probes and all(c.status == 503 and c.took < 1.0 for c in probes), (summary, probes)
    # back within a couple of seconds, and no request failing on a dead connection after that
    assert out.first_success_after is not None and out.first_success_after < 2.5, (summary, log)
    assert out.last_failure_after < 3.0, summary
    assert call(server.base, "/readyz").status == 200


def test_a_restart_between_requests_costs_no_request(
    private_pg: PrivatePostgres, server: Serve, product_key: dict[str, str]
) -> None:
    """Each worker's pooled connections die with the restart; the pool's check on taking one
    replaces it instead of failing the request with it."""
    path = f"/v1/accounts/{ACCOUNT}/takes"
    for _ in range(20):  # warm both workers' pools
        assert call(server.base, path, body={"metric": "api_calls"}, headers=product_key).status == 201
    private_pg.stop("fast")
    private_pg.start()
    after = [call(server.base, path, body={"metric": "api_calls"}, headers=product_key) for _ in range(20)]
    assert [c.status for c in after] == [201] * 20
