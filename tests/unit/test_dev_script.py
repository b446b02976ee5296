"""`scripts/dev` installs the package only when the project's dependencies changed, so that a built
.venv starts with no package index reachable. Run on a copy of the project whose .venv holds a
`python` and a `quota-ledger` that only write down how they were called."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FAKE = """#!/bin/sh
echo "$(basename "$0") $*" >>"$(dirname "$0")/calls"
"""


def _run(project: Path) -> list[str]:
    calls = project / ".venv" / "bin" / "calls"
    calls.unlink(missing_ok=True)
    env = dict(os.environ, PIP_NO_INDEX="1", PIP_INDEX_URL="http://127.0.0.1:9/simple")
    out = subprocess.run(["sh", "scripts/dev", "--bind", "127.0.0.1:1"], cwd=project, env=env, timeout=30)
    assert out.returncode == 0
    return calls.read_text().splitlines()


def test_dev_installs_once_and_again_only_when_dependencies_change(tmp_path: Path) -> None:
    for name in ("scripts/dev", "pyproject.toml", "requirements.lock"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / name, tmp_path / name)
    bin_dir = tmp_path / ".venv" / "bin"
    bin_dir.mkdir(parents=True)
    for exe in ("python", "quota-ledger"):
        (bin_dir / exe).write_text(FAKE)
        (bin_dir / exe).chmod(0o755)

    def installs(calls: list[str]) -> int:
        return sum("pip install" in c for c in calls)

    first = _run(tmp_path)
    assert installs(first) == 1 and first[-1] == "quota-ledger dev --bind 127.0.0.1:1"
    second = _run(tmp_path)
    assert installs(second) == 0 and second[-1] == "quota-ledger dev --bind 127.0.0.1:1"
    with open(tmp_path / "pyproject.toml", "a") as f:
        f.write("\n# a changed dependency\n")
    assert installs(_run(tmp_path)) == 1
