"""Per-request feature records for the drift service, behind a bounded queue.

The record is the drift service's contract (drift/feature_record.py): the gateway fills
its fields, the drift service checks them. A slow or dead drift service must never slow
or fail a request: ``FeatureQueue.submit`` never waits, records beyond the buffer's size
are dropped and counted, and sending happens in batches on a background task.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from typing import Protocol

import aiohttp

from inferwatch.drift.feature_record import FeatureRecord, ingest_body
from inferwatch.serving.metrics import GatewayMetrics

log = logging.getLogger(__name__)


class FeatureSink(Protocol):
    async def send(self, batch: list[FeatureRecord]) -> None:
        """Deliver a batch or raise; the queue counts a raised batch as dropped."""

    async def close(self) -> None: ...


class MemorySink:
    """Keeps the last ``maxlen`` records in memory (for tests and local inspection)."""

    def __init__(self, maxlen: int = 10_000) -> None:
        self.records: deque[FeatureRecord] = deque(maxlen=maxlen)

    async def send(self, batch: list[FeatureRecord]) -> None:
        self.records.extend(batch)

    async def close(self) -> None:
        return None


class HttpSink:
    """POSTs ``{"records": [...]}`` batches to the drift service's ingest endpoint."""

    def __init__(self, base_url: str, token: str | None = None, timeout_s: float = 5.0) -> None:
        self.url = f"{base_url}/v1/ingest"
        self._headers = {"content-type": "application/json"}
        if token:
            self._headers["authorization"] = f"Bearer {token}"
        self._timeout = aiohttp.ClientTimeout(total=timeout_s)
        self._session: aiohttp.ClientSession | None = None

    async def send(self, batch: list[FeatureRecord]) -> None:
        if self._session is None:
            self._session = aiohttp.ClientSession(timeout=self._timeout)
        async with self._session.post(self.url, data=ingest_body(batch), headers=self._headers) as resp:
            if resp.status >= 300:
                text = (await resp.text())[:300]
                raise RuntimeError(f"drift ingest answered {resp.status}: {text}")

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()


class FeatureQueue:
    """Records wait in a bounded buffer; a background task sends them in batches, when a
    batch is full or ``flush_s`` after the first record of one arrived.

    Submitting is an append and a counter: the sender wakes once per batch, not once per
    record (at one request at a time, a queue ``get`` per record was a task switch and a
    timeout per request, measurable in bench/gateway_overhead.py)."""

    def __init__(self, sink: FeatureSink, metrics: GatewayMetrics, *, maxsize: int, batch_size: int,
                 flush_s: float) -> None:
        self.sink = sink
        self._pending: deque[FeatureRecord] = deque()
        self._maxsize = maxsize
        self._batch_size = batch_size
        self._flush_s = flush_s
        self._queued = metrics.feature_records.labels("queued")
        self._sent = metrics.feature_records.labels("sent")
        self._dropped_full = metrics.feature_records.labels("dropped_full")
        self._dropped_error = metrics.feature_records.labels("dropped_send_error")
        metrics.feature_queue_depth.set_function(self._pending.__len__)
        self._due: asyncio.Event | None = None  # set when a batch is full or a record has waited flush_s
        self._expired = False
        self._timer: asyncio.TimerHandle | None = None
        self._task: asyncio.Task | None = None

    def submit(self, record: FeatureRecord) -> None:
        pending = self._pending
        if len(pending) >= self._maxsize:
            self._dropped_full.inc()
            return
        pending.append(record)
        self._queued.inc()
        if self._due is None:
            return  # not started, or stopping: the drain sends it
        if len(pending) >= self._batch_size:
            self._due.set()
        elif self._timer is None:
            self._timer = asyncio.get_running_loop().call_later(self._flush_s, self._expire)

    def _expire(self) -> None:
        """A record has waited ``flush_s``: what is pending goes, batch full or not."""
        self._timer = None
        self._expired = True
        if self._due is not None:
            self._due.set()

    def start(self) -> None:
        self._due = asyncio.Event()
        self._task = asyncio.get_running_loop().create_task(self._run(), name="feature-queue")
        if self._pending:
            self._expire()

    async def stop(self, drain_timeout_s: float = 2.0) -> None:
        """Stop sending; records still queued get one last chance within the timeout."""
        self._due = None
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        try:
            async with asyncio.timeout(drain_timeout_s):
                while self._pending:
                    await self._send(self._take_batch())
        except TimeoutError:
            pass
        await self.sink.close()

    def _take_batch(self, limit: int | None = None) -> list[FeatureRecord]:
        pending = self._pending
        return [pending.popleft() for _ in range(min(limit or self._batch_size, len(pending)))]

    async def _run(self) -> None:
        due, pending = self._due, self._pending
        assert due is not None
        while True:
            await due.wait()
            due.clear()
            if self._expired:  # everything that waited when the timer fired; later records wait for theirs
                self._expired = False
                count = len(pending)
            else:  # full batches only
                count = len(pending) - len(pending) % self._batch_size
            while count > 0:
                batch = self._take_batch(min(count, self._batch_size))
                count -= len(batch)
                await self._send(batch)
            if pending and self._timer is None:
                self._timer = asyncio.get_running_loop().call_later(self._flush_s, self._expire)

    async def _send(self, batch: list[FeatureRecord]) -> None:
        if not batch:
            return
        try:
            await self.sink.send(batch)
        except Exception as exc:  # the sink's failure must stay the sink's problem
            self._dropped_error.inc(len(batch))
            log.warning("dropped %d feature records: %s", len(batch), exc)
        else:
            self._sent.inc(len(batch))
