"""Gateway settings: environment, flags, validation."""

import pytest
from pydantic import ValidationError

from inferwatch.serving.settings import GatewaySettings


def test_defaults_follow_the_design_ports():
    s = GatewaySettings()
    assert (s.host, s.port, s.upstream_url) == ("127.0.0.1", 8080, "http://127.0.0.1:8000")
    assert s.otlp_endpoint is None and s.api_keys == []


def test_environment_is_read(monkeypatch):
    monkeypatch.setenv("INFERWATCH_GATEWAY_PORT", "9999")
    monkeypatch.setenv("INFERWATCH_GATEWAY_API_KEYS", "k1, k2,")
    monkeypatch.setenv("INFERWATCH_GATEWAY_UPSTREAM_URL", "http://vllm:8000/")
    s = GatewaySettings()
    assert s.port == 9999
    assert [k.get_secret_value() for k in s.api_keys] == ["k1", "k2"]
    assert s.upstream_url == "http://vllm:8000"


def test_flags_override_environment(monkeypatch):
    monkeypatch.setenv("INFERWATCH_GATEWAY_PORT", "9999")
    assert GatewaySettings(port=7000).port == 7000


def test_keys_are_not_shown_in_repr():
    assert "s3cret" not in repr(GatewaySettings(api_keys="s3cret"))


@pytest.mark.parametrize("field, value", [
    ("port", 0), ("port", 70000), ("upstream_url", "vllm:8000"), ("trace_sample_ratio", 1.5),
    ("otlp_protocol", "thrift"), ("max_body_bytes", 10), ("variant", ""), ("unknown_field", 1),
])
def test_invalid_settings_are_refused_with_the_field_named(field, value):
    with pytest.raises(ValidationError) as info:
        GatewaySettings(**{field: value})
    assert field in str(info.value)


def test_settings_are_frozen():
    s = GatewaySettings()
    with pytest.raises(ValidationError):
        s.port = 1
