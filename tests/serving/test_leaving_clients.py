"""A non-streaming client that leaves is a 499 and its upstream request is cut, whatever its
body's size and whenever it leaves (issue 27), down to the two gaps that let requests run
on: reading stopped after a body past 64 KiB came whole, and a cancel lost when it came in
the loop turn the upstream connection was made in. Real vLLM under a burst of leaving
clients: tests/integration/test_disconnect_burst.py."""

import asyncio
import json

import pytest
import uvloop

from inferwatch.serving import relay_client
from inferwatch.serving.settings import GatewaySettings
from inferwatch.serving.upstream_pool import UpstreamPool
from tests.support.servers import GatewayServer, metric_sum
from tests.support.sockets import connect, post_request, reset
from tests.support.waiting import eventually

CHAT = "/v1/chat/completions"


def _settled(text: str) -> str | None:
    """The metrics once nothing is in flight any more."""
    return text if metric_sum(text, "inferwatch_gateway_requests_in_flight") == 0 else None


@pytest.mark.parametrize("pad", [0, 80_000], ids=["small body", "body past 64 KiB"])
@pytest.mark.parametrize("hang_up", ["close", "reset"])
def test_a_client_that_leaves_while_upstream_works_is_a_499_and_cut_at_once(stub, pad, hang_up):
    body = json.dumps({"model": "stall_headers", "messages": [{"role": "user", "content": "hi"}]}).encode()
    with GatewayServer(GatewaySettings(upstream_url=stub.url, upstream_timeout_s=60)) as gw:
        seen = len(stub.seen)
        sock = connect(gw.port)
        sock.sendall(post_request(CHAT, body + b" " * pad))  # whitespace: still the same JSON
        eventually(lambda: len(stub.seen) > seen)  # upstream works on it (for 30 s)
        sock.close() if hang_up == "close" else reset(sock)
        text = eventually(lambda: _settled(gw.metrics_text()), timeout_s=10)
        assert metric_sum(text, "inferwatch_gateway_requests_total", status_class="4xx") == 1
        assert metric_sum(text, "inferwatch_gateway_requests_total", status_class="2xx") == 0


@pytest.mark.parametrize("loop", ["uvloop", "asyncio"])
def test_a_cancel_that_comes_as_the_upstream_connection_is_made_is_not_lost(monkeypatch, loop):
    """The client's leaving cancels the request's task. When that comes in the loop turn just
    after the connect completed, the request must not go to vLLM anyway with nobody left to
    cut it (``asyncio.wait_for`` dropped such a cancel on Python 3.11)."""
    async def scenario() -> tuple[bytes, bool]:
        received = bytearray()
        closed = asyncio.Event()

        async def upstream(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            received.extend(await reader.read())  # until the gateway's side closes
            closed.set()
            writer.close()

        server = await asyncio.start_server(upstream, "127.0.0.1", 0)
        pool = UpstreamPool(f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}", connect_timeout_s=5,
                            max_connections=4)
        task, running = asyncio.current_task(), asyncio.get_running_loop()
        made = relay_client.UpstreamConnection.connection_made

        def leave_in_the_next_turn(self, transport):
            made(self, transport)
            running.call_soon(task.cancel)

        monkeypatch.setattr(relay_client.UpstreamConnection, "connection_made", leave_in_the_next_turn)
        cancelled = False
        try:
            async with asyncio.timeout(5):  # not wait_for: it is what is under test
                await pool.post(CHAT, b"{}", {}, 2)
        except asyncio.CancelledError:
            cancelled = True
            task.uncancel()
        async with asyncio.timeout(5):
            await closed.wait()
        server.close()
        return bytes(received), cancelled

    runner = uvloop.run if loop == "uvloop" else asyncio.run
    received, cancelled = runner(scenario())
    assert cancelled, "the client's cancel was lost: the request went on to vLLM"
    assert received == b"", "the request reached vLLM after its client left"
