"""Query parameters made once in Python and read by Postgres: the plan table's array literals and
the positional form of a long named query. Both round-trip through a real server."""

from __future__ import annotations

import tomllib
from typing import Any

import psycopg

from service.db import Positional
from service.plans import PlanConfig, parse_plans

ODD = parse_plans(
    tomllib.loads(
        """
free_plan = 'free "basic"'
[plans.'free "basic"'.limits]
'a,b' = 3
'c\\d' = "unlimited"
[plans.'pro {x}'.limits]
'a,b' = 500
'c\\d' = 0
'e f' = 7
"""
    )
)


def plan_table(conn: Any, plans: PlanConfig) -> dict[tuple[str, str], int | None]:
    t = plans.limit_table
    rows = conn.execute(
        "SELECT * FROM unnest(%s::text[], %s::text[], %s::bigint[])",
        (t["plan_names"], t["plan_metrics"], t["plan_limits"]),
    ).fetchall()
    return {(p, m): lim for p, m, lim in rows}


def test_the_plan_table_says_what_the_plan_config_says(conn: Any, plans: PlanConfig) -> None:
    for cfg in (plans, ODD):  # the test config, and names with quotes, commas, braces, backslashes
        expected = {(p, m): cfg.limit(p, m) for p in cfg.plans for m in cfg.metrics}
        assert plan_table(conn, cfg) == expected
    assert plan_table(conn, ODD)[('free "basic"', "c\\d")] is None  # unlimited


def test_positional_queries_bind_each_name_once_and_keep_percent_signs(conn: Any) -> None:
    q = Positional.of("SELECT %(a)s::int + %(b)s::int, %(a)s::int, format('%%s%%%%', %(b)s::int)")
    assert q.names == ("a", "b")
    assert q.sql == "SELECT $1::int + $2::int, $1::int, format('%s%%', $2::int)"
    with psycopg.RawCursor(conn) as cur:
        assert q.execute(cur, {"b": 2, "a": 40, "unused": 0}).fetchone() == (42, 40, "2%")
