"""The inferwatch command: help for every command, and settings errors that say what to fix."""

import os
import subprocess
import sys

import pytest

from tests.support.sockets import busy_port


def run(*args, timeout=60):
    return subprocess.run([sys.executable, "-m", "inferwatch", *args], capture_output=True, text=True,
                          timeout=timeout)


@pytest.mark.parametrize("command, must_mention", [
    ((), ["up", "gateway", "vllm", "model", "exporter", "drift"]),
    (("up",), ["--model", "--vllm-port", "--gateway-port", "--exporter-port", "--drift-port", "--otlp-endpoint"]),
    (("gateway",), ["--upstream-url", "--variant", "--otlp-endpoint", "INFERWATCH_GATEWAY"]),
    (("vllm",), ["--model", "--otlp-endpoint", "--startup-timeout"]),
    (("model", "build"), ["--cache-dir", "--force"]),
    (("exporter",), ["--port", "--interval", "--processes", "--slow-interval"]),
    (("drift", "serve"), ["--port", "--db-path", "--window", "--prometheus-url"]),
    (("drift", "report"), ["--url", "--out", "--model"]),
])
def test_help_explains_every_command(command, must_mention):
    result = run(*command, "--help")
    assert result.returncode == 0, result.stderr
    for word in must_mention:
        assert word in result.stdout, word


@pytest.mark.parametrize("args, field", [
    (["--port", "0"], "port"),
    (["--upstream-url", "localhost:8000"], "upstream_url"),
    (["--trace-sample-ratio", "2"], "trace_sample_ratio"),
])
def test_gateway_refuses_bad_settings_with_the_field_named(args, field):
    result = run("gateway", *args)
    assert result.returncode == 2
    assert "Invalid gateway settings" in result.stderr and field in result.stderr


def test_exporter_refuses_bad_settings():
    result = run("exporter", "--interval", "0")
    assert result.returncode == 2 and "interval_s" in result.stderr


def test_gateway_reads_environment_errors_too():
    result = subprocess.run([sys.executable, "-m", "inferwatch", "gateway"], capture_output=True, text=True,
                            timeout=60, env={**__import__("os").environ, "INFERWATCH_GATEWAY_OTLP_PROTOCOL": "udp"})
    assert result.returncode == 2 and "otlp_protocol" in result.stderr


def test_up_refuses_ports_in_use_before_starting_anything(tmp_path):
    with busy_port() as port:
        result = subprocess.run([sys.executable, "-m", "inferwatch", "up", "--model", str(tmp_path / "none"),
                                 "--vllm-port", str(port), "--run-dir", str(tmp_path)],
                                capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    assert "ports are in use" in result.stderr and f"127.0.0.1:{port}/health" in result.stderr
    assert not (tmp_path / "vllm.log").exists()


def test_up_refuses_an_unreadable_or_empty_pagerduty_key_file(tmp_path):
    empty = tmp_path / "key"
    empty.write_text("\n")
    for path, message in ((tmp_path / "missing", "Cannot read the PagerDuty routing key file"), (empty, "is empty")):
        result = subprocess.run([sys.executable, "-m", "inferwatch", "up", "--model", str(tmp_path / "none"),
                                 "--pagerduty-routing-key-file", str(path), "--run-dir", str(tmp_path)],
                                capture_output=True, text=True, timeout=60)
        assert result.returncode == 2 and message in result.stderr, result.stderr


@pytest.mark.parametrize(("args", "env", "message"), [
    (["--heartbeat-url", "hc-ping.com/abc"], {}, "--heartbeat-url must be an http(s) URL"),
    ([], {"INFERWATCH_HEARTBEAT_URL": "ftp://x/y"}, "--heartbeat-url must be an http(s) URL"),
    (["--config", "{tmp}/bad.yaml"], {}, "bad.yaml:1:48: links.grafana_url: 'grafana:3000' is not an http:// or https:// URL"),
    ([], {"INFERWATCH_CONFIG": "{tmp}/bad.yaml"}, "bad.yaml:1:48: links.grafana_url"),
    (["--config", "{tmp}/missing.yaml"], {}, "missing.yaml: (top level): cannot read it"),
])
def test_up_refuses_bad_alerting_settings_before_starting_anything(tmp_path, args, env, message):
    (tmp_path / "bad.yaml").write_text("links: {grafana_url: 3000, grafana_url: x}\n".replace(
        "{grafana_url: 3000, grafana_url: x}", "{runbook_url: 'https://a', grafana_url: 'grafana:3000'}"))
    args = [a.format(tmp=tmp_path) for a in args]
    env = {k: v.format(tmp=tmp_path) for k, v in env.items()}
    result = subprocess.run([sys.executable, "-m", "inferwatch", "up", "--model", str(tmp_path / "none"), *args,
                             "--run-dir", str(tmp_path)], capture_output=True, text=True, timeout=60,
                            env={**os.environ, **env})
    assert result.returncode == 2 and message in result.stderr, result.stderr
    assert not (tmp_path / "vllm.log").exists()


def test_gateway_refuses_a_broken_limits_file_and_key_id_names_keys(tmp_path):
    bad = tmp_path / "limits.yml"
    bad.write_text("default_key: {requests_per_minute: many}\n")
    result = run("gateway", "--limits-file", str(bad), "--port", "1")
    assert result.returncode == 2 and "default_key.requests_per_minute" in result.stderr + result.stdout
    assert "Traceback" not in result.stderr
    from inferwatch.serving.admission import key_id

    assert run("key-id", "s3cret").stdout.strip() == key_id("s3cret") != "s3cret"
