"""Chat requests through the gateway, as the scenarios shape them: a number of clients for a
while, each at a pace, all drawing on one request budget so a demo can never send more than
it announced. Outcomes are counted by HTTP status (0: no answer within the client's timeout
or a refused connection), the client-side truth each scenario reports next to the panels."""

from __future__ import annotations

import random
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import requests

WORDS = ("latency", "token", "cache", "queue", "model", "gateway", "replica", "budget", "drift", "canary",
         "prompt", "answer", "metric", "alert", "page", "trace")  # ~3.4 tokens a word to the tiny model
ERROR_PAUSE_S = 1.0


class Budget:
    """Requests left to the whole demo; thread-safe."""

    def __init__(self, requests_left: int) -> None:
        self.left = requests_left
        self._lock = threading.Lock()

    def take(self) -> bool:
        with self._lock:
            if self.left <= 0:
                return False
            self.left -= 1
            return True


@dataclass(frozen=True)
class Ask:
    """One request's shape."""

    model: str
    prompt_words: int
    max_tokens: int
    stream: bool
    user: str | None = None


def prompt(words: int, rng: random.Random) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(words))


def short_asks(model: str, seed: int = 0, adapters: Sequence[str] = ()) -> Callable[[int], Ask]:
    """Everyday traffic: a handful of words, short answers, half of them streamed; every fourth
    request to one of the model's LoRA ``adapters`` in turn, if it has any."""
    rng = random.Random(seed)

    def ask(i: int) -> Ask:
        target = adapters[i // 4 % len(adapters)] if adapters and i % 4 == 3 else model
        return Ask(target, rng.randint(3, 12), rng.randint(8, 32), i % 2 == 0)
    return ask


class Load:
    """``api_keys``: request i sends the i-th key, round the list (None: no key), so every
    tenant of the stack takes part in every scenario."""

    def __init__(self, gateway: str, budget: Budget, api_key: str | None = None, timeout_s: float = 30.0,
                 api_keys: tuple[str | None, ...] = ()) -> None:
        self.gateway = gateway.rstrip("/")
        self.budget = budget
        self.keys = api_keys or (api_key,)
        self.timeout_s = timeout_s
        self._local = threading.local()
        self._sent = iter(range(1 << 62))

    def send(self, ask: Ask, rng: random.Random) -> int:
        """One chat completion, read to its end; its status, 0 when none came."""
        session = getattr(self._local, "session", None) or requests.Session()
        self._local.session = session
        key = self.keys[next(self._sent) % len(self.keys)]
        headers = {"authorization": f"Bearer {key}"} if key else {}
        body = {"model": ask.model, "max_tokens": ask.max_tokens, "stream": ask.stream,
                "messages": [{"role": "user", "content": prompt(ask.prompt_words, rng)}]}
        if ask.user:
            body["user"] = ask.user
        try:
            with session.post(f"{self.gateway}/v1/chat/completions", json=body, headers=headers,
                              stream=ask.stream, timeout=self.timeout_s) as r:
                for _ in r.iter_content(chunk_size=None):
                    pass
                return r.status_code
        except requests.RequestException:
            return 0

    def run(self, seconds: float, clients: int, asks: Callable[[int], Ask], per_client_rps: float | None = None,
            stop: Callable[[], bool] = lambda: False) -> Counter[int]:
        """``clients`` concurrent clients, each sending one request after another (at most
        ``per_client_rps``) until the time is up, ``stop()`` turns true or the budget runs out."""
        deadline = time.monotonic() + seconds
        counts: Counter[int] = Counter()
        lock = threading.Lock()
        numbers = iter(range(1 << 62))

        def client(k: int) -> None:
            rng = random.Random(k)
            while time.monotonic() < deadline and not stop() and self.budget.take():
                started = time.monotonic()
                with lock:
                    i = next(numbers)
                code = self.send(asks(i), rng)
                with lock:
                    counts[code] += 1
                pause = 1 / per_client_rps if per_client_rps else 0.0
                if code != 200:  # as a client would: no hammering of a failing service
                    pause = max(pause, ERROR_PAUSE_S)
                time.sleep(max(0.0, min(pause - (time.monotonic() - started), deadline - time.monotonic())))

        with ThreadPoolExecutor(clients, thread_name_prefix="demo-client") as pool:
            for f in [pool.submit(client, k) for k in range(clients)]:
                f.result()
        return counts
