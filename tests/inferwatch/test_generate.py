"""The one golden test of every generated file, and generation without the services' stack.

The other tests of the rules, configs, dashboards and manifests check what they mean; this
one checks that what is committed is what ``make generate`` writes.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

from inferwatch.generate import artifacts, stale, write

ROOT = Path(__file__).resolve().parents[2]
# What the gateway and the drift service run on; generating must not need any of it.
SERVICE_STACK = ("fastapi", "starlette", "opentelemetry", "aiohttp", "uvicorn")


def _differences(files: dict[Path, str]) -> list[str]:
    """Paths (relative to the checkout) whose committed text is not ``files``' or that are stale."""
    differ = [path for path, text in files.items() if not (ROOT / path).is_file() or (ROOT / path).read_text() != text]
    return sorted(str(p) for p in differ + stale(files, ROOT))


def test_committed_files_are_what_make_generate_writes():
    files = artifacts()
    assert not any(path.is_absolute() for path in files)
    kinds = {path.parts[:2] for path in files}
    assert {("alerts", "rules"), ("alerts", "compat"), ("dashboards", "json"), ("deploy", "prometheus"),
            ("deploy", "alertmanager"), ("deploy", "kubernetes")} <= kinds
    assert _differences(files) == [], "stale generated files: run `make generate`"


GENERATE_WITHOUT_THE_STACK = textwrap.dedent("""
    import importlib.abc, json, sys

    class Unimportable(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name.partition(".")[0] in BLOCKED:
                raise ImportError(f"{name} is made unimportable by the test")
            return None

    sys.meta_path.insert(0, Unimportable())
    for name in BLOCKED:
        try:
            __import__(name)
        except ImportError:
            pass
        else:
            raise SystemExit(f"the finder let {name} through")

    from inferwatch.generate import artifacts
    print(json.dumps({str(path): text for path, text in artifacts().items()}))
""")


def test_generation_imports_neither_fastapi_nor_opentelemetry_nor_aiohttp(tmp_path):
    for name in SERVICE_STACK:  # importable here, so the subprocess proves something by lacking them
        __import__(name)
    script = f"BLOCKED = {SERVICE_STACK!r}\n{GENERATE_WITHOUT_THE_STACK}"
    result = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, capture_output=True, text=True,
                            env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}, timeout=120)
    assert result.returncode == 0, result.stderr[-4000:]
    generated = {Path(path): text for path, text in json.loads(result.stdout).items()}
    assert generated == artifacts()
    assert _differences(generated) == []


def test_write_changes_only_what_differs_and_removes_stale_files(tmp_path):
    owned, other = tmp_path / "json", tmp_path / "deploy"
    for folder in (owned, other):
        folder.mkdir()
    same, new, old, kept = owned / "same.json", owned / "new.json", owned / "old.json", other / "notes.txt"
    for path in (same, old, kept):
        path.write_text("before\n")
    os.utime(same, (0, 0))
    rel = {path: path.relative_to(tmp_path) for path in (same, new, old, other / "config.yml")}
    changed = write({rel[same]: "before\n", rel[new]: "after\n", rel[other / "config.yml"]: "x: 1\n"}, tmp_path,
                    folders=[owned.relative_to(tmp_path)])
    assert changed == [rel[new], rel[other / "config.yml"], rel[old]]
    assert same.stat().st_mtime == 0 and new.read_text() == "after\n"
    assert not old.exists() and kept.exists(), "only the generated-only folders are cleaned"

