"""requirements.lock against pyproject.toml: the services' image installs the lock with
hashes (Dockerfile, `build` stage), so a dependency added or narrowed in pyproject.toml
without `make lock` would ship an image that never saw it. The image build itself (make
test-compose) proves the lock is complete: pip's hash-checking mode refuses any package the
lock does not pin."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

from packaging.markers import Marker, default_environment
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[2]
LOCK = (ROOT / "requirements.lock").read_text()
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
# The Python of the image the lock is installed into: the Dockerfile's pinned base
IMAGE_PYTHON = re.search(r"^ARG PYTHON_IMAGE=python:(\d+\.\d+\.\d+)-", (ROOT / "Dockerfile").read_text(), re.M)[1]
IMAGE = {**default_environment(), "python_full_version": IMAGE_PYTHON,
         "python_version": IMAGE_PYTHON.rsplit(".", 1)[0], "sys_platform": "linux", "platform_system": "Linux",
         "platform_machine": "x86_64", "implementation_name": "cpython", "platform_python_implementation": "CPython"}


def locked() -> dict[str, tuple[str, list[str]]]:
    """Package -> (version, hashes) that the image installs, from the lock's `name==version ;
    marker \\ --hash=...` entries (the universal lock pins some packages once per Python range:
    only the entry whose marker holds for the image's Python counts)."""
    out = {}
    for entry in re.split(r"\n(?=[A-Za-z0-9])", LOCK):
        head = re.match(r"([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s;]+)(?: ; ([^\\\n]+))?", entry)
        if head and (head[3] is None or Marker(head[3].strip()).evaluate(IMAGE)):
            name = canonicalize_name(head[1])
            assert name not in out, f"{name} is locked twice for Python {IMAGE_PYTHON}"
            out[name] = (head[2], re.findall(r"--hash=sha256:([0-9a-f]{64})", entry))
    return out


def requirements() -> list[Requirement]:
    """What the image needs: the project's dependencies and its build backend."""
    return [Requirement(r) for r in (*PYPROJECT["project"]["dependencies"], *PYPROJECT["build-system"]["requires"])]


def test_every_dependency_of_pyproject_is_locked_within_its_specifier():
    pins = locked()
    for req in requirements():
        name = canonicalize_name(req.name)
        assert name in pins, f"{req} is not in requirements.lock: run `make lock`"
        assert req.specifier.contains(pins[name][0], prereleases=True), \
            f"requirements.lock pins {req.name}=={pins[name][0]}, outside {req}: run `make lock`"


def test_every_extra_asked_for_brings_its_packages():
    """uvicorn[standard] and redis[hiredis]: their extras' packages are pinned too."""
    pins = locked()
    for name in ("uvloop", "httptools", "websockets", "hiredis"):
        assert name in pins, name


def test_every_pin_carries_hashes_and_comes_from_pypi_alone():
    pins = locked()
    assert len(pins) > len(requirements())
    assert all(hashes for _, hashes in pins.values()), [n for n, (_, h) in pins.items() if not h]
    assert "--extra-index-url" not in LOCK and "--index-url" not in LOCK.split("\n#", 1)[0]
    assert "make lock" in LOCK.splitlines()[1], "the lock says how it is made"
