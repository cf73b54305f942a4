"""Per-request feature records for the drift service, behind a bounded queue per drift
service.

The record is the drift service's contract (drift/feature_record.py): the gateway fills
its fields, the drift service checks them. A slow or dead drift service must never slow
or fail a request: ``FeatureQueue.submit`` never waits, records beyond the buffer's size
are dropped and counted, and sending happens in batches on a background task.

A batch the drift service could not take (down, restarting, 5xx, timeout) stays at the
head of its queue and is sent again with backoff, so a drift service back within the
queue's size of records misses nothing; only a batch it refuses for good (a 4xx: invalid,
unauthorized, too large) is dropped. A batch is sent again as it was, under the same key
(``Idempotency-Key``): a drift service that took a try whose answer never came back (it
hung past the timeout, then went on) stores the batch once. With several drift services (a pair, as Prometheus
runs for high availability) each has its own queue: one down or slow neither slows nor
drops what goes to the other (``FeatureFanout``).
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections import deque
from typing import Protocol

import aiohttp

from inferwatch.drift.feature_record import FeatureRecord, ingest_body
from inferwatch.serving.metrics import GatewayMetrics

log = logging.getLogger(__name__)


class FeatureSink(Protocol):
    async def send(self, batch: list, key: str) -> None:
        """Deliver a batch or raise: ``SinkRejected`` drops it, anything else retries it.
        ``key`` names the batch, the same on each try of it."""

    async def close(self) -> None: ...


class SinkRejected(Exception):
    """The destination refused the batch for good (a 4xx other than 408 and 429): sending it
    again cannot help."""


def raise_for_status(status: int, text: str, what: str) -> None:
    if status < 300:
        return
    message = f"{what} answered {status}: {text[:300]}"
    if 400 <= status < 500 and status not in (408, 429):
        raise SinkRejected(message)
    raise RuntimeError(message)


class MemorySink:
    """Keeps the last ``maxlen`` records in memory (for tests and local inspection)."""

    def __init__(self, maxlen: int = 10_000) -> None:
        self.records: deque[FeatureRecord] = deque(maxlen=maxlen)

    async def send(self, batch: list[FeatureRecord], key: str = "") -> None:
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

    async def send(self, batch: list[FeatureRecord], key: str = "") -> None:
        if self._session is None:
            self._session = aiohttp.ClientSession(timeout=self._timeout)
        headers = {**self._headers, "idempotency-key": key} if key else self._headers
        async with self._session.post(self.url, data=await encoded(batch), headers=headers) as resp:
            raise_for_status(resp.status, await resp.text() if resp.status >= 300 else "", "drift ingest")

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()


ENCODE_SLICE = 50  # records encoded between turns of the event loop: ~0.15 ms


async def encoded(batch: list[FeatureRecord]) -> bytes:
    """``ingest_body(batch)``, a slice at a time with the event loop's turn between slices.
    A 500-record batch is ~1.5 ms of encoding: in one go, every request that came meanwhile
    waited for it, and that was most of the gateway's p99 with records on
    (bench/gateway_overhead.py)."""
    if len(batch) <= ENCODE_SLICE:
        return ingest_body(batch)
    parts = []
    for start in range(0, len(batch), ENCODE_SLICE):
        parts.append(ingest_body(batch[start:start + ENCODE_SLICE])[len(b'{"records":['):-2])
        await asyncio.sleep(0)
    return b'{"records":[' + b",".join(parts) + b"]}"


class FeatureQueue:
    """Records wait in a bounded buffer; a background task sends them in batches, when a
    batch is full or ``flush_s`` after the first record of one arrived.

    Submitting is an append and a counter: the sender wakes once per batch, not once per
    record (at one request at a time, a queue ``get`` per record was a task switch and a
    timeout per request, measurable in bench/gateway_overhead.py)."""

    def __init__(self, sink: FeatureSink, metrics: GatewayMetrics, *, maxsize: int, batch_size: int,
                 flush_s: float, destination: str = "drift", kind: str = "features") -> None:
        self.sink = sink
        self._pending: deque = deque()
        self._maxsize = maxsize
        self._batch_size = batch_size
        self._flush_s = flush_s
        self._destination = destination
        counted, depth = ((metrics.feature_records, metrics.feature_queue_depth) if kind == "features"
                          else (metrics.rating_deliveries, metrics.rating_queue_depth))
        self._queued = counted.labels("queued", destination)
        self._sent = counted.labels("sent", destination)
        self._dropped_full = counted.labels("dropped_full", destination)
        self._dropped_error = counted.labels("dropped_send_error", destination)
        self._send_failures = metrics.delivery_failures.labels(kind, destination)
        self.submitted = 0  # records taken into the queue, ever
        self.done = 0  # records that left it: sent, or dropped after they were taken
        depth.labels(destination).set_function(self._pending.__len__)
        self._head: tuple[int, str] | None = None  # (size, key) of the batch a failed try left at the head
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
        self.submitted += 1
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
                    if not await self._send_head(min(self._batch_size, len(self._pending))):
                        await asyncio.sleep(RETRY_FIRST_S)
        except TimeoutError:
            pass
        if self._pending:
            self._drop_head(len(self._pending), "not delivered before the gateway stopped")
        await self.sink.close()

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
            backoff = RETRY_FIRST_S
            while count > 0 and pending:
                if sent := await self._send_head(min(count, self._batch_size, len(pending))):
                    count -= sent
                    backoff = RETRY_FIRST_S
                else:  # still at the head: again after a pause, with what arrived meanwhile
                    await asyncio.sleep(backoff)
                    backoff = min(RETRY_MAX_S, backoff * 2)
                    count = len(pending)
            if pending and self._timer is None:
                self._timer = asyncio.get_running_loop().call_later(self._flush_s, self._expire)

    async def _send_head(self, size: int) -> int:
        """Send the first ``size`` records, or the batch a failed try left at the head (the
        same records under the same key); they leave the queue once delivered or refused for
        good. Returns how many left: 0 when they stay for another try."""
        pending = self._pending
        size, key = self._head or (size, uuid.uuid4().hex)
        batch = [pending[i] for i in range(size)]
        try:
            await self.sink.send(batch, key)
        except SinkRejected as exc:
            self._head = None
            self._drop_head(size, exc)
            return size
        except Exception as exc:  # the sink's failure must stay the sink's problem
            self._head = (size, key)
            self._send_failures.inc()
            log.warning("%d records for %s not delivered, will retry: %s", len(batch), self._destination, exc)
            return 0
        self._head = None
        for _ in range(size):
            pending.popleft()
        self.done += size
        self._sent.inc(size)
        return size

    def _drop_head(self, size: int, reason: object) -> None:
        for _ in range(size):
            self._pending.popleft()
        self.done += size
        self._dropped_error.inc(size)
        log.warning("dropped %d records for %s: %s", size, self._destination, reason)


RETRY_FIRST_S = 0.25
RETRY_MAX_S = 10.0


class FeatureFanout:
    """Each record to every drift service's own queue."""

    def __init__(self, queues: list[FeatureQueue]) -> None:
        self.queues = queues
        self._submits = [q.submit for q in queues]

    def submit(self, record: FeatureRecord) -> None:
        for submit in self._submits:
            submit(record)

    def start(self) -> None:
        for q in self.queues:
            q.start()

    async def stop(self, drain_timeout_s: float = 2.0) -> None:
        await asyncio.gather(*(q.stop(drain_timeout_s) for q in self.queues))
