"""Views never import other views (issue 20): a view module (one that defines a Blueprint) takes what
it shares with another from a module that is not a view, so that each can change alone."""

from __future__ import annotations

import ast
from pathlib import Path

HTTP = Path(__file__).resolve().parents[2] / "service" / "http"
# None left: the webhook-environment policy is billing's (delivery.for_environment), applied by the
# adapters' registry (service.webhooks.translators).
KNOWN: set[tuple[str, str]] = set()


def _imports(tree: ast.Module) -> set[str]:
    """The service.http modules a module imports, by their short names."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            if node.module == "service.http":
                names |= {alias.name for alias in node.names}
            elif node.module.startswith("service.http."):
                names.add(node.module.split(".")[2])
        elif isinstance(node, ast.Import):
            names |= {a.name.split(".")[2] for a in node.names if a.name.startswith("service.http.")}
    return names


def test_views_never_import_other_views() -> None:
    trees = {p.stem: ast.parse(p.read_text()) for p in HTTP.glob("*.py") if p.stem != "__init__"}
    views = {name for name, tree in trees.items() if "Blueprint(" in ast.unparse(tree)}
    assert {"accounts", "admin", "events", "finance", "health", "webhooks"} <= views
    found = {(view, other) for view in views for other in _imports(trees[view]) & views if other != view}
    assert found == KNOWN


def test_the_console_takes_nothing_from_the_api_views() -> None:
    """The console (service/console/) calls what the API's views call, from the modules they take it
    from; it imports no view module of service/http/."""
    trees = {p.stem: ast.parse(p.read_text()) for p in HTTP.glob("*.py") if p.stem != "__init__"}
    views = {name for name, tree in trees.items() if "Blueprint(" in ast.unparse(tree)}
    console = HTTP.parent / "console"
    for path in console.glob("*.py"):
        assert _imports(ast.parse(path.read_text())) & views == set(), path.name
