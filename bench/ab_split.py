"""What the A/B split adds per request: the gateway's own request preprocessing (read, parse,
validate, route, build the upstream body) timed in one process, for the same request to a
model without an experiment and to one with (sticky hash, counter, served-name rewrite), and
the per-answer and per-chunk renaming of the model back to the public name. No network: the
difference is the split's cost alone, which a load test's noise (tens of microseconds) hides.
Timed in this process's CPU time (``time.process_time``), not wall time: other processes
on the machine then cost it only what they cost its caches, not the time it waits for a core.

    python bench/ab_split.py [--runs 7] [--n 20000]
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from opentelemetry import trace  # noqa: E402
from prometheus_client import CollectorRegistry  # noqa: E402

from inferwatch.serving.feedback import AnswerMemory  # noqa: E402
from inferwatch.serving.gateway import Gateway  # noqa: E402
from inferwatch.serving.relay import _RESPONSE_ID  # noqa: E402
from inferwatch.serving.request import RequestState  # noqa: E402
from inferwatch.serving.settings import GatewaySettings  # noqa: E402
from inferwatch.serving.split import Assignment  # noqa: E402
from inferwatch.serving.validation import ModelInfo  # noqa: E402

EXPERIMENT = """
experiments:
  public:
    name: bench
    variants:
      - {name: v1, upstream_url: "http://127.0.0.1:9", model: served-a, weight: 0.5}
      - {name: v2, upstream_url: "http://127.0.0.1:10", model: served-b, weight: 0.5}
"""
CHUNK = (b'data: {"id":"chatcmpl-0123456789abcdef","object":"chat.completion.chunk","created":1764400000,'
         b'"model":"served-a","choices":[{"index":0,"delta":{"content":" token"},"logprobs":null,'
         b'"finish_reason":null}]}\n\n')
ANSWER = (b'{"id":"chatcmpl-0123456789abcdef","object":"chat.completion","created":1764400000,"model":"served-a",'
          b'"choices":[{"index":0,"message":{"role":"assistant","content":"' + b"word " * 40 + b'"},'
          b'"finish_reason":"length"}],"usage":{"prompt_tokens":12,"completion_tokens":40,"total_tokens":52}}')


def body(model: str) -> bytes:
    return (b'{"model":"%s","messages":[{"role":"user","content":"hi"}],"max_tokens":10,"user":"user-42"}'
            % model.encode())


class BufferedRequest:
    """What ``Proxy.preprocess`` reads of an exchange: its headers, and its body (whole here)."""

    def __init__(self, data: bytes) -> None:
        self.headers = {"content-type": "application/json", "content-length": str(len(data))}
        self._data = data

    async def read_body(self, limit: int) -> bytes:
        return self._data


def build(experiment_file: Path) -> Gateway:
    settings = GatewaySettings(experiment_file=experiment_file, max_tokens_limit=32768)
    gw = Gateway(settings, CollectorRegistry())
    gw.upstream.models = {"plain": ModelInfo("plain", 4096)}
    for upstream, served in zip(list(gw.experiments.upstreams.values())[1:], ("served-a", "served-b")):
        upstream.models = {served: ModelInfo(served, 4096)}
    return gw


async def preprocess_us(gw: Gateway, model: str, n: int) -> float:
    data = body(model)
    ctx = trace.set_span_in_context(trace.INVALID_SPAN)
    start = time.process_time()
    for _ in range(n):
        state = RequestState("chat", "/v1/chat/completions", 0.0, 0.0, trace.INVALID_SPAN, ctx,
                             gw.settings.variant, gw.upstream)
        await gw.proxy.preprocess(BufferedRequest(data), state)  # type: ignore[arg-type]
    return (time.process_time() - start) / n * 1e6


def rename_us(n: int) -> tuple[float, float]:
    old, new = b'"model":"served-a"', b'"model":"public"'
    start = time.process_time()
    for _ in range(n):
        if old in ANSWER:
            ANSWER.replace(old, new, 1)
    answer = (time.process_time() - start) / n * 1e6
    start = time.process_time()
    for _ in range(n):
        CHUNK.replace(old, new)
    return answer, (time.process_time() - start) / n * 1e6


ASSIGNMENT = Assignment("bench", 0, 0.5, "0123456789abcdef")


def remember_us(n: int) -> float:
    memory = AnswerMemory(100_000, 86_400.0)
    ids = [f"chatcmpl-{i:016x}" for i in range(n)]
    start = time.process_time()
    for rid in ids:
        _RESPONSE_ID.search(CHUNK)
        memory.remember(rid, "public", "v1", ASSIGNMENT)
    return (time.process_time() - start) / n * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--n", type=int, default=20_000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        f = Path(tmp) / "experiments.yaml"
        f.write_text(EXPERIMENT)
        gw = build(f)
        gc.freeze()  # as the gateway process does once started (inferwatch/cli.py: _tune_gc)
        gc.set_threshold(20_000, 50, 100)
        plain, split, answers, chunks, remember = [], [], [], [], []
        for _ in range(args.runs):
            plain.append(asyncio.run(preprocess_us(gw, "plain", args.n)))
            split.append(asyncio.run(preprocess_us(gw, "public", args.n)))
            a, c = rename_us(args.n * 5)
            answers.append(a)
            chunks.append(c)
            remember.append(remember_us(args.n * 10))
    med = statistics.median
    print(f"| per request, median of {args.runs} runs of {args.n:,} | µs |")
    print("| --- | ---: |")
    print(f"| preprocess, model without experiment | {med(plain):.2f} |")
    print(f"| preprocess, model with experiment (hash, count, rewrite `model`) | {med(split):.2f} |")
    print(f"| **added by the split** | **{med(split) - med(plain):.2f}** (target 5) |")
    print(f"| rename the model in a whole answer | {med(answers):.2f} |")
    print(f"| rename the model in one stream chunk | {med(chunks):.3f} |")
    print(f"| find the answer's id and remember it for feedback (every request, experiment or not) | "
          f"{med(remember):.2f} |")


if __name__ == "__main__":
    main()
