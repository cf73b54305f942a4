"""The lint and the type check, as `make test` runs them: ruff over the repository and mypy
over the package (strict, except where pyproject's overrides say), with the versions pinned in
the test extra. A finding fails the test with the tool's own report."""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from pathlib import Path

from tests.support.package_tree import importable

ROOT = Path(__file__).resolve().parents[2]


def _run(argv: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=600)


def test_ruff_finds_nothing():
    result = _run([sys.executable, "-m", "ruff", "check", "--no-cache", "."], ROOT)
    assert result.returncode == 0, result.stdout + result.stderr


def test_mypy_finds_nothing(tmp_path):
    tree = importable(ROOT, tmp_path)
    result = _run([sys.executable, "-m", "mypy", "--config-file", str(ROOT / "pyproject.toml"),
                   "--cache-dir", str(ROOT / ".cache" / "mypy"), "-p", "inferwatch"], tree)
    assert result.returncode == 0, result.stdout + result.stderr


def test_mypy_is_strict_where_pyproject_says(tmp_path):
    """The check sees the code and its settings: in the package's own folder (strict), a
    function without annotations and a wrong return type are both findings."""
    tree = importable(ROOT, tmp_path)
    (tree / "inferwatch" / "_lint_probe.py").write_text("def count():\n    return 3\n\n\n"
                                                        "def name() -> int:\n    return 'three'\n")
    result = _run([sys.executable, "-m", "mypy", "--config-file", str(ROOT / "pyproject.toml"),
                   "--cache-dir", str(tmp_path / "cache"), "-m", "inferwatch._lint_probe"], tree)
    assert result.returncode == 1, result.stdout
    assert "_lint_probe.py:1: error: Function is missing a return type annotation" in result.stdout
    assert "_lint_probe.py:6: error: Incompatible return value type" in result.stdout


IGNORE = re.compile(r"# type: ignore(\[[-a-z, ]+\])?(  # \S.*)?$")
IGNORE_CEILING = 42  # a ratchet: lower it when one goes; a new one needs a reason, and room under it


def test_every_type_ignore_names_its_error_and_says_why():
    mapping = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]
    found, bare = 0, []
    for folder in set(mapping.values()):
        for path in sorted((ROOT / folder).rglob("*.py")):
            for number, line in enumerate(path.read_text().splitlines(), 1):
                if "# type: ignore" not in line:
                    continue
                found += 1
                match = IGNORE.search(line)
                if match is None or match[1] is None or match[2] is None:
                    bare.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()}")
    assert bare == [], "a type: ignore needs its error code and a reason on its line:\n" + "\n".join(bare)
    assert 0 < found <= IGNORE_CEILING, f"{found} type: ignore comments, the ceiling is {IGNORE_CEILING}"
