"""Docs that cannot drift: the tables and the example in README.md and docs/ are checked against the
code they describe. No database: settings, error classes and the chain's canonical form are plain
Python, and the routes come from an app whose pool never connects."""

from __future__ import annotations

import dataclasses
import random
import re
import string
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from service import errors
from service.config import Settings
from service.quota import chain

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
PAGES = [ROOT / "README.md", *sorted(DOCS.rglob("*.md"))]
# The canonical message's fields, in order (service/quota/chain.py, docs/ledger.md).
COLUMNS = ("id", "at", "account_id", "metric", "period", "kind", "units", "used_after", "lim", "take_id")
COLUMNS += ("idempotency_key", "actor")


def marked(page: Path, name: str) -> str:
    """The text between `<!-- name... -->` and the next `<!-- /name -->` (or the end of the fenced
    block that follows, for an example)."""
    text = page.read_text()
    start = re.search(rf"<!-- {re.escape(name)}\b[^>]*-->\n", text)
    assert start, f"{page.relative_to(ROOT)} has no <!-- {name} --> marker"
    rest = text[start.end() :]
    end = rest.find(f"<!-- /{name} -->")
    return rest if end < 0 else rest[:end]


def table_rows(block: str) -> list[list[str]]:
    """The cells of a Markdown table's body rows (header and rule skipped); `\\|` stays inside a cell."""
    rows = [line for line in block.splitlines() if line.startswith("|")]
    return [[c.strip() for c in re.split(r"(?<!\\)\|", row)[1:-1]] for row in rows[2:]]


def first_code(cell: str) -> str:
    found = re.search(r"`([^`]+)`", cell)
    assert found, f"no `code` in table cell {cell!r}"
    return found.group(1)


# --- configuration -----------------------------------------------------------------------------


def test_configuration_table_matches_settings() -> None:
    """Every setting has a row named by its variable, and every row is a setting that is read."""
    rows = table_rows(marked(DOCS / "operations.md", "config-table"))
    documented = [first_code(row[0]) for row in rows]
    assert len(documented) == len(set(documented)), "a variable documented twice"
    settings = {f.name.upper() for f in dataclasses.fields(Settings)}
    assert set(documented) - settings == set(), "documented but not a setting"
    assert settings - set(documented) == set(), "a setting without a row in docs/operations.md"
    for row in rows:
        assert all(row), f"empty cell in {row}"


def test_each_setting_is_read_from_its_variable() -> None:
    """The table's names are the variables `Settings.from_env` reads: each, set alone, changes its
    setting (a setting of a type this test does not know must at least be named in config.py)."""
    # Two values of each type, so that one of them differs from any default.
    samples = {"int": ("7", "9"), "float": ("7.5",), "bool": ("off", "on"), "Path": ("elsewhere.toml",)}
    samples |= {"str": ("x",), "tuple[str, ...]": ("a,b",), "str | None": ("sandbox",)}
    samples |= {"tuple[float, ...]": ("1,2",)}
    base = {"DATABASE_URL": "postgresql://nobody@127.0.0.1:1/none"}
    default = Settings.from_env(base)
    source = (ROOT / "service" / "config.py").read_text()
    for f in dataclasses.fields(Settings):
        name = f.name.upper()
        if name == "DATABASE_URL":
            continue
        values = samples.get(str(f.type))
        if values is None:
            assert f'"{name}"' in source, f"Settings.{f.name} is not read from {name}"
            continue
        changed = [getattr(Settings.from_env({**base, name: v}), f.name) for v in values]
        assert any(c != getattr(default, f.name) for c in changed), f"{name} does not set Settings.{f.name}"


def test_other_variables_are_still_read_where_the_table_says() -> None:
    rows = table_rows(marked(DOCS / "operations.md", "other-variables"))
    sources = [p for p in (ROOT / "service").rglob("*.py")] + [*(ROOT / "workers").rglob("*.py")]
    text = "\n".join(p.read_text() for p in sources) + (ROOT / "docker-compose.yml").read_text()
    settings = {f.name.upper() for f in dataclasses.fields(Settings)}
    for row in rows:
        name = first_code(row[0])
        assert name not in settings, f"{name} is a setting: it belongs in the configuration table"
        assert re.search(rf"\b{name}\b", text), f"{name} is read nowhere any more"


