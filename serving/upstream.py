"""The vLLM side of the gateway: the HTTP client and the list of served models."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping

import aiohttp
import orjson

from inferwatch.serving.metrics import GatewayMetrics
from inferwatch.serving.settings import GatewaySettings
from inferwatch.serving.upstream_balancer import Balancer, Endpoint
from inferwatch.serving.validation import ModelInfo

log = logging.getLogger(__name__)


def served_models(listing: object) -> dict[str, ModelInfo]:
    """vLLM's /v1/models answer, by id. A LoRA adapter (``parent`` set, ``max_model_len``
    null) takes its base model's context length: the adapter runs in the base's engine."""
    data = listing.get("data") if isinstance(listing, dict) else None
    if not isinstance(data, list):
        raise ValueError("the model list is not an object with a list of models in 'data'")
    cards = [m for m in data if isinstance(m, dict) and isinstance(m.get("id"), str)]
    lengths = {m["id"]: m["max_model_len"] for m in cards if isinstance(m.get("max_model_len"), int)}
    models = {}
    for m in cards:
        parent = m.get("parent") if isinstance(m.get("parent"), str) and m.get("parent") != m["id"] else None
        length = lengths.get(m["id"], lengths.get(parent) if parent else None)
        models[m["id"]] = ModelInfo(m["id"], length, parent)
    return models


class Upstream:
    """One variant's vLLM OpenAI server, as one replica or several: the proxy routes' balancer
    over their connection pools (serving/upstream_balancer.py), an aiohttp session for
    everything else (model lists, health probes), and the cached model list.

    The model list is refreshed in the background and on a miss (at most once a second),
    so a model vLLM starts serving is found quickly and an unknown name never costs vLLM
    a request. The last list seen is kept while vLLM is down, so labels stay meaningful.
    """

    MISS_REFRESH_MIN_S = 1.0
    DOWN_RETRY_S = 2.0  # while the upstream is down, so its return shows in upstream_up at once

    def __init__(self, settings: GatewaySettings, metrics: GatewayMetrics, base_url: str | None = None) -> None:
        """``base_url`` defaults to the settings' upstream (an experiment's variant has its own);
        one URL or several, comma-separated."""
        self.base_url = base_url or settings.upstream_url
        self._settings = settings
        self.models: dict[str, ModelInfo] = {}
        self._last_refresh = float("-inf")
        self.up = True  # as of the last probe
        self._up = metrics.upstream_up.labels(self.base_url)
        self._session: aiohttp.ClientSession | None = None
        self.balancer = Balancer(self.base_url, settings, metrics, self._probe)  # the proxy routes' own client
        self._refresh_task: asyncio.Task | None = None
        self.on_models: Callable[[Mapping[str, ModelInfo]], None] | None = None  # told each model list read
        self._refresh_lock = asyncio.Lock()
        self._wake = asyncio.Event()
        self.headers = {"content-type": "application/json"}
        if settings.upstream_api_key:
            self.headers["authorization"] = f"Bearer {settings.upstream_api_key.get_secret_value()}"

    @property
    def session(self) -> aiohttp.ClientSession:
        if self._session is None:
            connector = aiohttp.TCPConnector(limit=self._settings.upstream_max_connections, ttl_dns_cache=300)
            self._session = aiohttp.ClientSession(connector=connector, auto_decompress=False)
        return self._session

    def timeout(self) -> aiohttp.ClientTimeout:
        s = self._settings
        return aiohttp.ClientTimeout(total=s.upstream_timeout_s, connect=s.upstream_connect_timeout_s)

    async def start(self) -> None:
        await self.balancer.start()
        await self.refresh_models()
        self._refresh_task = asyncio.get_running_loop().create_task(self._refresh_forever(), name="models-refresh")

    async def close(self) -> None:
        if self._refresh_task is not None:
            self._refresh_task.cancel()
            await asyncio.gather(self._refresh_task, return_exceptions=True)
        await self.balancer.close()
        if self._session is not None:
            await self._session.close()

    async def refresh_models(self) -> bool:
        """Re-read /v1/models; True on success. Failure keeps the previous list."""
        async with self._refresh_lock:
            self._last_refresh = time.monotonic()
            try:
                self.models = served_models(await self._read_models())
            except (aiohttp.ClientError, TimeoutError, ValueError, AttributeError) as exc:
                if self.up:  # said once per outage, not at every retry
                    log.warning("upstream %s: model list unavailable: %s", self.base_url, str(exc) or type(exc).__name__)
                self.up = False
                self._up.set(0)
                return False
            if self.on_models is not None:
                self.on_models(self.models)
            if not self.up:
                log.warning("upstream %s: model list available again", self.base_url)
            self.up = True
            self._up.set(1)
            return True

    async def _read_models(self) -> dict:
        """The model list from a replica in rotation, trying up to three (any known one when
        none is in rotation); the last failure if none answers."""
        timeout = aiohttp.ClientTimeout(total=self._settings.upstream_connect_timeout_s + 3)
        # none known: get() raises the error that says so
        candidates: list[Endpoint | None] = [*self.balancer.in_rotation()[:3]] or [self.any_replica()]
        for i, endpoint in enumerate(candidates):
            try:
                async with self.get(endpoint, "/v1/models", timeout) as r:
                    r.raise_for_status()
                    return orjson.loads(await r.read())
            except (aiohttp.ClientError, TimeoutError, ValueError):
                if i == len(candidates) - 1:
                    raise
        raise AssertionError("unreachable")

    async def on_unknown_model(self) -> bool:
        """Refresh after a miss, rate-limited; True if a refresh happened and succeeded."""
        if time.monotonic() - self._last_refresh < self.MISS_REFRESH_MIN_S:
            return False
        return await self.refresh_models()

    def get(self, endpoint: Endpoint | None, path: str, timeout: aiohttp.ClientTimeout):
        """GET ``path`` from one replica, at its address with the URL's Host header and TLS name."""
        if endpoint is None:
            raise aiohttp.ClientConnectionError(f"no replica of {self.base_url} is known (its name did not resolve)")
        target = endpoint.address.target
        headers = {**self.headers, "host": target.netloc}
        return self.session.get(endpoint.address.url + path, headers=headers, timeout=timeout,
                                server_hostname=target.host if target.scheme == "https" else None)

    def any_replica(self) -> Endpoint | None:
        """One in rotation if any, else any known: for what every replica answers alike."""
        rotation = self.balancer.in_rotation()
        return rotation[0] if rotation else next(iter(self.balancer.endpoints.values()), None)

    async def _probe(self, endpoint: Endpoint) -> bool | None:
        """True: /health answered 200; False: it answered otherwise, or the connection failed
        or timed out (nothing listens there); None: connected but no answer in time (a vLLM busy
        on two cores can take seconds to answer it)."""
        try:
            timeout = aiohttp.ClientTimeout(total=self._settings.upstream_connect_timeout_s + 1,
                                            connect=self._settings.upstream_connect_timeout_s)
            async with self.get(endpoint, "/health", timeout) as r:
                return r.status == 200
        except aiohttp.ConnectionTimeoutError:
            return False
        except TimeoutError:
            return None
        except aiohttp.ClientError:
            return False

    async def healthy(self) -> bool:
        """Ready when a replica answers its /health now: one in rotation, or, with every one
        out (the balancer then tries them all), any known one."""
        for endpoint in (self.balancer.in_rotation() or list(self.balancer.endpoints.values()))[:3]:
            if await self._probe(endpoint) is True:
                return True
        return False

    def unreachable(self, cause: BaseException | None = None) -> None:
        """A request could not reach vLLM: say so in ``upstream_up`` now, and probe again soon
        (every ``DOWN_RETRY_S``) instead of at the next regular refresh."""
        if self.up:
            log.warning("upstream %s: a request could not connect: %s", self.base_url,
                        f"{type(cause).__name__}: {cause}" if cause is not None else "unknown cause")
        self.up = False
        self._up.set(0)
        self._wake.set()

    async def _refresh_forever(self) -> None:
        while True:
            delay = self._settings.models_refresh_s if self.up else min(self.DOWN_RETRY_S, self._settings.models_refresh_s)
            try:
                await asyncio.wait_for(self._wake.wait(), delay)
                await asyncio.sleep(min(self.DOWN_RETRY_S, delay))  # woken: probe soon, not in a burst
            except TimeoutError:
                pass
            self._wake.clear()
            await self.refresh_models()
