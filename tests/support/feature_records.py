"""Feature records like the gateway sends, drawn from known distributions."""

from __future__ import annotations

import numpy as np
import orjson


def records(n: int, t0: float, t1: float, *, seed: int, prompt_mu: float = 5.0, ttft_scale: float = 0.1,
            model: str = "m", variant: str = "v1", length_share: float = 0.2) -> list[dict]:
    rng = np.random.default_rng(seed)
    prompt = np.maximum(1, rng.lognormal(prompt_mu, 0.8, n).round()).astype(int)
    completion = np.maximum(1, rng.lognormal(4.0, 0.7, n).round()).astype(int)
    ttft = rng.gamma(2.0, ttft_scale, n)
    tpot = rng.gamma(4.0, 0.005, n)
    finished = np.sort(rng.uniform(t0, t1, n))
    reasons = np.where(rng.random(n) < length_share, "length", "stop")
    out = []
    for i in range(n):
        e2e = float(ttft[i] + tpot[i] * completion[i])
        out.append({
            "model": model, "variant": variant, "route": "chat", "stream": True,
            "started_at": float(finished[i] - e2e), "finished_at": float(finished[i]), "status": 200,
            "prompt_tokens": int(prompt[i]), "completion_tokens": int(completion[i]), "ttft_s": float(ttft[i]),
            "tpot_s": float(tpot[i]), "e2e_s": e2e, "finish_reason": str(reasons[i]),
            "mean_logprob": float(-rng.gamma(2.0, 0.5)),
        })
    # the model layer's fields from a generator of their own: the fields above stay what they were
    more = np.random.default_rng(seed + 7919)
    repetition = more.beta(1.0, 60.0, n)
    empty = more.random(n) < 0.01
    temperature = more.choice(["default", "0-0.5", "0.5-1"], n, p=[0.5, 0.2, 0.3])
    max_tokens = more.choice(["default", "65-256", "257-1024"], n, p=[0.6, 0.3, 0.1])
    tools = more.random(n) < 0.1
    for i, rec in enumerate(out):
        rec.update(repetition=float(repetition[i]), loop=False, empty=bool(empty[i]),
                   temperature_bin=str(temperature[i]), top_p_bin="default", max_tokens_bin=str(max_tokens[i]),
                   n_bin="1", tools=bool(tools[i]), response_format="none")
    return out


def body(recs: list[dict]) -> bytes:
    return orjson.dumps({"records": recs})
