"""Values a broken upstream sends are held to the feature record's ranges where they enter
the gateway: one out-of-range record would make the drift service refuse its whole batch."""

import pytest

from inferwatch.drift.feature_record import LOGPROB, TOKENS
from inferwatch.serving.sse import StreamAccount, finish_reason_of


@pytest.mark.parametrize("value, kept", [
    (0, 0), (TOKENS[1], TOKENS[1]), (-1, None), (TOKENS[1] + 1, None), (True, None), (3.0, None), ("3", None),
])
def test_token_counts_outside_the_records_range_are_unknown(value, kept):
    account = StreamAccount(0.0)
    account.on_usage({"prompt_tokens": value, "completion_tokens": value})
    assert account.prompt_tokens == kept and account.completion_tokens == kept


@pytest.mark.parametrize("value, kept", [
    ("stop", "stop"), ("length", "length"), ("tool_calls", "tool_calls"), ("", None), ("x" * 33, None),
    ("Stop", None), ("stop\n", None), (None, None), (7, None),
])
def test_a_non_streamed_finish_reason_is_held_to_what_the_stream_path_reads(value, kept):
    assert finish_reason_of(value) == kept


@pytest.mark.parametrize("values, mean", [
    ([-0.5, -1.5], -1.0), ([0.0], 0.0), ([0.5], None), ([LOGPROB[0] * 2], None), ([], None),
])
def test_a_mean_logprob_no_logprob_can_have_is_unknown(values, mean):
    account = StreamAccount(0.0)
    account.add_logprobs(values)
    assert account.mean_logprob == mean


def test_an_answer_that_ends_normally_is_no_upstream_error(stub):
    """A whole answer's finish reason is read; it is not a failure to count."""
    import requests

    from inferwatch.serving.settings import GatewaySettings
    from tests.support.servers import GatewayServer, metric_sum

    with GatewayServer(GatewaySettings(upstream_url=stub.url)) as gw:
        for stream in (False, True):
            r = requests.post(gw.url + "/v1/chat/completions", timeout=10, json={
                "model": "ok", "messages": [{"role": "user", "content": "hi"}], "stream": stream})
            assert r.status_code == 200
        text = gw.metrics_text()
        assert metric_sum(text, "inferwatch_gateway_requests_total", status_class="2xx") == 2
        assert metric_sum(text, "inferwatch_gateway_upstream_errors_total") == 0
