"""A variant's replicas, against HTTP servers on loopback: least outstanding against a slow
replica, a refused connect retried elsewhere, a request cut after it was sent not retried,
5xx in a row and a failing probe taking a replica out, backoff and return, a name that
resolves to several addresses and then to fewer.

The replicas are aiohttp servers told to fail on demand (500s, a failing /health, a
connection closed after the request): what real vLLM cannot be made to do at will. Killing
and restarting real vLLM replicas is tests/integration/test_replicas_vllm.py.
"""

from __future__ import annotations

import asyncio
import socket
import subprocess
import sys
import time

import pytest
import requests
from aiohttp import web
from prometheus_client import CollectorRegistry
from pydantic import ValidationError

from inferwatch.serving.metrics import create_metrics
from inferwatch.serving.relay_client import UpstreamConnectError
from inferwatch.serving.settings import GatewaySettings
from inferwatch.serving.split import VariantSpec
from inferwatch.serving.upstream import Upstream
from inferwatch.serving.upstream_balancer import Balancer, LeastOutstanding, Picker, RoundRobin
from inferwatch.serving.upstream_targets import normalize_upstream, one_family
from tests.support.servers import GatewayServer, metric_sum
from tests.support.sockets import free_ports
from tests.support.stub_upstream import StubUpstream
from tests.support.waiting import eventually

BODY = b'{"model": "m", "prompt": "hi"}'