# --- the ledger's hash chain -------------------------------------------------------------------


def chain_example() -> dict[str, Any]:
    block = marked(DOCS / "ledger.md", "chain-example")
    code = re.match(r"```python\n(.*?)\n```", block, re.S)
    assert code, "the chain example is not a ```python block right after its marker"
    scope: dict[str, Any] = {}
    exec(compile(code.group(1), "docs/ledger.md", "exec"), scope)  # its own asserts run here
    return scope


def test_the_chain_example_runs_and_matches_the_service() -> None:
    scope = chain_example()
    example = scope["example"]
    at = datetime(1970, 1, 1, tzinfo=UTC) + timedelta(microseconds=example[1])
    row = SimpleNamespace(
        **dict(
            zip(
                COLUMNS,
                (example[0], at, *example[2:]),
                strict=True,
            )
        )
    )
    assert scope["row_hash"](None, *example) == chain.row_hash(None, row).hex()


def test_the_chain_example_agrees_with_the_service_on_other_rows() -> None:
    """The documented recipe is finance's: it must hash any row as `ledger verify` does, NULLs,
    non-ASCII text and a previous hash included."""
    rng = random.Random(20)
    row_hash = chain_example()["row_hash"]
    prev: bytes | None = None
    for n in range(200):

        def text() -> str | None:
            printable = "".join(rng.choices(string.printable, k=rng.randint(1, 12)))
            return rng.choice([None, "", "é€😀", printable])

        row = SimpleNamespace(
            id=rng.randint(1, 2**62),
            at=datetime(2026, 1, 1, tzinfo=UTC) + timedelta(microseconds=rng.randint(0, 10**14)),
            account_id=text() or "acc",
            metric=rng.choice(["urls", "api_calls"]),
            period="2026-11",
            kind=rng.choice(["take", "release", "reset"]),
            units=rng.randint(0, 10**6),
            used_after=rng.randint(0, 10**6),
            lim=rng.choice([None, rng.randint(0, 10**6)]),
            take_id=rng.choice([None, rng.randint(1, 10**9)]),
            idempotency_key=text(),
            actor=text() or "web",
        )
        fields = (row.id, chain.epoch_us(row.at), row.account_id, row.metric, row.period, row.kind)
        fields += (row.units, row.used_after, row.lim, row.take_id, row.idempotency_key, row.actor)
        expected = chain.row_hash(prev, row)
        assert row_hash(prev.hex() if prev else None, *fields) == expected.hex(), f"row {n}: {row}"
        prev = expected


# --- errors ------------------------------------------------------------------------------------


def error_classes() -> list[type]:
    """Every error class that answers a request: the domain's and the HTTP layer's own."""
    roots: list[type] = [errors.QuotaError]
    try:
        from service.http import errors as http_errors

        roots += [http_errors.ApiError] if hasattr(http_errors, "ApiError") else []
    except ImportError:
        pass
    found: list[type] = []
    todo = [sub for root in roots for sub in root.__subclasses__()]
    while todo:
        cls = todo.pop()
        if cls not in found:
            found.append(cls)
            todo += cls.__subclasses__()
    return found


def test_error_table_matches_the_error_classes() -> None:
    rows = table_rows(marked(DOCS / "api.md", "error-table"))
    documented = {(first_code(row[0]), int(row[1])) for row in rows}
    assert len(documented) == len(rows), "an error documented twice"
    declared = {(cls.code, cls.status) for cls in error_classes()}
    assert declared - documented == set(), "an error class missing from docs/api.md's error table"
    assert documented - declared == set(), "docs/api.md documents an error no class declares"


# --- routes ------------------------------------------------------------------------------------


