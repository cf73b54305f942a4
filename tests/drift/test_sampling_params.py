"""Sampling parameters binned: every bin a declared label, boundaries where the docs say."""

import pytest

from inferwatch.drift.sampling_params import PARAMS, VALUES, sampling_bins


def bins(stream: bool = False, default_max_tokens: bool = False, **payload):
    return sampling_bins(payload, stream=stream, default_max_tokens=default_max_tokens)


@pytest.mark.parametrize("value, label", [(None, "default"), (0, "0"), (0.0, "0"), (0.01, "0-0.5"), (0.5, "0-0.5"),
                                          (0.7, "0.5-1"), (1, "0.5-1"), (1.01, "1-2"), (2, "1-2"), (2.01, "invalid"),
                                          (1e9, "invalid"), ("hot", "invalid"), ("0.7", "0.5-1"), (True, "0.5-1"),
                                          (-1, "invalid"), (float("nan"), "invalid"), ("nan", "invalid"),
                                          ([1], "invalid")])
def test_temperature_as_vllm_takes_it(value, label):
    """vLLM takes temperature in [0, 2], and reads "0.7" and true as numbers (pydantic, lax)."""
    assert bins(temperature=value).temperature == label


@pytest.mark.parametrize("value, label", [(0, "invalid"), (0.1, "0-0.5"), (0.9, "0.5-0.9"), (0.95, "0.9-1"),
                                          (1, "1"), (1.0, "1"), (1.5, "invalid"), (5, "invalid")])
def test_top_p_as_vllm_takes_it(value, label):
    """vLLM takes top_p in (0, 1]."""
    assert bins(top_p=value).top_p == label


@pytest.mark.parametrize("payload, label", [({"max_tokens": 64}, "1-64"), ({"max_tokens": 65}, "65-256"),
                                            ({"max_completion_tokens": 5000}, ">4096"),
                                            ({"max_completion_tokens": 300, "max_tokens": 10}, "257-1024")])
def test_max_tokens_prefers_max_completion_tokens(payload, label):
    assert bins(**payload).max_tokens == label


def test_the_clients_own_limit_only():
    assert bins(default_max_tokens=True, max_tokens=128).max_tokens == "default"


def test_n_tools_format_stream():
    b = bins(stream=True, n=3, tools=[{"type": "function"}], response_format={"type": "json_schema"})
    assert (b.n, b.stream, b.tools, b.response_format) == ("2-4", "true", "true", "json_schema")
    b = bins(n=None, tools=[], response_format={"type": "yaml"})
    assert (b.n, b.tools, b.response_format) == ("1", "false", "other")
    assert bins(response_format="json").response_format == "other"
    assert bins().response_format == "none"


def test_every_bin_is_a_declared_value():
    payloads = [{}, {"temperature": 3, "top_p": 0.1, "max_tokens": 10**6, "n": 9, "functions": [1]},
                {"temperature": "x", "top_p": "y", "max_tokens": "z", "n": "w", "response_format": {"type": "text"}}]
    for payload in payloads:
        for stream in (True, False):
            b = sampling_bins(payload, stream=stream, default_max_tokens=False)
            for param, value in zip(PARAMS, b):
                assert value in VALUES[param], (param, value)