class Replica:
    """An OpenAI-ish server that answers POSTs after ``delay_s`` with ``status``, and /health
    with ``health``; ``close_after_read`` drops the connection once a request is read."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0) -> None:
        self.host, self.port = host, port
        self.status, self.health, self.delay_s, self.close_after_read = 200, 200, 0.0, False
        self.health_delay_s = 0.0
        self.requests = 0
        self.in_flight = self.peak = 0
        self._runner: web.AppRunner | None = None

    async def _post(self, request: web.Request) -> web.StreamResponse:
        await request.read()
        self.requests += 1
        if self.close_after_read:
            assert request.transport is not None
            request.transport.close()
            raise ConnectionResetError
        self.in_flight += 1
        self.peak = max(self.peak, self.in_flight)
        try:
            await asyncio.sleep(self.delay_s)
        finally:
            self.in_flight -= 1
        return web.json_response({"ok": self.port}, status=self.status)

    async def _health(self, request: web.Request) -> web.Response:
        await asyncio.sleep(self.health_delay_s)
        return web.Response(status=self.health)

    async def start(self) -> Replica:
        app = web.Application()
        app.router.add_post("/v1/completions", self._post)
        app.router.add_get("/health", self._health)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, self.port)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]
        return self

    async def stop(self) -> None:
        assert self._runner is not None
        await self._runner.cleanup()

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"


def settings(**kw) -> GatewaySettings:
    base = {"upstream_health_interval_s": 0.2, "upstream_connect_timeout_s": 1.0, "upstream_eject_max_s": 2.0}
    return GatewaySettings(**{**base, **kw})


async def balancer_for(spec: str, picker: Picker | None = None, **kw) -> tuple[Balancer, CollectorRegistry]:
    import aiohttp

    registry = CollectorRegistry()
    session = aiohttp.ClientSession()

    async def probe(endpoint) -> bool | None:  # as serving/upstream.py's
        try:
            async with session.get(endpoint.address.url + "/health", timeout=aiohttp.ClientTimeout(total=0.5)) as r:
                return r.status == 200
        except aiohttp.ConnectionTimeoutError:
            return False
        except TimeoutError:
            return None
        except aiohttp.ClientError:
            return False

    balancer = Balancer(spec, settings(upstream_url=spec, **kw), create_metrics(registry), probe, picker)
    balancer.session = session  # closed with the balancer by the test's `closing`
    await balancer.start()
    return balancer, registry


async def closing(balancer: Balancer) -> None:
    await balancer.close()
    await balancer.session.close()


async def call(balancer: Balancer) -> tuple[int, str]:
    """One request through the balancer, ended the way the proxy ends it."""
    resp, endpoint = await balancer.post("/v1/completions", BODY, {"content-type": "application/json"}, 10)
    await resp.read(time.monotonic() + 10)
    resp.release()
    balancer.finish(endpoint, "http_5xx" if resp.status >= 500 else None, resp.status)
    return resp.status, endpoint.key


def value(registry: CollectorRegistry, name: str, **labels: str) -> float | None:
    return registry.get_sample_value("inferwatch_gateway_" + name, labels)


def run(coro):
    return asyncio.run(coro)


# --- configuration ---------------------------------------------------------------------------

def test_upstream_lists_are_normalized_and_bad_ones_refused_with_the_reason():
    assert normalize_upstream(" http://a:8000/ , http://b:8000") == "http://a:8000,http://b:8000"
    assert normalize_upstream(["http://a:8000", "https://b/v"]) == "http://a:8000,https://b/v"
    assert GatewaySettings(upstream_url="http://a:1,http://b:2").upstream_url == "http://a:1,http://b:2"
    spec = VariantSpec(name="v1", upstream_url=["http://a:1", "http://b:2"], model="m", weight=1)
    assert spec.upstream_url == "http://a:1,http://b:2"
    for bad, says in (("http://a:1,http://a:1", "listed twice"), ("ftp://a", "http://"),
                      ("http://a:1 http://b:2", "separate several with commas"), ("http://a:99999", "port"),
                      ("http://u:secret@a:1", "credentials"), (",", "at least one"), ("http://a:1?x=1", "query")):
        with pytest.raises(ValidationError) as err:
            GatewaySettings(upstream_url=bad)
        assert says in str(err.value)
        assert "secret" not in str(err.value)


def test_a_name_is_one_replica_per_address_of_one_family():
    v4 = (socket.AF_INET, socket.SOCK_STREAM, 6, "", ("10.0.0.1", 80))
    v4b = (socket.AF_INET, socket.SOCK_STREAM, 6, "", ("10.0.0.2", 80))
    v6 = (socket.AF_INET6, socket.SOCK_STREAM, 6, "", ("fd00::1", 80, 0, 0))
    assert one_family([v6, v4, v4b, v4]) == ["10.0.0.1", "10.0.0.2"]  # dual stack: one replica per pod
    assert one_family([v6]) == ["fd00::1"]
    assert one_family(socket.getaddrinfo("localhost", 80, type=socket.SOCK_STREAM)) in (["127.0.0.1"], ["::1"])


# --- choosing a replica -----------------------------------------------------------------------

def test_least_outstanding_sends_fewer_requests_to_a_slow_replica_than_round_robin_does():
    async def share_of_slow(balance: str) -> float:
        replicas = [await Replica().start() for _ in range(3)]
        replicas[0].delay_s = 0.2
        for r in replicas[1:]:
            r.delay_s = 0.01
        balancer, _ = await balancer_for(",".join(r.url for r in replicas), upstream_balance=balance)
        try:
            async def client() -> None:
                for _ in range(10):
                    await call(balancer)
            await asyncio.gather(*(client() for _ in range(12)))
            return replicas[0].requests / sum(r.requests for r in replicas)
        finally:
            await closing(balancer)
            for r in replicas:
                await r.stop()

    least, robin = run(share_of_slow("least_outstanding")), run(share_of_slow("round_robin"))
    assert abs(robin - 1 / 3) < 0.02  # each in turn, whatever its load
    assert least < 0.2, least  # the slow one holds its requests 20 times longer: far fewer go there


def test_power_of_two_choices_takes_the_one_with_fewer_in_flight():
    class E:
        def __init__(self, n: int) -> None:
            self.in_flight = n

    picker = LeastOutstanding()
    busy, idle = E(5), E(0)
    assert all(picker.pick([busy, idle], "/", b"") is idle for _ in range(50))
    trio = [E(9), E(0), E(9)]
    picks = [picker.pick(trio, "/", b"") for _ in range(300)]
    assert picks.count(trio[1]) > 150  # in both draws that hold it (2 of 3), and never the worse of a pair


# --- failures -----------------------------------------------------------------------------------

def test_a_refused_connect_is_retried_on_another_replica_and_the_dead_one_probed_back_in():
    async def scenario():
        live = await Replica().start()
        dead_port = free_ports(1)[0]
        # round robin's first pick is the second URL: the first request draws the dead replica
        balancer, registry = await balancer_for(f"{live.url},http://127.0.0.1:{dead_port}",
                                                upstream_balance="round_robin")
        dead_key = f"127.0.0.1:{dead_port}"
        try:
            answers = [await call(balancer) for _ in range(20)]
            assert [status for status, _ in answers] == [200] * 20  # nobody saw the dead replica
            assert {key for _, key in answers} == {f"127.0.0.1:{live.port}"}
            upstream = balancer.spec
            assert value(registry, "upstream_endpoint_up", upstream=upstream, endpoint=dead_key) == 0
            # the first request was sent on to the live one, and then the dead one was out
            assert value(registry, "upstream_retries_total", upstream=upstream) == 1
            assert value(registry, "upstream_endpoint_errors_total", upstream=upstream, endpoint=dead_key,
                         reason="connect") == 1
            revived = await Replica(port=dead_port).start()
            deadline = time.monotonic() + 5  # backoff 1 s, 2 s, then a probe finds it
            while value(registry, "upstream_endpoint_up", upstream=upstream, endpoint=dead_key) != 1:
                assert time.monotonic() < deadline, "the restarted replica never came back"
                await asyncio.sleep(0.05)
            for _ in range(20):
                await call(balancer)
            assert revived.requests >= 5
            await revived.stop()
        finally:
            await closing(balancer)
            await live.stop()

    run(scenario())


def test_a_request_cut_after_it_was_sent_is_not_sent_again():
    async def scenario():
        cutter, other = await Replica().start(), await Replica().start()
        cutter.close_after_read = True
        balancer, registry = await balancer_for(f"{other.url},{cutter.url}", upstream_balance="round_robin")
        try:
            with pytest.raises(UpstreamConnectError) as err:
                await call(balancer)  # round robin's first pick is the second URL
            assert err.value.request_sent and cutter.requests == 1 and other.requests == 0
            key = f"127.0.0.1:{cutter.port}"
            assert value(registry, "upstream_endpoint_errors_total", upstream=balancer.spec, endpoint=key,
                         reason="closed") == 1
            assert value(registry, "upstream_endpoint_requests_in_flight", upstream=balancer.spec, endpoint=key) == 0
        finally:
            await closing(balancer)
            await cutter.stop()
            await other.stop()

    run(scenario())


async def until(probe, timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not probe():
        assert time.monotonic() < deadline, "never happened"
        await asyncio.sleep(0.02)


def test_5xx_in_a_row_take_a_replica_out_and_a_failing_probe_does_too():
    async def scenario():
        sick, well = await Replica().start(), await Replica().start()
        sick.status = 500
        balancer, registry = await balancer_for(f"{sick.url},{well.url}", upstream_balance="round_robin",
                                                upstream_eject_after=3)
        sick_key, well_key, spec = f"127.0.0.1:{sick.port}", f"127.0.0.1:{well.port}", balancer.spec
        try:
            statuses = []
            while statuses.count(500) < 3:  # round robin: well, sick, well, sick ...
                statuses.append((await call(balancer))[0])
            assert len(statuses) == 6  # three in a row on the sick one (the well one's 2xx are its own)
            sick.health = 503  # and its /health says so, so no probe brings it back meanwhile
            assert value(registry, "upstream_endpoint_up", upstream=spec, endpoint=sick_key) == 0
            assert {key for _, key in [await call(balancer) for _ in range(4)]} == {well_key}
            sick.status, sick.health = 200, 200  # fixed: back at its next probe
            await until(lambda: value(registry, "upstream_endpoint_up", upstream=spec, endpoint=sick_key) == 1)
            before = sick.requests
            for _ in range(6):
                await call(balancer)
            assert sick.requests - before == 3

            well.health = 503  # a replica whose engine died answers /health 503: out without a request
            await until(lambda: value(registry, "upstream_endpoint_up", upstream=spec, endpoint=well_key) == 0)
            assert value(registry, "upstream_endpoint_errors_total", upstream=spec, endpoint=well_key,
                         reason="probe") >= 1
            assert {key for _, key in [await call(balancer) for _ in range(6)]} == {sick_key}
        finally:
            await closing(balancer)
            await sick.stop()
            await well.stop()

    run(scenario())


def test_answers_that_do_not_come_in_time_in_a_row_take_a_replica_out():
    """A hung vLLM still accepts connections, and while requests sit on it its probe's
    silence reads as busy: only the requests' own timeouts can take it out."""
    async def scenario():
        hung, well = await Replica().start(), await Replica().start()
        hung.delay_s = 30.0
        balancer, registry = await balancer_for(f"{hung.url},{well.url}", upstream_balance="round_robin",
                                                upstream_eject_after=3, upstream_eject_max_s=30)
        key, spec = f"127.0.0.1:{hung.port}", balancer.spec
        try:
            timed_out = 0
            while timed_out < 3:
                try:
                    resp, endpoint = await balancer.post("/v1/completions", BODY, {}, 0.3)
                except TimeoutError:  # the proxy answers 504; the balancer has counted it
                    timed_out += 1
                    continue
                await resp.read(time.monotonic() + 10)
                resp.release()
                balancer.finish(endpoint, None, resp.status)
            assert value(registry, "upstream_endpoint_errors_total", upstream=spec, endpoint=key, reason="timeout") == 3
            assert value(registry, "upstream_endpoint_up", upstream=spec, endpoint=key) == 0
            assert {key for _, key in [await call(balancer) for _ in range(4)]} == {f"127.0.0.1:{well.port}"}
        finally:
            await closing(balancer)
            await hung.stop()
            await well.stop()

    run(scenario())