def _served(*, console: bool) -> set[str]:
    """The API's routes, or the console's (the app with a console key), as `METHOD /path/{arg}`."""
    from service import create_app

    settings = Settings(
        database_url="postgresql://nobody@127.0.0.1:1/none",
        webhook_environment=None,
        console_secret_key="k" * 32,
    )
    app = create_app(settings)
    try:
        return {
            method + " " + re.sub(r"<(?:[a-z]+:)?([a-z_]+)>", r"{\1}", rule.rule)
            for rule in app.url_map.iter_rules()
            if rule.endpoint != "static" and rule.endpoint.startswith("console.") == console
            for method in sorted((rule.methods or set()) - {"HEAD", "OPTIONS"})
        }
    finally:
        app.extensions["quota"].pool.close()


def _documented(page: Path) -> set[str]:
    documented = set()
    for row in table_rows(marked(page, "route-table")):
        for method, path in re.findall(r"`([A-Z]+) (/[^`?]*)", row[0]):
            documented.add(f"{method} {path}")
    return documented


@pytest.mark.parametrize("page, console", [("api.md", False), ("console.md", True)])
def test_every_route_is_documented(page: str, console: bool) -> None:
    served, documented = _served(console=console), _documented(DOCS / page)
    assert served - documented == set(), f"routes missing from docs/{page}"
    assert documented - served == set(), f"docs/{page} documents a route the app does not serve"


# --- links -------------------------------------------------------------------------------------


def anchors(page: Path) -> set[str]:
    """GitHub's heading anchors: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)
    found = set()
    for heading in re.findall(r"^#+ (.+)$", text, re.M):
        slug = re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
        found.add(slug)
    return found


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(page: Path) -> None:
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if re.match(r"[a-z]+:", target):
            continue  # http(s), mailto: not checked here
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        assert dest.exists(), f"{page.relative_to(ROOT)}: link to {target} finds no file"
        where = page.relative_to(ROOT)
        assert ROOT in dest.parents or dest == ROOT, f"{where}: {target} leaves the repository"
        if anchor and dest.suffix == ".md":
            assert anchor in anchors(dest), f"{page.relative_to(ROOT)}: {target}: no such heading"


# --- the folder map ----------------------------------------------------------------------------


def _folder_map() -> str:
    block = marked(ROOT / "README.md", "The folder map")
    return block.split("```")[1]


def test_the_folder_map_names_every_part_of_the_tree() -> None:
    """Every top-level folder of the repository, every package and module of service/ and every
    package of it is in the README's map, so a newcomer finds where a thing lives from the map."""
    text = _folder_map()
    words = set(re.findall(r"[A-Za-z_][\w.-]*/?", text))
    top = {p.name + "/" for p in ROOT.iterdir() if p.is_dir() and not p.name.startswith((".", "_"))}
    top -= {"node_modules/", "build/", "dist/"} | {p.name + "/" for p in ROOT.glob("*.egg-info")}
    service = ROOT / "service"
    parts = {p.name + "/" for p in service.iterdir() if (p / "__init__.py").exists()}
    parts |= {p.name for p in service.glob("*.py") if p.name not in ("__init__.py",)}
    for package in [p for p in service.iterdir() if (p / "__init__.py").exists()]:
        parts |= {f"{q.name}/" for q in package.iterdir() if (q / "__init__.py").exists()}
    missing = sorted(name for name in top | parts if name not in words and name.rstrip("/") not in words)
    assert not missing, f"the README's folder map does not name {missing}"


def test_the_folder_map_names_only_what_exists() -> None:
    """Each file or folder the map names (`name.py`, `name/`) exists somewhere in the tree."""
    text = _folder_map()
    named = set(re.findall(r"\b([A-Za-z_][\w-]*(?:\.py|/))", text))
    tree = {p.name for p in ROOT.rglob("*") if ".venv" not in p.parts and ".git" not in p.parts}
    gone = sorted(n for n in named if n.rstrip("/") not in tree)
    assert not gone, f"the README's folder map names what is not in the tree: {gone}"
