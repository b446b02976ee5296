"""The rule at the top of service/db.py: a query lives in the .sql file beside the module that runs
it, named like it, and only that module runs it."""

from __future__ import annotations

import re
from pathlib import Path

from service.db import load_queries

SERVICE = Path(__file__).resolve().parents[2] / "service"


def _query_files() -> list[Path]:
    return [p for p in SERVICE.rglob("*.sql") if "migrations" not in p.relative_to(SERVICE).parts]


def test_every_query_file_sits_beside_its_module():
    files = _query_files()
    assert len(files) >= 8
    for sql in files:
        assert sql.with_suffix(".py").exists(), f"{sql.relative_to(SERVICE)} has no module beside it"


def test_only_its_module_runs_a_query():
    uses: dict[str, set[str]] = {}
    for py in [*SERVICE.rglob("*.py"), *(SERVICE.parent / "workers").rglob("*.py")]:
        if py == SERVICE / "db.py":  # the loader, whose docstring names examples
            continue
        for name in re.findall(r"\bQ\.(\w+)", py.read_text()):
            uses.setdefault(name, set()).add(str(py.relative_to(SERVICE.parent)))
    for sql in _query_files():
        owner = str(sql.with_suffix(".py").relative_to(SERVICE.parent))
        for name in load_queries(sql):
            others = uses.get(name, set()) - {owner}
            assert not others, f"{name} ({sql.name}) is run from {others}: call a function of {owner}"