def test_a_picker_hears_how_each_request_it_placed_ended():
    class Recording(RoundRobin):
        def __init__(self) -> None:
            super().__init__()
            self.outcomes: list[tuple[str, str | None, int]] = []

        def finished(self, endpoint, reason, status) -> None:
            self.outcomes.append((endpoint.key, reason, status))

    async def scenario():
        ok, sick = await Replica().start(), await Replica().start()
        sick.status = 500
        dead = free_ports(1)[0]  # nothing listens: the connect is refused, and the request goes elsewhere
        picker = Recording()
        balancer, _ = await balancer_for(f"{ok.url},{sick.url},http://127.0.0.1:{dead}", picker,
                                         upstream_eject_after=10)
        try:
            for _ in range(3):
                await call(balancer)
            by_key = {key: (reason, status) for key, reason, status in picker.outcomes}
            assert by_key == {f"127.0.0.1:{ok.port}": (None, 200), f"127.0.0.1:{sick.port}": ("http_5xx", 500),
                              f"127.0.0.1:{dead}": ("connect", 503)}, picker.outcomes
        finally:
            await closing(balancer)
            await ok.stop()
            await sick.stop()

    run(scenario())


def test_a_replica_too_busy_to_answer_its_probe_stays_while_it_answers_requests():
    async def scenario():
        busy, other = await Replica().start(), await Replica().start()
        busy.health_delay_s = 2.0  # past the probe's 0.5 s
        balancer, registry = await balancer_for(f"{busy.url},{other.url}", upstream_balance="round_robin")
        key = f"127.0.0.1:{busy.port}"
        try:
            for _ in range(40):  # 2 s of requests, probes every 0.2 s
                assert (await call(balancer))[0] == 200
                await asyncio.sleep(0.05)
            assert value(registry, "upstream_endpoint_up", upstream=balancer.spec, endpoint=key) == 1
            # idle: a probe with no answer in time and no request answered since takes it out
            await until(lambda: value(registry, "upstream_endpoint_up", upstream=balancer.spec, endpoint=key) == 0)
        finally:
            await closing(balancer)
            await busy.stop()
            await other.stop()

    run(scenario())


