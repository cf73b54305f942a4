"""The compose run's measurements (image sizes, build times, time to healthy, time to a
page), printed after pytest's summary: recorded once per run, never asserted on."""

from __future__ import annotations

MEASURED: list[str] = []


def pytest_terminal_summary(terminalreporter) -> None:
    if MEASURED:
        terminalreporter.write_sep("-", "compose run")
        for line in MEASURED:
            terminalreporter.write_line(line)
