"""Simulated users of an A/B experiment, as unequal as real ones.

Each user has an activity (requests per hour, log-normal: a few send most of the requests)
and their own typical prompt and answer lengths, first-token time and error and truncation
propensities. Users are assigned by the gateway's own split (``serving.split.Split``:
keyed BLAKE2b buckets, sticky while the weights stay put, ramping keeps the canary's
users), so the records carry exactly what the gateway's would: experiment, weight epoch,
the variant's weight and the hashed unit.

``effect`` multiplies the treatment's first-token time (0.05: 5 % slower), for every user or
only the ``affected`` ones (the heaviest, say: ``heaviest``); ``lose`` drops what some of
one arm's users sent, as a broken logging path would.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import orjson

from inferwatch.drift.ab.units import COLUMNS, record_values
from inferwatch.serving.split import ExperimentSpec, Split

MODEL, EXPERIMENT = "llama", "canary"


@dataclass(frozen=True)
class Users:
    ids: list[str]
    rate: np.ndarray  # requests per hour
    log_prompt: np.ndarray  # each user's typical prompt length (log tokens)
    log_answer: np.ndarray
    ttft_base: np.ndarray  # each user's typical first-token time (s)
    error_p: np.ndarray
    length_p: np.ndarray


def users(n: int, requests_per_user: float, hours: float, rng: np.random.Generator, sigma: float = 1.2) -> Users:
    """``requests_per_user`` on average over ``hours``, log-normal with ``sigma`` (1.2 makes an
    arm's request count vary about 20x more than a binomial over requests)."""
    activity = rng.lognormal(-sigma * sigma / 2, sigma, n) * requests_per_user / hours
    log_prompt = rng.normal(5.5, 0.7, n)
    return Users([f"user-{rng.integers(1 << 62)}-{i}" for i in range(n)], activity, log_prompt,
                 rng.normal(4.2, 0.6, n), 0.05 + 0.0004 * np.exp(log_prompt) * rng.lognormal(0, 0.3, n),
                 rng.beta(0.5, 40, n), rng.beta(1, 8, n))


def split(weights: tuple[float, float], epoch: int) -> Split:
    spec = ExperimentSpec.model_validate({"name": EXPERIMENT, "salt": "sim", "variants": [
        {"name": "control", "upstream_url": "http://a", "model": MODEL, "weight": weights[0]},
        {"name": "treatment", "upstream_url": "http://b", "model": MODEL, "weight": weights[1]}]})
    return Split.of(MODEL, spec, weights, epoch)


@dataclass(frozen=True)
class Requests:
    """Requests of one span, column by column."""

    user: np.ndarray  # index into Users
    arm: np.ndarray  # 0 control, 1 treatment
    unit: list[str]  # the hashed unit id the gateway would record
    finished_at: np.ndarray
    status: np.ndarray
    finish_reason: list[str]
    numeric: dict[str, np.ndarray]
    weight: np.ndarray
    epoch: int


def heaviest(u: Users, share: float) -> np.ndarray:
    """The ``share`` most active users, as a mask over users."""
    return u.rate >= np.quantile(u.rate, 1 - share)


def requests(u: Users, s: Split, t0: float, t1: float, rng: np.random.Generator, effect: float = 0.0,
             affected: np.ndarray | None = None) -> Requests:
    counts = rng.poisson(u.rate * (t1 - t0) / 3600)
    user = np.repeat(np.arange(len(u.ids)), counts)
    assigned = [s.assign(u.ids[i]) for i in range(len(u.ids))]
    arm = np.array([assigned[i][0] for i in user], dtype=int)
    n = user.size
    hit = (arm == 1) if affected is None else (arm == 1) & affected[user]
    ttft = u.ttft_base[user] * rng.lognormal(0, 0.5, n) * np.where(hit, 1 + effect, 1.0)
    answer = np.maximum(1, np.exp(u.log_answer[user] + rng.normal(0, 0.6, n))).round()
    tpot = rng.gamma(4.0, 0.005, n)
    status = np.where(rng.random(n) < u.error_p[user], 500, 200)
    reason = np.where(status >= 500, None, np.where(rng.random(n) < u.length_p[user], "length", "stop"))
    ok = status < 500
    numeric = {"prompt_tokens": np.maximum(1, np.exp(u.log_prompt[user] + rng.normal(0, 0.5, n))).round(),
               "completion_tokens": np.where(ok, answer, np.nan), "ttft_s": np.where(ok, ttft, np.nan),
               "tpot_s": np.where(ok, tpot, np.nan), "e2e_s": np.where(ok, ttft + tpot * answer, 0.05),
               "mean_logprob": np.where(ok, -rng.gamma(2.0, 0.3, n), np.nan),
               "repetition": np.where(ok, rng.beta(1.0, 60.0, n), np.nan)}
    weights = np.array(s.weights)
    return Requests(user, arm, [assigned[i][1].unit for i in user], np.sort(rng.uniform(t0, t1, n)), status,
                    reason.tolist(), numeric, weights[arm], s.epoch)


def concat(a: Requests, b: Requests) -> Requests:
    """Two spans of one epoch as one."""
    return Requests(np.concatenate([a.user, b.user]), np.concatenate([a.arm, b.arm]), a.unit + b.unit,
                    np.concatenate([a.finished_at, b.finished_at]), np.concatenate([a.status, b.status]),
                    a.finish_reason + b.finish_reason, {f: np.concatenate([a.numeric[f], b.numeric[f]]) for f in a.numeric},
                    np.concatenate([a.weight, b.weight]), a.epoch)


def lose(r: Requests, arm: int, lost: np.ndarray) -> Requests:
    """``r`` without what the ``lost`` users (a mask over users) of ``arm`` sent."""
    return subset(r, ~((r.arm == arm) & lost[r.user]))


def subset(r: Requests, keep: np.ndarray) -> Requests:
    """The requests where ``keep`` (a mask over requests) holds: a look at a time, say."""
    idx = np.flatnonzero(keep).tolist()
    return Requests(r.user[keep], r.arm[keep], [r.unit[i] for i in idx], r.finished_at[keep], r.status[keep],
                    [r.finish_reason[i] for i in idx], {f: v[keep] for f, v in r.numeric.items()}, r.weight[keep],
                    r.epoch)


def unit_tables(r: Requests, per_request: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """Each arm's per-unit sums, as the ledger would hold them (``per_request``: as if every
    request were its own unit, the mistake the unit of analysis fixes)."""
    values = record_values(r.status, r.finish_reason, r.numeric, answers(r))
    out = []
    for arm in (0, 1):
        rows = np.flatnonzero(r.arm == arm)
        keys = rows if per_request else r.user[rows]
        _, inverse = np.unique(keys, return_inverse=True)
        table = np.zeros((int(inverse.max()) + 1 if rows.size else 0, len(COLUMNS)))
        np.add.at(table, inverse, values[rows])
        out.append(table)
    return out[0], out[1]


def lead_in_tables(lead_in: Requests, r: Requests, n_users: int) -> tuple[np.ndarray, np.ndarray]:
    """Each arm's lead-in sums (what its users sent in ``lead_in``), rows aligned with
    ``unit_tables(r)``: the CUPED covariate as the ledger would join it."""
    per_user = np.zeros((n_users, len(COLUMNS)))
    np.add.at(per_user, lead_in.user, record_values(lead_in.status, lead_in.finish_reason, lead_in.numeric,
                                                    answers(lead_in)))
    return per_user[np.unique(r.user[r.arm == 0])], per_user[np.unique(r.user[r.arm == 1])]


def answers(r: Requests) -> list[str | None]:
    """What each answer is, as the drift service reads it from a record: text, or none for a failure."""
    return ["text" if status < 500 else None for status in r.status.tolist()]


def feature_records(r: Requests) -> list[dict]:
    """The gateway's feature records of these requests."""
    names = ("control", "treatment")
    out = []
    for i in range(r.user.size):
        e2e = float(r.numeric["e2e_s"][i])
        value = {k: (None if np.isnan(v[i]) else float(v[i])) for k, v in r.numeric.items()}
        out.append({"model": MODEL, "variant": names[r.arm[i]], "route": "chat", "stream": True,
                    "started_at": float(r.finished_at[i]) - e2e, "finished_at": float(r.finished_at[i]),
                    "status": int(r.status[i]), "prompt_tokens": int(value["prompt_tokens"]),
                    "completion_tokens": None if value["completion_tokens"] is None else int(value["completion_tokens"]),
                    "ttft_s": value["ttft_s"], "tpot_s": value["tpot_s"], "e2e_s": e2e,
                    "finish_reason": r.finish_reason[i], "mean_logprob": value["mean_logprob"],
                    "repetition": value["repetition"], "empty": None if r.status[i] >= 500 else False,
                    "loop": None if r.status[i] >= 500 else False,
                    "experiment": EXPERIMENT, "unit": r.unit[i], "epoch": r.epoch, "weight": float(r.weight[i])})
    return out


def bodies(recs: list[dict], size: int = 5000) -> list[bytes]:
    return [orjson.dumps({"records": recs[i:i + size]}) for i in range(0, len(recs), size)]