def test_a_request_on_a_kept_alive_connection_that_closes_is_not_sent_to_another_replica():
    """The pool retries a reused connection once (vLLM drops idle ones); if that retry cannot
    connect, the first write may have reached vLLM, so no other replica gets the request."""
    async def scenario():
        dying, other = await Replica().start(), await Replica().start()
        balancer, _registry = await balancer_for(f"{other.url},{dying.url}", upstream_balance="round_robin")
        try:
            assert (await call(balancer))[1] == f"127.0.0.1:{dying.port}"  # a kept-alive connection to it now
            assert (await call(balancer))[1] == f"127.0.0.1:{other.port}"
            dying.close_after_read = True
            for server in dying._runner.sites:
                server._server.close()
            with pytest.raises(UpstreamConnectError) as err:
                await call(balancer)
            assert err.value.request_sent and other.requests == 1 and dying.requests == 2
        finally:
            await closing(balancer)
            await dying.stop()
            await other.stop()

    run(scenario())


REPLICA_PROCESS = """
import sys
from aiohttp import web
async def post(request):
    await request.read()
    return web.json_response({"ok": True})
app = web.Application()
app.router.add_post("/v1/completions", post)
app.router.add_get("/health", lambda request: web.Response())
web.run_app(app, host="127.0.0.1", port=int(sys.argv[1]), print=None)
"""


