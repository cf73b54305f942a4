"""The docs as a newcomer meets them: the README stays a front page that shows how to start,
the architecture page names every module of the package (so the map cannot go stale
again), and every link and every source path the docs give leads somewhere.

Modules are named by their path in the repository (``serving/proxy.py``), the convention
docs/architecture.md states. The folders walked are the ones pyproject.toml maps into the
package, so a folder mapped later is covered without touching this test.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
DOCS = ROOT / "docs"
ARCHITECTURE = DOCS / "architecture.md"
README_MAX_LINES = 250
SET_UP_COMMANDS = ("make up", "make test")

FENCE = re.compile(r"^(```|~~~).*?^\1[ \t]*$", re.M | re.S)
CODE_SPAN = re.compile(r"(`+)(.+?)\1", re.S)
LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
HEADING = re.compile(r"^#{1,6}[ \t]+(.+?)[ \t#]*$", re.M)
SCHEME = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:")
TOP_FOLDERS = ("inferwatch", "serving", "drift", "alerts", "exporters", "dashboards", "deploy", "tests", "bench")
SOURCE_PATH = re.compile(rf"(?<![\w./-])((?:{'|'.join(TOP_FOLDERS)})/(?:[\w.-]+/)*[\w-]+\.py)(?![\w/])")


def package_modules() -> list[str]:
    """Every module the wheel ships, by its path in the repository."""
    mapping = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]
    return sorted({path.relative_to(ROOT).as_posix() for folder in set(mapping.values())
                   for path in (ROOT / folder).rglob("*.py") if "__pycache__" not in path.parts})


def doc_pages() -> list[Path]:
    return [README, *sorted(DOCS.glob("*.md"))]


def prose(markdown: str) -> str:
    """The text links live in: fenced code blocks and code spans taken out."""
    return CODE_SPAN.sub("", FENCE.sub("", markdown))


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: rendered text, lower case, punctuation dropped, spaces
    to hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading).replace("`", "")
    return re.sub(r"[^\w\- ]", "", text.strip().lower()).replace(" ", "-")


def anchors(markdown: str) -> set[str]:
    """The anchors of a page's headings, numbered as GitHub numbers repeated ones."""
    seen: dict[str, int] = {}
    out = set()
    for heading in HEADING.findall(FENCE.sub("", markdown)):
        base = slug(heading)
        n = seen.get(base, 0)
        seen[base] = n + 1
        out.add(base if n == 0 else f"{base}-{n}")
    return out


def broken_links(page: Path, markdown: str) -> list[str]:
    """Relative links (and images) of ``markdown``, as if it were ``page``, whose file or
    heading does not exist."""
    broken = []
    for target in LINK.findall(prose(markdown)):
        if SCHEME.match(target):
            continue
        path, _, fragment = target.partition("#")
        if not path:
            text = markdown  # a heading of this page
        else:
            resolved = (page.parent / path).resolve()
            if not resolved.exists():
                broken.append(f"{target} (no such file)")
                continue
            text = resolved.read_text() if resolved.suffix == ".md" else None
        if fragment and text is not None and fragment not in anchors(text):
            broken.append(f"{target} (no such heading)")
    return broken


def layout_modules(markdown: str) -> list[str]:
    """The modules the layout tables name: the first cell of each row under '## Layout'."""
    start = re.search(r"^## Layout[ \t]*$", markdown, re.M)
    assert start, "docs/architecture.md has no '## Layout' section"
    layout = re.split(r"^## ", markdown[start.end():], maxsplit=1, flags=re.M)[0]
    return re.findall(r"^\|\s*`([^`]+\.py)`\s*\|", layout, re.M)


def test_readme_is_a_front_page():
    lines = len(README.read_text().splitlines())
    assert lines <= README_MAX_LINES, (
        f"README.md has {lines} lines (at most {README_MAX_LINES}): move the detail to a page under docs/")


@pytest.mark.parametrize("command", SET_UP_COMMANDS)
def test_readme_shows_how_to_set_up(command):
    assert re.search(rf"^{re.escape(command)}\b", README.read_text(), re.M), \
        f"README.md does not show `{command}` as a command line"


def test_readme_leads_to_every_docs_page():
    linked = {(README.parent / target.partition("#")[0]).resolve()
              for target in LINK.findall(prose(README.read_text())) if not SCHEME.match(target)}
    unlinked = [p.name for p in sorted(DOCS.glob("*.md")) if p.resolve() not in linked]
    assert unlinked == [], f"docs pages the README does not link to: {unlinked}"


def test_every_module_of_the_package_is_in_the_architecture_layout():
    named = set(layout_modules(ARCHITECTURE.read_text()))
    missing = [m for m in package_modules() if m not in named]
    assert missing == [], (
        "modules missing from the layout in docs/architecture.md (add a row "
        f"'| `path` | what it holds |' under its folder): {missing}")


def test_the_layout_names_no_module_that_is_gone():
    stale = sorted(set(layout_modules(ARCHITECTURE.read_text())) - set(package_modules()))
    assert stale == [], f"docs/architecture.md's layout names modules that do not exist: {stale}"


@pytest.mark.parametrize("page", doc_pages(), ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_relative_link_leads_somewhere(page):
    assert broken_links(page, page.read_text()) == []


@pytest.mark.parametrize("page", doc_pages(), ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_source_file_the_docs_name_exists(page):
    missing = sorted({p for p in SOURCE_PATH.findall(page.read_text()) if not (ROOT / p).is_file()})
    assert missing == [], f"{page.relative_to(ROOT)} names files that do not exist: {missing}"


def test_the_checks_catch_what_they_should():
    page = DOCS / "example.md"
    text = ("# Set up: `inferwatch up`\n## A/B split, and verdict\n## Set up: `inferwatch up`\n"
            "[ok](architecture.md#layout) [self](#ab-split-and-verdict) [again](#set-up-inferwatch-up-1) "
            "![img](../drift/report-preview.png) [web](https://example.com/x) `[code](nowhere.md)`\n"
            "[gone](nowhere.md) [heading](architecture.md#no-such-heading) [own](#nope)\n"
            "```\n[fenced](nowhere-either.md)\n```\n")
    assert broken_links(page, text) == ["nowhere.md (no such file)", "architecture.md#no-such-heading (no such heading)",
                                        "#nope (no such heading)"]
    assert layout_modules("## Layout\n| module | what |\n| `serving/x.py` | y |\n## Next\n| `a/b.py` | c |\n") \
        == ["serving/x.py"]
    assert SOURCE_PATH.findall("`serving/proxy.py`, python bench/ab_split.py, inferwatch.serving.proxy, "
                               "my/serving/x.py, tests/support/fake_nvml.py") \
        == ["serving/proxy.py", "bench/ab_split.py", "tests/support/fake_nvml.py"]
    assert "serving/proxy.py" in package_modules() and "drift/ab/decision.py" in package_modules()
