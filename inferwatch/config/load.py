"""``inferwatch.yaml`` → :class:`Settings`, every problem with its line, column and field path.

The YAML is composed into nodes first, so each value keeps where it was written; pydantic's
error locations are then walked down that tree. A key given twice is an error (YAML keeps
the last silently), and so is anything that is not plain data (tags, anchors to objects).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, get_args

import yaml
from pydantic import BaseModel, ValidationError

from inferwatch.config.errors import ConfigError, Problem, SettingsInvalid
from inferwatch.config.settings import PATTERN_HELP, Settings

SCHEMA_URL = "https://inferwatch.dev/schema/inferwatch.schema.json"


def schema() -> dict[str, Any]:
    """The JSON Schema of the file, from the same declaration that validates it."""
    return Settings.model_json_schema(by_alias=True, mode="validation")


def schema_text() -> str:
    return json.dumps(schema(), indent=2, sort_keys=True) + "\n"


def _mark(node: yaml.Node) -> tuple[int, int]:
    return node.start_mark.line + 1, node.start_mark.column + 1


def _find(root: yaml.Node | None, path: tuple[str | int, ...]) -> yaml.Node | None:
    """The deepest node along ``path`` (a key's value; the key itself for a key that is
    wrong, which pydantic reports by its name)."""
    node = root
    for step in path:
        if isinstance(node, yaml.MappingNode):
            pair = next(((k, v) for k, v in node.value if k.value == step), None)
            if pair is None:
                return node
            node = pair[1]
        elif isinstance(node, yaml.SequenceNode) and isinstance(step, int) and 0 <= step < len(node.value):
            node = node.value[step]
        else:
            return node
    return node


def _key_node(root: yaml.Node | None, path: tuple[str | int, ...]) -> yaml.Node | None:
    """For an unknown key: the key itself, so the line is where it is written."""
    parent = _find(root, path[:-1])
    if isinstance(parent, yaml.MappingNode):
        return next((k for k, _ in parent.value if k.value == path[-1]), parent)
    return parent


def _duplicates(node: yaml.Node | None, path: tuple[str | int, ...] = ()) -> list[Problem]:
    out: list[Problem] = []
    if isinstance(node, yaml.MappingNode):
        seen: set[str] = set()
        for key, value in node.value:
            if key.value in seen:
                out.append(Problem((*path, key.value), "given twice (YAML would keep only the last)", *_mark(key)))
            seen.add(key.value)
            out += _duplicates(value, (*path, key.value))
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            out += _duplicates(item, (*path, i))
    return out


def _field_paths(model: type[BaseModel] = Settings, prefix: str = "") -> dict[str, list[str]]:
    """Every field name of the declaration -> the dotted paths it is at (for "did you mean")."""
    out: dict[str, list[str]] = {}
    for name, info in model.model_fields.items():
        key = info.alias or name
        out.setdefault(key, []).append(prefix + key)
        for sub in get_args(info.annotation) or (info.annotation,):
            for inner in get_args(sub) or (sub,):
                if isinstance(inner, type) and issubclass(inner, BaseModel):
                    for k, paths in _field_paths(inner, f"{prefix}{key}.").items():
                        out.setdefault(k, []).extend(paths)
    return out


def _unknown(path: tuple[str | int, ...]) -> str:
    """An unknown field's message, naming where a field of that name does belong."""
    elsewhere = [p for p in _field_paths().get(str(path[-1]), []) if p != ".".join(map(str, path))]
    return f"unknown field (it belongs at {' or '.join(sorted(set(elsewhere)))})" if elsewhere else "unknown field"


def _problem(root: yaml.Node | None, path: tuple[str | int, ...], message: str, unknown_key: bool = False) -> Problem:
    node = _key_node(root, path) if unknown_key else _find(root, path)
    line, column = _mark(node) if node is not None else (None, None)
    return Problem(path, message, line, column)


def parse(text: str, source: str = "inferwatch.yaml") -> Settings:
    """The settings ``text`` declares; raises SettingsInvalid listing every problem found."""
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line, column = (mark.line + 1, mark.column + 1) if mark else (None, None)
        reason = getattr(exc, "problem", None) or str(exc)
        raise SettingsInvalid(source, [Problem((), f"not YAML: {reason}", line, column)]) from None
    problems = _duplicates(root)
    if problems:
        raise SettingsInvalid(source, problems)
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise SettingsInvalid(source, [_problem(root, (), "must be a mapping of sections (models, slos, ...)")])
    try:
        return Settings.model_validate(data)
    except ValidationError as exc:
        out = []
        for error in exc.errors(include_url=False):
            path = tuple(error["loc"])
            message = error["msg"].removeprefix("Value error, ")
            if error["type"] == "extra_forbidden":
                message = _unknown(path)
            elif path[-1:] == ("objective",) and error["type"] in ("less_than", "greater_than"):
                message = f"{message}: a share, e.g. 0.999 for 99.9 %, got {error['input']!r}"
            elif error["type"] == "missing":
                message = "required field missing"
            elif error["type"] == "literal_error" and "input" in error:
                message = f"{message}, got {error['input']!r}"
            elif error["type"] == "string_pattern_mismatch":
                pattern = error.get("ctx", {}).get("pattern", "")
                message = f"{error['input']!r} is not {PATTERN_HELP.get(pattern, 'allowed here: ' + message)}"
            out.append(_problem(root, path, message, unknown_key=error["type"] == "extra_forbidden"))
        raise SettingsInvalid(source, sorted(out, key=lambda p: (p.line or 0, p.column or 0))) from None


def locate(error: ConfigError, text: str, source: str) -> SettingsInvalid:
    """A generator's ConfigError as a problem of the file it came from."""
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError:
        root = None
    return SettingsInvalid(source, [_problem(root, error.path, error.message)])


def read(path: Path) -> tuple[Settings, str]:
    """Settings and text of the file at ``path`` (a missing or unreadable file is a problem too)."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise SettingsInvalid(str(path), [Problem((), f"cannot read it: {exc}")]) from None
    return parse(text, str(path)), text