def test_a_request_right_after_its_replica_was_killed_goes_to_another_one():
    """A replica killed with connections kept alive to it: the next request must not be
    written on one of them (the kernel has their close, the loop has not read it yet) and
    then be refused a retry; it goes to the live replica."""
    async def scenario():
        live = await Replica().start()
        port = free_ports(1)[0]
        doomed = subprocess.Popen([sys.executable, "-c", REPLICA_PROCESS, str(port)])
        try:
            await until(lambda: requests_ok(f"http://127.0.0.1:{port}/health"), timeout_s=30)
            balancer, _ = await balancer_for(f"{live.url},http://127.0.0.1:{port}", upstream_balance="round_robin",
                                             upstream_health_interval_s=60)
            try:
                keys = {(await call(balancer))[1] for _ in range(4)}
                assert f"127.0.0.1:{port}" in keys  # a kept-alive connection to it waits in its pool
                doomed.kill()
                doomed.wait()
                time.sleep(0.2)  # blocks the loop: the close is in the kernel, not yet in the pool
                answers = [await call(balancer) for _ in range(4)]
                assert [status for status, _ in answers] == [200] * 4
                assert {key for _, key in answers} == {f"127.0.0.1:{live.port}"}
            finally:
                await closing(balancer)
        finally:
            doomed.kill()
            doomed.wait()
            await live.stop()

    run(scenario())


def requests_ok(url: str) -> bool:
    try:
        return requests.get(url, timeout=1).status_code == 200
    except requests.RequestException:
        return False


def test_a_replica_refused_by_many_requests_at_once_is_back_at_its_first_probe():
    """Eight requests at once, half of them refused by a replica that is down: one ejection,
    a backoff of 1 s, and a replica listening again by then is back at that first probe (it
    was 2^(refusals - 1) s, capped, and the log said 1 s)."""
    async def scenario():
        live = await Replica().start()
        dead_port = free_ports(1)[0]
        balancer, registry = await balancer_for(f"{live.url},http://127.0.0.1:{dead_port}",
                                                upstream_balance="round_robin", upstream_eject_max_s=10.0)
        dead_key = f"127.0.0.1:{dead_port}"
        upstream = balancer.spec
        try:
            answers = await asyncio.gather(*(call(balancer) for _ in range(8)))
            assert [status for status, _ in answers] == [200] * 8
            assert value(registry, "upstream_endpoint_errors_total", upstream=upstream, endpoint=dead_key,
                         reason="connect") >= 2, "several requests were refused at once"
            assert value(registry, "upstream_endpoint_ejections_total", upstream=upstream, endpoint=dead_key) == 1
            endpoint = balancer.endpoints[dead_key]
            assert endpoint.ejections == 1 and endpoint.ejected_until - time.monotonic() <= 1.0
            revived = await Replica(port=dead_port).start()
            started = time.monotonic()
            while value(registry, "upstream_endpoint_up", upstream=upstream, endpoint=dead_key) != 1:
                assert time.monotonic() - started < 3.0, "not back at its first probe after 1 s"
                await asyncio.sleep(0.02)
            await revived.stop()
        finally:
            await closing(balancer)
            await live.stop()

    run(scenario())


def test_the_backoff_stops_doubling_and_the_watch_survives_a_probe_that_raises():
    async def scenario():
        only = await Replica().start()
        calls = {"n": 0}

        async def raising_probe(endpoint):
            calls["n"] += 1
            raise RuntimeError("a bug in a probe")

        registry = CollectorRegistry()
        balancer = Balancer(only.url, settings(upstream_url=only.url), create_metrics(registry), raising_probe)
        await balancer.start()
        try:
            endpoint = next(iter(balancer.endpoints.values()))
            endpoint.ejections = 5000  # a replica refused for hours in panic mode
            balancer._eject(endpoint, "test")
            assert endpoint.ejected_until - time.monotonic() <= 2.0 + 0.1  # upstream_eject_max_s
            endpoint.next_probe = 0.0
            balancer._wake.set()
            await until(lambda: calls["n"] >= 2)  # probed, failed, and probed again
            assert not balancer._task.done()
        finally:
            await balancer.close()
            await only.stop()

    run(scenario())


