"""A variant's vLLM replicas: which one takes each request, and which are out of rotation.

Each request goes to the replica with the fewest requests in flight from this gateway, of
two drawn at random (power of two choices: near the least loaded without every gateway
replica herding onto the same one). A replica is taken out of rotation when a connect
fails, when ``eject_after`` requests in a row got a 5xx, a broken stream or no answer in
time (Envoy's consecutive gateway failures), or when its ``/health`` probe fails; it comes
back when a probe answers 200, after a backoff that doubles with each ejection in a row
(1 s, 2 s, 4 s ... up to ``upstream_eject_max_s``).
With every replica out, all of them are tried (Envoy's panic mode): the alternative is
refusing everything on stale information.

A request is sent to another replica only when the connection could not be made: nothing
of it reached vLLM, so it cannot run twice. One cut short after it was sent fails.

``Picker`` is the seam for a smarter policy (KV-cache or prefix affinity, latency-weighted):
it sees the replicas in rotation and the request's path and body, and hears how each request
it placed ended (a refused connect too, before the retry).
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Protocol

from inferwatch.serving.metrics import ENDPOINT_ERROR_REASONS, GatewayMetrics
from inferwatch.serving.relay_client import UpstreamConnectError, UpstreamResponse
from inferwatch.serving.settings import GatewaySettings
from inferwatch.serving.upstream_pool import UpstreamPool
from inferwatch.serving.upstream_targets import Address, Target, parse_upstream, resolve

log = logging.getLogger(__name__)

EJECT_BASE_S = 1.0
MAX_DOUBLINGS = 16  # the backoff's exponent stops here (then upstream_eject_max_s caps it anyway)
PANIC_RESOLVE_MIN_S = 1.0  # with every replica out, resolve names again, at most this often
MAX_RETRIES = 2  # other replicas tried after a refused connect
# "connect" here: closed before an answer; "timeout": no answer headers in time (a hung replica
# still accepts connections, and its probe's silence alone does not take it out while busy)
FAILURE_REASONS = frozenset({"http_5xx", "stream_interrupted", "connect", "timeout"})


class Endpoint:
    """One replica: its connection pool, the requests in flight to it from this gateway,
    and whether it is in rotation."""

    __slots__ = (
        "_labels",
        "_metrics",
        "address",
        "answered",
        "ejected_until",
        "ejections",
        "failures_in_row",
        "in_flight",
        "next_probe",
        "pool",
        "removed",
        "requests",
    )

    def __init__(self, address: Address, settings: GatewaySettings, metrics: GatewayMetrics, upstream: str) -> None:
        self.address = address
        self.pool = UpstreamPool(address.target.url, settings.upstream_connect_timeout_s,
                                 settings.upstream_max_connections, address=address.ip)
        self.in_flight = 0
        self.ejected_until = 0.0  # 0: in rotation
        self.ejections = 0  # in a row, for the backoff; reset by an answer that did not fail
        self.failures_in_row = 0
        self.next_probe = 0.0
        self.removed = False  # gone from DNS: closed once its last request ends
        self.answered = False  # a request ended well since the last probe
        self._metrics, self._labels = metrics, (upstream, address.key)
        metrics.endpoint_in_flight.labels(*self._labels).set_function(lambda: self.in_flight)
        metrics.endpoint_up.labels(*self._labels).set_function(lambda: 0 if self.ejected_until else 1)
        self.requests = metrics.endpoint_requests.labels(*self._labels)
        # at 0 from the start: rate() needs a sample before a replica's first failure to count it
        metrics.endpoint_ejections.labels(*self._labels)
        for reason in ENDPOINT_ERROR_REASONS:
            metrics.endpoint_errors.labels(*self._labels, reason)

    @property
    def key(self) -> str:
        return self.address.key

    def error(self, reason: str) -> None:
        self._metrics.endpoint_errors.labels(*self._labels, reason).inc()

    def ejected(self) -> None:
        self._metrics.endpoint_ejections.labels(*self._labels).inc()

    def forget(self) -> None:
        """Take its series off /metrics (the replica is gone: labels stay bounded)."""
        m = self._metrics
        for metric in (m.endpoint_up, m.endpoint_in_flight, m.endpoint_requests, m.endpoint_ejections):
            try:
                metric.remove(*self._labels)
            except KeyError:
                pass
        for reason in ENDPOINT_ERROR_REASONS:
            try:
                m.endpoint_errors.remove(*self._labels, reason)
            except KeyError:
                pass


class Picker(Protocol):
    def pick(self, candidates: Sequence[Endpoint], path: str, body: bytes) -> Endpoint: ...

    def finished(self, endpoint: Endpoint, reason: str | None, status: int) -> None:
        """A request ``pick`` placed on ``endpoint`` ended: ``status`` as the client saw it,
        ``reason`` the upstream failure (``FAILURE_REASONS``, ``http_4xx``...) or None."""


class InFlightOnly:
    """A picker that needs no outcomes: the in-flight counts say all it uses."""

    def finished(self, endpoint: Endpoint, reason: str | None, status: int) -> None:
        pass


class LeastOutstanding(InFlightOnly):
    """The fewer in flight of two replicas drawn at random."""

    def __init__(self, rng: random.Random | None = None) -> None:
        self._rng = rng or random.Random()

    def pick(self, candidates: Sequence[Endpoint], path: str, body: bytes) -> Endpoint:
        if len(candidates) == 1:
            return candidates[0]
        a, b = self._rng.sample(candidates, 2)
        return b if b.in_flight < a.in_flight else a


class RoundRobin(InFlightOnly):
    """Each replica in turn, whatever its load: the baseline the benchmark compares with."""

    def __init__(self) -> None:
        self._next = 0

    def pick(self, candidates: Sequence[Endpoint], path: str, body: bytes) -> Endpoint:
        self._next += 1
        return candidates[self._next % len(candidates)]


PICKERS: dict[str, Callable[[], Picker]] = {"least_outstanding": LeastOutstanding, "round_robin": RoundRobin}


class Balancer:
    """The replicas of one upstream (one URL or several; names resolved to every address)."""

    def __init__(self, spec: str, settings: GatewaySettings, metrics: GatewayMetrics,
                 probe: Callable[[Endpoint], Awaitable[bool | None]], picker: Picker | None = None) -> None:
        """``probe(endpoint)`` is awaited for its health: True when ``/health`` answered 200,
        False when it answered otherwise or refused, None when it did not answer in time.
        ``picker`` defaults to the one ``upstream_balance`` names."""
        self.spec = spec
        self.targets: tuple[Target, ...] = parse_upstream(spec)
        self._settings, self._metrics, self._probe = settings, metrics, probe
        self._picker = picker or PICKERS[settings.upstream_balance]()
        self._retries = metrics.upstream_retries.labels(spec)
        self.endpoints: dict[str, Endpoint] = {}
        self._draining: dict[str, Endpoint] = {}  # gone from DNS with requests still on them
        self._rotation: list[Endpoint] = []  # in rotation, in the order they came
        self._resolving = asyncio.Lock()
        self._last_resolve = float("-inf")
        self._next_resolve = 0.0
        self._last_panic_resolve = float("-inf")
        self._wake = asyncio.Event()
        self._task: asyncio.Task | None = None
        self._set_addresses([Address(t, t.host) for t in self.targets if t.literal])  # names: at start

    # --- the request path ---------------------------------------------------------------
    async def post(self, path: str, body: bytes, headers: dict[str, str],
                   timeout_s: float) -> tuple[UpstreamResponse, Endpoint]:
        """Send the request to a replica; the caller ends it with ``finish(endpoint, reason)``.

        A refused connect takes that replica out and tries another (at most ``MAX_RETRIES``)."""
        if not self.endpoints and time.monotonic() - self._last_resolve >= PANIC_RESOLVE_MIN_S:
            async with self._resolving:  # one lookup for every request waiting on it
                if not self.endpoints:
                    await self.resolve()
        tried: list[Endpoint] = []
        error: UpstreamConnectError | None = None
        while len(tried) <= MAX_RETRIES:
            candidates = [e for e in self._candidates() if e not in tried]
            if not candidates:
                break
            endpoint = self._picker.pick(candidates, path, body)
            if tried:
                self._retries.inc()
            tried.append(endpoint)
            endpoint.in_flight += 1
            endpoint.requests.inc()
            try:
                return await endpoint.pool.post(path, body, headers, timeout_s), endpoint
            except UpstreamConnectError as exc:
                if exc.request_sent:
                    self.finish(endpoint, "connect", 503)
                    raise
                endpoint.in_flight -= 1
                self._picker.finished(endpoint, "connect", 503)
                if endpoint.removed:
                    self._drain_if_removed(endpoint)
                else:
                    endpoint.error("connect")
                    self._eject(endpoint, str(exc))
                error = exc
            except TimeoutError:  # no answer headers in time: the caller answers 504
                self.finish(endpoint, "timeout", 504)
                raise
            except BaseException:
                endpoint.in_flight -= 1
                self._drain_if_removed(endpoint)
                raise
        raise error or UpstreamConnectError(f"no address for {self.spec}: the name did not resolve",
                                            request_sent=False)

    def finish(self, endpoint: Endpoint, reason: str | None, status: int) -> None:
        """A request ``post`` gave ``endpoint`` has ended with ``status``; ``reason`` is the
        upstream error, or None. 5xx answers, broken streams and answers that did not come in
        time, in a row, take the replica out; a 2xx ends the run (a client that left or a 4xx
        says nothing)."""
        endpoint.in_flight -= 1
        self._picker.finished(endpoint, reason, status)
        if endpoint.removed:
            self._drain_if_removed(endpoint)
            return
        if reason in FAILURE_REASONS:
            endpoint.error("closed" if reason == "connect" else reason)
            endpoint.failures_in_row += 1
            if endpoint.failures_in_row >= self._settings.upstream_eject_after and not endpoint.ejected_until:
                self._eject(endpoint, f"{endpoint.failures_in_row} failed answers in a row (last: {reason})")
        elif reason is None and 200 <= status < 300:
            endpoint.answered = True
            endpoint.failures_in_row = 0
            endpoint.ejections = 0
        self._drain_if_removed(endpoint)

    def _candidates(self) -> list[Endpoint]:
        if self._rotation:
            return self._rotation
        if self.endpoints and time.monotonic() - self._last_panic_resolve >= PANIC_RESOLVE_MIN_S:
            self._last_panic_resolve = time.monotonic()
            self._next_resolve = 0.0  # every replica out: perhaps they moved (a pod's new address)
            self._wake.set()
        return list(self.endpoints.values())

    # --- rotation -------------------------------------------------------------------------
    def _eject(self, endpoint: Endpoint, why: str, *, probe_failed: bool = False) -> None:
        """Out of rotation until a probe after the backoff. A replica already out is not
        ejected again by the requests that still reach it (several refused at once, or every
        replica out): only its failed probe, the backoff's own test, doubles the wait, so a
        replica back by its first probe is back at that probe."""
        if endpoint.ejected_until and not probe_failed:
            return
        now = time.monotonic()
        endpoint.ejections += 1
        backoff = min(EJECT_BASE_S * 2 ** min(endpoint.ejections - 1, MAX_DOUBLINGS),
                      self._settings.upstream_eject_max_s)
        if not endpoint.ejected_until:
            log.warning("upstream %s: replica %s out of rotation for %.0f s: %s", self.spec, endpoint.key, backoff, why)
            endpoint.ejected()
            if endpoint in self._rotation:
                self._rotation.remove(endpoint)
        endpoint.ejected_until = now + backoff
        endpoint.next_probe = endpoint.ejected_until
        self._wake.set()

    def _restore(self, endpoint: Endpoint) -> None:
        log.warning("upstream %s: replica %s back in rotation", self.spec, endpoint.key)
        endpoint.ejected_until = 0.0
        endpoint.failures_in_row = 0
        if endpoint not in self._rotation and not endpoint.removed:
            self._rotation.append(endpoint)

    def in_rotation(self) -> list[Endpoint]:
        return list(self._rotation)

    # --- addresses --------------------------------------------------------------------------
    async def resolve(self) -> None:
        """Resolve every name again; a name that fails keeps its last addresses."""
        addresses: list[Address] = []
        for target in self.targets:
            try:
                found = await resolve(target)
            except (OSError, UnicodeError) as exc:  # UnicodeError: a name IDNA refuses (a label past 63)
                found = [e.address for e in self.endpoints.values() if e.address.target == target]
                log.warning("upstream %s: cannot resolve %s (%s); keeping %d known address(es)", self.spec,
                            target.host, exc, len(found))
            addresses.extend(found)
        self._set_addresses(addresses)
        self._last_resolve = time.monotonic()
        self._next_resolve = self._last_resolve + self._settings.upstream_resolve_s

    def _set_addresses(self, addresses: list[Address]) -> None:
        limit = self._settings.upstream_max_endpoints
        found = {a.key: a for a in addresses}
        # past the limit, the replicas known already first: a resolver that shuffles its answers
        # must not swap the chosen ones at every resolve
        keys = [k for k in self.endpoints if k in found] + [k for k in found if k not in self.endpoints]
        if len(keys) > limit:
            log.warning("upstream %s: %d addresses, using %d (upstream_max_endpoints)", self.spec, len(keys), limit)
        wanted = set(keys[:limit])
        for key in [k for k in self.endpoints if k not in wanted]:
            endpoint = self.endpoints.pop(key)
            log.warning("upstream %s: replica %s gone from %s", self.spec, key, endpoint.address.target.host)
            endpoint.removed = True
            if endpoint in self._rotation:
                self._rotation.remove(endpoint)
            self._draining[key] = endpoint
            self._drain_if_removed(endpoint)
        for key in keys[:limit]:
            if key in self.endpoints:
                continue
            back = self._draining.pop(key, None)
            if back is not None:  # back before its last request ended: the same replica, series and all
                back.removed = False
                endpoint = back
            else:
                endpoint = Endpoint(found[key], self._settings, self._metrics, self.spec)
            self.endpoints[key] = endpoint
            if not endpoint.ejected_until:
                self._rotation.append(endpoint)  # a new address is a pod that became ready: in at once,
            endpoint.next_probe = 0.0  # and probed at once

    def _drain_if_removed(self, endpoint: Endpoint) -> None:
        if endpoint.removed and endpoint.in_flight == 0 and self._draining.get(endpoint.key) is endpoint:
            del self._draining[endpoint.key]
            endpoint.pool.close()
            endpoint.forget()

    # --- the background watch ----------------------------------------------------------------
    async def start(self) -> None:
        if not all(t.literal for t in self.targets):
            await self.resolve()
        else:
            self._next_resolve = float("inf")
        self._task = asyncio.get_running_loop().create_task(self._watch(), name=f"replicas {self.spec}")

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        for endpoint in (*self.endpoints.values(), *self._draining.values()):
            endpoint.pool.close()

    async def _watch_once(self) -> None:
        now = time.monotonic()
        if now >= self._next_resolve:
            await self.resolve()
        due = [e for e in self.endpoints.values() if e.next_probe <= now]
        if not due:
            return
        sent = {id(e): e.ejections for e in due}
        results = await asyncio.gather(*(self._probe(e) for e in due), return_exceptions=True)
        after = time.monotonic()
        for endpoint, healthy in zip(due, results):
            if endpoint.removed:
                continue
            if isinstance(healthy, BaseException):
                log.warning("upstream %s: probe of %s failed: %r", self.spec, endpoint.key, healthy)
                healthy = False
            if healthy is None and (endpoint.answered or endpoint.in_flight) and not endpoint.ejected_until:
                healthy = True  # too busy to answer its probe in time, yet working on requests
            endpoint.answered = False
            if endpoint.ejections != sent[id(endpoint)]:
                continue  # ejected while the probe was out: that newer ejection and its backoff stand
            if healthy:
                if endpoint.ejected_until:
                    self._restore(endpoint)
                endpoint.next_probe = after + self._settings.upstream_health_interval_s
            else:
                endpoint.error("probe")
                self._eject(endpoint, "its /health probe did not answer 200", probe_failed=True)

    async def _watch(self) -> None:
        """Resolve names again and probe replicas when due: those in rotation every
        ``upstream_health_interval_s``, those out when their backoff ends."""
        while True:
            try:
                await self._watch_once()
            except Exception:  # a bug here must not end probing and resolving for good
                log.exception("upstream %s: probing or resolving failed; trying again in a second", self.spec)
                await asyncio.sleep(1.0)
            self._wake.clear()
            next_at = min([self._next_resolve, *(e.next_probe for e in self.endpoints.values())])
            try:
                await asyncio.wait_for(self._wake.wait(), max(0.05, next_at - time.monotonic()))
            except TimeoutError:
                pass
