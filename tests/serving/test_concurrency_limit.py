"""uvicorn's ``limit_concurrency`` (INFERWATCH_GATEWAY_LIMIT_CONCURRENCY) holds on the proxy
routes, which the gateway's protocol serves without uvicorn's request cycle: past the limit a
request gets a 503 as an OpenAI error object, counted, and the next one after the load
drops is served."""

import requests

from inferwatch.serving.settings import GatewaySettings
from tests.support.servers import GatewayServer, metric_sum
from tests.support.waiting import eventually

CHAT = "/v1/chat/completions"


def chat(gw, model="ok", stream=False):
    body = {"model": model, "messages": [{"role": "user", "content": "hi"}], "stream": stream}
    return requests.post(gw.url + CHAT, json=body, timeout=10, stream=stream)


def test_a_request_past_the_concurrency_limit_gets_an_openai_503_and_the_limit_frees_up(stub):
    settings = GatewaySettings(upstream_url=stub.url, limit_concurrency=2)
    with GatewayServer(settings) as gw:
        assert chat(gw).status_code == 200
        held = chat(gw, "stall_stream", stream=True)  # one connection and one request in progress
        reading = held.iter_content(chunk_size=None)
        assert next(reading)
        refused = chat(gw)  # a second connection reaches the limit of 2
        assert refused.status_code == 503 and refused.headers["retry-after"] == "1"
        error = refused.json()["error"]
        assert error["code"] == "concurrency_limit" and "retry later" in error["message"]
        held.close()  # served again once the gateway has seen the client leave
        eventually(lambda: chat(gw).status_code == 200)
        # refusals are counted (the one above, and any while the close was on its way), and count
        # against availability as failed requests
        text = gw.metrics_text()
        refused = metric_sum(text, "inferwatch_gateway_rejected_requests_total", code="concurrency_limit")
        assert refused >= 1 and metric_sum(text, "inferwatch_gateway_requests_total", status_class="5xx") == refused
        assert error["type"] == "server_error"


def test_without_a_limit_concurrent_requests_are_all_served(stub):
    with GatewayServer(GatewaySettings(upstream_url=stub.url)) as gw:
        held = [chat(gw, "stall_stream", stream=True) for _ in range(3)]
        assert [r.status_code for r in held] == [200, 200, 200]
        for r in held:
            r.close()
        assert chat(gw).status_code == 200
