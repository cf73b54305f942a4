"""The request path leaves no reference cycles behind. Garbage in a cycle is freed only by
the collector, whose pauses grow with it: one cycle per request (an exchange that held
itself) made the collector the gateway's p99 at one request at a time
(bench/gateway_overhead.py). Every path of a request with the production features on:
API key, feature records, traces, streamed and not, answered and refused."""

from __future__ import annotations

import gc
import inspect

import pytest
import requests

from inferwatch.serving.features import MemorySink
from inferwatch.serving.settings import GatewaySettings
from tests.support.otlp import OTLPReceiver
from tests.support.servers import GatewayServer
from tests.support.stub_upstream import StubUpstream

KEY = "k-cycles"


def ours(obj: object) -> bool:
    """An object of the gateway's code: an instance of its classes, or a frame of its functions."""
    if inspect.isframe(obj):
        return "/serving/" in obj.f_code.co_filename
    return type(obj).__module__.startswith("inferwatch.")


@pytest.fixture
def gw():
    receiver = OTLPReceiver()  # spans encoded on the loop and posted, as in production
    settings = GatewaySettings(api_keys=[KEY], trace_sample_ratio=1.0, feature_flush_s=0.05,
                               otlp_endpoint=receiver.endpoint)
    try:
        with StubUpstream() as stub, GatewayServer(settings.model_copy(update={"upstream_url": stub.url}),
                                                   feature_sink=MemorySink()) as g:
            yield g
    finally:
        receiver.close()


def test_requests_leave_no_cycles(gw):
    auth = {"Authorization": f"Bearer {KEY}"}
    url = gw.url + "/v1/chat/completions"
    chat = {"model": "ok", "messages": [{"role": "user", "content": "hi"}]}
    with requests.Session() as s:
        s.post(url, json=chat, headers=auth, timeout=10)  # warm: lazy imports, first-use caches
        gc.collect()
        gc.disable()
        try:
            for _ in range(20):
                assert s.post(url, json=chat, headers=auth, timeout=10).status_code == 200
                assert s.post(url, json={**chat, "stream": True}, headers=auth, timeout=10).status_code == 200
                assert s.post(url, json=chat, timeout=10).status_code == 401
                assert s.post(url, json={**chat, "model": "nope"}, headers=auth, timeout=10).status_code == 404
                assert s.post(url, data=b"{", headers=auth, timeout=10).status_code == 400
            gc.set_debug(gc.DEBUG_SAVEALL)
            gc.collect()
            left = [type(o).__qualname__ for o in gc.garbage if ours(o)]
        finally:
            gc.set_debug(0)
            gc.garbage.clear()
            gc.enable()
    assert left == [], f"cycles of the gateway's objects: {sorted(set(left))}"