def test_every_replica_out_still_tries_them_all_rather_than_refuse():
    async def scenario():
        only = await Replica().start()
        only.health = 503
        balancer, _registry = await balancer_for(only.url)
        try:
            await asyncio.sleep(0.5)
            assert balancer.in_rotation() == []
            assert (await call(balancer))[0] == 200  # the probe may be wrong; the request decides
        finally:
            await closing(balancer)
            await only.stop()

    run(scenario())


def test_with_every_replica_out_the_gateway_is_ready_while_one_answers_its_health():
    """Every replica out (the requests then try them all): ready while one of them answers
    /health now, not ready when none does."""
    async def scenario():
        only = await Replica().start()
        upstream = Upstream(settings(upstream_url=only.url), create_metrics(CollectorRegistry()))
        await upstream.start()
        try:
            (endpoint,) = upstream.balancer.endpoints.values()
            upstream.balancer._eject(endpoint, "5xx in a row")
            endpoint.ejected_until = endpoint.next_probe = time.monotonic() + 60  # no probe brings it back
            assert upstream.balancer.in_rotation() == []
            assert await upstream.healthy()
            only.health = 503
            assert not await upstream.healthy()
        finally:
            await upstream.close()
            await only.stop()

    run(scenario())


def test_a_probe_whose_connect_times_out_says_down_not_busy():
    """A replica whose address drops packets (a pod gone, its IP black-holed) is down: a
    connect that times out is not a server too busy to answer."""
    async def scenario():
        full = socket.socket()
        full.bind(("127.0.0.1", 0))
        full.listen(0)  # never accepted: once the queue is full, the kernel drops new SYNs
        port = full.getsockname()[1]
        fillers = []
        for _ in range(4):
            s = socket.socket()
            s.setblocking(False)
            s.connect_ex(("127.0.0.1", port))
            fillers.append(s)
        await asyncio.sleep(0.2)
        upstream = Upstream(settings(upstream_url=f"http://127.0.0.1:{port}", upstream_connect_timeout_s=0.3),
                            create_metrics(CollectorRegistry()))
        try:
            (endpoint,) = upstream.balancer.endpoints.values()
            started = time.monotonic()
            assert await upstream._probe(endpoint) is False
            assert time.monotonic() - started < 1.0  # by the connect timeout, not the whole probe's
        finally:
            await upstream.close()
            for s in [*fillers, full]:
                s.close()

    run(scenario())


# --- names ------------------------------------------------------------------------------------------

def test_a_name_with_several_addresses_spreads_over_them_and_follows_them_as_they_go(monkeypatch):
    """The resolver is the only stand-in: a name with several A records needs a DNS server;
    the replicas are real servers on 127.0.0.2 and 127.0.0.3 (all of 127/8 is loopback)."""
    port = free_ports(1)[0]
    answer = {"addresses": ["127.0.0.2", "127.0.0.3"]}

    async def getaddrinfo(self, host, port_, **kw):
        assert host == "vllm-headless.test"
        return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", (ip, port_)) for ip in answer["addresses"]]

    monkeypatch.setattr(asyncio.BaseEventLoop, "getaddrinfo", getaddrinfo)

    async def scenario():
        a, b = await Replica("127.0.0.2", port).start(), await Replica("127.0.0.3", port).start()
        balancer, registry = await balancer_for(f"http://vllm-headless.test:{port}", upstream_resolve_s=0.2)
        spec = balancer.spec
        try:
            keys = {key for _, key in [await call(balancer) for _ in range(20)]}
            assert keys == {f"127.0.0.2:{port}", f"127.0.0.3:{port}"} and a.requests and b.requests
            answer["addresses"] = ["127.0.0.2"]  # the pod behind .3 went away
            await asyncio.sleep(0.6)
            assert set(balancer.endpoints) == {f"127.0.0.2:{port}"}
            assert value(registry, "upstream_endpoint_up", upstream=spec, endpoint=f"127.0.0.3:{port}") is None
            before = b.requests
            assert all(status == 200 for status, _ in [await call(balancer) for _ in range(5)])
            assert b.requests == before
        finally:
            await closing(balancer)
            await a.stop()
            await b.stop()

    run(scenario())


