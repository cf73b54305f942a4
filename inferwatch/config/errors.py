"""A settings problem with the place it is at: what ``inferwatch validate`` prints."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Problem:
    path: tuple[str | int, ...]  # the field, as keys and list indices
    message: str
    line: int | None = None  # 1-based, where the file says it (None: no file, or nowhere in it)
    column: int | None = None

    @property
    def dotted(self) -> str:
        return ".".join(str(p) for p in self.path) or "(top level)"

    def render(self, source: str) -> str:
        where = f"{source}:{self.line}:{self.column}" if self.line is not None else source
        return f"{where}: {self.dotted}: {self.message}"


class ConfigError(ValueError):
    """Settings that validate field by field but not as a whole (an unknown alert name, an
    SLO no model holds): raised by the generators with the path of the field at fault."""

    def __init__(self, path: tuple[str | int, ...], message: str) -> None:
        super().__init__(message)
        self.path = path
        self.message = message


class SettingsInvalid(ValueError):
    """Every problem of one file, in the order they occur in it."""

    def __init__(self, source: str, problems: list[Problem]) -> None:
        self.source = source
        self.problems = problems
        super().__init__("\n".join(p.render(source) for p in problems))
