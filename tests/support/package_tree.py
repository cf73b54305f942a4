"""The package laid out as the wheel lays it out, in symlinks, for tools that cannot follow
setuptools' package-dir map (an editable install's import hook): mypy, and the benchmark's
baseline gateway run from another checkout."""

from __future__ import annotations

import tempfile
import tomllib
from pathlib import Path


def importable(tree: Path, root: Path | None = None) -> Path:
    """A folder from which ``import inferwatch`` loads ``tree``'s code and nothing else: the
    package laid out as the tree's pyproject package-dir maps it, in symlinks. With the tree
    itself first on sys.path, the subpackages that live in top-level folders (serving/,
    drift/, ...) were not in its inferwatch/ and came from this checkout's editable install:
    a baseline gateway ran this checkout's request path."""
    mapping = tomllib.loads((tree / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]
    root = root or Path(tempfile.mkdtemp(prefix="inferwatch-tree-"))
    package = root / "inferwatch"
    package.mkdir()
    for entry in (tree / mapping["inferwatch"]).iterdir():
        (package / entry.name).symlink_to(entry)
    for name, folder in mapping.items():
        if name != "inferwatch":
            root.joinpath(*name.split(".")).symlink_to(tree / folder)
    return root
