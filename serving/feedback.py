"""User feedback on answers, joined to the variant that gave them.

A client rates an answer by its response id (``POST /v1/feedback``). Only the gateway knows
which variant served that id, so it remembers id → (model, variant, experiment) for the
answers it relayed, in a bounded LRU that also forgets after a time, and forwards each
rating to the drift service with that join; the A/B verdict's feedback guardrail counts them.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Protocol

import aiohttp
import orjson

from inferwatch.serving.errors import NOT_FOUND, GatewayError
from inferwatch.serving.features import FeatureQueue, raise_for_status
from inferwatch.serving.metrics import GatewayMetrics
from inferwatch.serving.shared_answers import FLUSH_S, SharedAnswers
from inferwatch.serving.shared_state import SharedStateUnavailable
from inferwatch.serving.split import Assignment

MAX_ID_CHARS = 256


@dataclass(slots=True)
class Answer:
    """What the gateway remembers about one answer."""

    model: str
    variant: str
    assignment: Assignment | None  # a rating joins its unit and epoch in the A/B arms
    at: float  # monotonic seconds, for the time bound
    rated: bool = False


class AnswerMemory:
    """Response id → ``Answer`` for the last ``maxsize`` answers of the last ``ttl_s`` seconds;
    with ``shared``, also written for the other replicas (serving/shared_answers.py)."""

    def __init__(self, maxsize: int, ttl_s: float, clock: Callable[[], float] = time.monotonic,
                 shared: SharedAnswers | None = None) -> None:
        self.maxsize, self.ttl_s, self.clock, self.shared = maxsize, ttl_s, clock, shared
        self._answers: OrderedDict[str, Answer] = OrderedDict()

    def remember(self, response_id: str, model: str, variant: str, assignment: Assignment | None) -> None:
        answers = self._answers
        answers[response_id] = Answer(model, variant, assignment, self.clock())
        if len(answers) > self.maxsize:
            answers.popitem(last=False)
        if self.shared is not None:
            self.shared.remember(response_id, model, variant, assignment)

    async def lookup(self, response_id: str) -> Answer | None:
        """This replica's answer, else another replica's (``SharedStateUnavailable`` when only
        Redis could say)."""
        answer = self.find(response_id)
        if answer is not None or self.shared is None:
            return answer
        found = await self.shared.find(response_id)
        if found is None:  # given by another replica a moment ago: its batch may be on the way
            await asyncio.sleep(2 * FLUSH_S)
            found = await self.shared.find(response_id)
        if found is None:
            return None
        model, variant, assignment, _ = found
        return Answer(model, variant, assignment, self.clock())

    async def claim(self, response_id: str, answer: Answer) -> bool:
        """Whether this rating is the answer's first: across replicas through Redis, or, for this
        replica's own answer while Redis does not answer, by its own mark (another replica's
        answer then raises ``SharedStateUnavailable``: a 503, not a guess)."""
        if answer.rated:
            return False
        if self.shared is not None:
            try:
                first = await self.shared.claim(response_id)
            except SharedStateUnavailable:
                if self._answers.get(response_id) is not answer:
                    raise  # another replica's answer: only Redis can say whether it was rated
                first = not answer.rated  # this replica's own: its mark, written to Redis later
                if first:
                    self.shared.claimed_here(response_id)
        else:
            first = True
        answer.rated = answer.rated or first
        return first

    async def unclaim(self, response_id: str, answer: Answer) -> None:
        """The rating did not reach the drift service: the answer may be rated again."""
        answer.rated = False
        if self.shared is not None:
            self.shared.forget_claim(response_id)
            try:
                await self.shared.unclaim(response_id)
            except SharedStateUnavailable:
                pass  # the claim expires with the TTL; the client's retry gets a 409 until then

    def find(self, response_id: str) -> Answer | None:
        answer = self._answers.get(response_id)
        if answer is not None and self.clock() - answer.at > self.ttl_s:
            del self._answers[response_id]
            return None
        return answer

    def __len__(self) -> int:
        return len(self._answers)


@dataclass(frozen=True, slots=True)
class Rating:
    response_id: str
    score: float  # 0..1; thumbs up is 1, down 0


def parse_rating(body: bytes) -> Rating:
    """``{"response_id": ..., "score": 0..1}`` or ``{"response_id": ..., "thumbs": "up"|"down"}``."""
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise GatewayError(400, "invalid_json", f"Request body is not valid JSON: {exc}.") from None
    if not isinstance(doc, dict):
        raise GatewayError(400, "invalid_body", "Request body must be a JSON object.")
    unknown = sorted(set(doc) - {"response_id", "score", "thumbs"})
    if unknown:
        raise GatewayError(400, "invalid_feedback", f"Unknown field '{unknown[0][:64]}': send 'response_id' and "
                           "either 'score' (0..1) or 'thumbs' ('up' or 'down').", param=unknown[0][:64])
    rid = doc.get("response_id")
    if not isinstance(rid, str) or not 0 < len(rid) <= MAX_ID_CHARS:
        raise GatewayError(400, "invalid_feedback", f"Field 'response_id' must be the 'id' of an answer "
                           f"(a string of 1..{MAX_ID_CHARS} characters).", param="response_id")
    score, thumbs = doc.get("score"), doc.get("thumbs")
    if (score is None) == (thumbs is None):
        raise GatewayError(400, "invalid_feedback", "Give exactly one of 'score' (0..1) and 'thumbs' ('up' or "
                           "'down').", param="score")
    if thumbs is not None:
        if thumbs not in ("up", "down"):
            raise GatewayError(400, "invalid_feedback", "Field 'thumbs' must be 'up' or 'down'.", param="thumbs")
        return Rating(rid, 1.0 if thumbs == "up" else 0.0)
    if isinstance(score, bool) or not isinstance(score, (int, float)) or not math.isfinite(score) \
            or not 0 <= score <= 1:
        raise GatewayError(400, "invalid_feedback", "Field 'score' must be a number between 0 and 1.",
                           param="score")
    return Rating(rid, float(score))


def unknown_answer(response_id: str, memory: AnswerMemory) -> GatewayError:
    return GatewayError(404, "response_not_found",
                        f"No answer with id '{response_id[:80]}' went through this gateway recently (it remembers "
                        f"the last {memory.maxsize} answers for {memory.ttl_s:g} s); 'response_id' is the 'id' of "
                        "the response.", param="response_id", error_type=NOT_FOUND)


class RatingSink(Protocol):
    """Where the gateway sends a rating: one drift service, or all of them (FeedbackFanout)."""

    async def send(self, records: list[dict]) -> bool: ...

    async def close(self) -> None: ...


class FeedbackSink:
    """POSTs ratings to the drift service's ``/v1/feedback``."""

    def __init__(self, base_url: str, token: str | None = None, timeout_s: float = 5.0) -> None:
        self.url = f"{base_url}/v1/feedback"
        self._headers = {"content-type": "application/json"}
        if token:
            self._headers["authorization"] = f"Bearer {token}"
        self._timeout = aiohttp.ClientTimeout(total=timeout_s)
        self._session: aiohttp.ClientSession | None = None

    async def send(self, records: list[dict]) -> bool:
        """Deliver or raise (the caller answers 503, so the client can retry). True when the
        drift service had every one of these answers rated already (it counts none again)."""
        if self._session is None:
            self._session = aiohttp.ClientSession(timeout=self._timeout)
        async with self._session.post(self.url, data=orjson.dumps({"records": records}), headers=self._headers) as r:
            raise_for_status(r.status, await r.text() if r.status >= 300 else "", "drift feedback")
            try:
                duplicates = (await r.json(loads=orjson.loads)).get("duplicates", 0)
            except (ValueError, aiohttp.ContentTypeError, AttributeError):
                return False
            return duplicates == len(records)

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()