def test_a_replica_that_leaves_dns_keeps_its_series_while_it_works_and_returns_as_itself(monkeypatch):
    port = free_ports(1)[0]
    answer = {"addresses": ["127.0.0.2", "127.0.0.3"]}

    async def getaddrinfo(self, host, port_, **kw):
        return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", (ip, port_)) for ip in answer["addresses"]]

    monkeypatch.setattr(asyncio.BaseEventLoop, "getaddrinfo", getaddrinfo)

    async def scenario():
        a, b = await Replica("127.0.0.2", port).start(), await Replica("127.0.0.3", port).start()
        balancer, registry = await balancer_for(f"http://vllm-headless.test:{port}", upstream_balance="round_robin")
        spec, key_b = balancer.spec, f"127.0.0.3:{port}"
        in_flight = lambda: value(registry, "upstream_endpoint_requests_in_flight", upstream=spec,  # noqa: E731
                                  endpoint=key_b)
        try:
            b.delay_s = 0.5
            slow = asyncio.create_task(call(balancer))  # round robin's first pick: the second address
            await until(lambda: in_flight() == 1)
            original = balancer.endpoints[key_b]
            answer["addresses"] = ["127.0.0.2"]
            await balancer.resolve()
            assert key_b not in balancer.endpoints and in_flight() == 1  # gone from DNS, still working
            answer["addresses"] = ["127.0.0.2", "127.0.0.3"]
            await balancer.resolve()
            assert balancer.endpoints[key_b] is original  # the same replica, its request still counted
            answer["addresses"] = ["127.0.0.2"]
            await balancer.resolve()
            assert (await slow)[1] == key_b
            assert in_flight() is None  # its last request ended: its series are gone
            assert value(registry, "upstream_endpoint_errors_total", upstream=spec, endpoint=key_b,
                         reason="connect") is None
        finally:
            await closing(balancer)
            await a.stop()
            await b.stop()

    run(scenario())


def test_through_the_gateway_a_client_that_leaves_frees_its_replica_and_5xx_runs_eject():
    """The proxy tells the balancer how each request ended (``Proxy.settle``)."""
    with StubUpstream() as one, StubUpstream() as two:
        spec = f"{one.url},{two.url}"
        with GatewayServer(GatewaySettings(upstream_url=spec, upstream_balance="round_robin")) as gw:
            r = requests.post(gw.url + "/v1/chat/completions", stream=True, timeout=10, json={
                "model": "stall_stream", "messages": [{"role": "user", "content": "hi"}], "stream": True})
            chunks = r.iter_content(chunk_size=None)  # kept: a dropped iterator closes the response
            assert b'"content":"a"' in next(chunks)
            assert metric_sum(gw.metrics_text(), "inferwatch_gateway_upstream_endpoint_requests_in_flight") == 1
            r.close()  # the user closed the tab
            eventually(lambda: metric_sum(gw.metrics_text(),
                                          "inferwatch_gateway_upstream_endpoint_requests_in_flight") == 0)
            for _ in range(6):  # three 500s in a row for each replica
                r = requests.post(gw.url + "/v1/chat/completions", timeout=10, json={
                    "model": "http500", "messages": [{"role": "user", "content": "hi"}]})
                assert r.status_code == 500
            text = gw.metrics_text()
            for stub in (one, two):
                endpoint = stub.url.removeprefix("http://")
                assert metric_sum(text, "inferwatch_gateway_upstream_endpoint_errors_total", endpoint=endpoint,
                                  reason="http_5xx") == 3
                assert metric_sum(text, "inferwatch_gateway_upstream_endpoint_ejections_total",
                                  endpoint=endpoint) == 1
            assert metric_sum(text, "inferwatch_gateway_upstream_endpoint_requests_in_flight") == 0
            ok = requests.post(gw.url + "/v1/chat/completions", timeout=10, json={
                "model": "ok", "messages": [{"role": "user", "content": "hi"}]})
            assert ok.status_code == 200  # every replica out: tried anyway, and they answer
