"""`inferwatch exporter` with bad input: a clean message and exit 2, never a traceback, and
no NVML session opened for an exporter that cannot listen."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.support.sockets import busy_port


def exporter(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "inferwatch", "exporter", *args], capture_output=True, text=True,
                          timeout=60)


def assert_clean_refusal(result: subprocess.CompletedProcess, *words: str) -> None:
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr and "─" not in result.stderr, result.stderr  # nor Rich's box
    for word in words:
        assert word in result.stderr, result.stderr


def test_an_unknown_log_level_is_refused():
    assert_clean_refusal(exporter("--log-level", "bogus", "--port", "0"), "bogus", "debug, info, warning")


@pytest.mark.parametrize("host", ["999.1.1.1", "no-such-host.invalid"])
def test_an_address_that_cannot_be_listened_on_is_refused(host):
    result = exporter("--host", host, "--port", "0")
    assert_clean_refusal(result, f"Cannot listen on {host}:0")
    assert "NVML" not in result.stderr  # refused before the sampler opened NVML


def test_a_port_in_use_is_refused_before_nvml_is_opened():
    with busy_port() as port:
        result = exporter("--host", "127.0.0.1", "--port", str(port))
    assert_clean_refusal(result, f"Cannot listen on 127.0.0.1:{port}", "in use")
    assert "NVML" not in result.stderr