class FeedbackFanout:
    """A rating to every drift service at once. The client's rating is taken as soon as one
    of them took it (a drift pair survives losing one, and a hung one does not hold the
    client for its timeout); each that did not, or not yet, gets it later through a bounded
    queue of its own, retried as feature records are (serving/features.py), and only after
    the records that service was owed when the rating came: a drift service joins a rating
    to an experiment it has records of, so a rating must not overtake them."""

    CLOSE_WAIT_S = 2.0  # sends still out when the gateway stops: this long, then queued for the drain

    def __init__(self, sinks: dict[str, FeedbackSink], metrics: GatewayMetrics, maxsize: int,
                 features: dict[str, FeatureQueue]) -> None:
        self.sinks, self.features = sinks, features
        self.queues = {dest: FeatureQueue(_AfterRecords(sink, features.get(dest)), metrics, maxsize=maxsize,
                                          batch_size=100, flush_s=0.5, destination=dest, kind="ratings")
                       for dest, sink in sinks.items()}
        self._late: set[asyncio.Future] = set()  # sends that go on after the client's answer

    def start(self) -> None:
        for q in self.queues.values():
            q.start()

    async def send(self, records: list[dict]) -> bool:
        """Deliver to at least one drift service or raise the first failure (nothing queued:
        the client is told to retry). True when the one that took them had every answer
        rated already."""
        owed = {d: self.features[d].submitted if d in self.features else 0 for d in self.sinks}
        sending: dict[asyncio.Future[bool], str] = {asyncio.ensure_future(self.sinks[d].send(records)): d
                                                    for d in self.sinks}
        pending: set[asyncio.Future[bool]] = set(sending)
        failures: list[asyncio.Future[bool]] = []
        try:
            while pending:
                done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                failed = [t for t in done if t.cancelled() or t.exception() is not None]
                failures += failed
                if len(done) > len(failed):  # one took it; the others' sends go on, queued if they fail
                    for task in failures:
                        self._queue(sending[task], owed, records)
                    for task in pending:
                        self._late.add(task)
                        task.add_done_callback(partial(self._settle_late, dest=sending[task], owed=owed, records=records))
                    return any(t.result() for t in done if t not in failed)
        except asyncio.CancelledError:  # the client left: its rating is not taken, nowhere
            for task in pending:
                task.cancel()
            raise
        error = failures[0].exception()
        assert error is not None  # failures holds the sends that failed
        raise error

    def _settle_late(self, task: asyncio.Future, dest: str, owed: dict[str, int], records: list[dict]) -> None:
        self._late.discard(task)
        if task.cancelled() or task.exception() is not None:
            self._queue(dest, owed, records)

    def _queue(self, dest: str, owed: dict[str, int], records: list[dict]) -> None:
        for record in records:
            self.queues[dest].submit((owed[dest], record))  # type: ignore[arg-type]  # the queue is generic in its items

    async def close(self) -> None:
        if self._late:
            _, still = await asyncio.wait(set(self._late), timeout=self.CLOSE_WAIT_S)
            for task in still:
                task.cancel()
            await asyncio.gather(*still, return_exceptions=True)
        await asyncio.gather(*(q.stop() for q in self.queues.values()))  # each closes its sink


class _AfterRecords:
    """Sends queued ``(records owed, rating)`` pairs once the feature queue has delivered (or
    given up on) the records owed; until then the batch stays queued, as after a failure."""

    def __init__(self, sink: FeedbackSink, features: FeatureQueue | None) -> None:
        self.sink, self.features = sink, features

    async def send(self, items: list[tuple[int, dict]], key: str = "") -> None:
        """``key`` is not sent: each rating carries its own ``id``, which the drift service
        keeps once whichever way it came."""
        if self.features is not None and items[-1][0] > self.features.done:
            raise RuntimeError(f"waiting for {items[-1][0] - self.features.done} feature records to go first")
        await self.sink.send([record for _, record in items])

    async def close(self) -> None:
        await self.sink.close()
