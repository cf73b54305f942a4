"""Fleet-wide drift from Prometheus histogram buckets: no raw samples needed.

Every gateway replica exports the same ``le`` buckets, so ``sum by (le)
(increase(metric_bucket{selector}[window]))`` evaluated at two instants gives the
reference and current distributions over the whole fleet. Cumulative ``le`` counts become
per-bin counts with the bucket bounds as edges (the ``+Inf`` bucket is the open last bin),
and the same methods as for ingested records apply.
"""

from __future__ import annotations

import math
import re
from typing import Any

import numpy as np
import requests

from inferwatch.drift.binning import Edges, Histogram, merge, merged_bins, merged_edges, quantile_starts
from inferwatch.drift.calibration import null_distribution, size_band
from inferwatch.drift.methods import METHODS, DriftResult
from inferwatch.drift.verdicts import Policy, method_results

METRIC_NAME = re.compile(r"^[a-zA-Z_:][a-zA-Z0-9_:]*$")
SELECTOR = re.compile(r'^(\s*[a-zA-Z_][a-zA-Z0-9_]*\s*(=|!=|=~|!~)\s*"[^"\\]*"\s*,?)*$')


class SourceError(Exception):
    def __init__(self, status: int, message: str, field: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.field = field  # the query parameter to blame, if one is


def buckets_to_histogram(le_counts: dict[float, float]) -> Histogram:
    """Cumulative ``le`` counts -> per-bin counts. Edges: 0 (or the lowest bound minus its
    width, for negative bounds), then every finite bound; +Inf closes the open last bin."""
    bounds = sorted(b for b in le_counts if math.isfinite(b))
    if len(bounds) < 2 or math.inf not in le_counts:
        raise SourceError(422, "the metric needs at least two finite le buckets and +Inf")
    cumulative = np.array([le_counts[b] for b in bounds] + [le_counts[math.inf]])
    counts = np.diff(np.concatenate([[0.0], cumulative]))
    counts = np.maximum(np.round(counts), 0).astype(np.int64)  # increase() extrapolates: not integers
    first = 0.0 if bounds[0] > 0 else bounds[0] - (bounds[1] - bounds[0])
    # bins: (first, b0], (b0, b1], ..., (b_{k-2}, b_{k-1}], (b_{k-1}, +Inf) -> last edge is a stand-in
    top = bounds[-1] + (bounds[-1] - bounds[-2])
    edges = Edges(np.array([first, *bounds, top]), log_spaced=False)
    return Histogram(edges, counts)


class PrometheusSource:
    def __init__(self, base_url: str, timeout_s: float = 10.0) -> None:
        self.base_url = base_url.rstrip("/")
        self.timeout_s = timeout_s

    def buckets(self, metric: str, selector: str, at: float, window_s: float) -> dict[float, float]:
        query = f"sum by (le) (increase({metric}_bucket{{{selector}}}[{int(window_s)}s]))"
        try:
            resp = requests.get(f"{self.base_url}/api/v1/query", params={"query": query, "time": str(at)},
                                timeout=self.timeout_s)
        except requests.RequestException as exc:
            raise SourceError(503, f"Prometheus at {self.base_url} is not reachable: {exc}") from None
        body = resp.json() if resp.headers.get("content-type", "").startswith("application/json") else {}
        if resp.status_code != 200 or body.get("status") != "success":
            raise SourceError(502, f"Prometheus refused the query: {body.get('error', resp.text[:200])}")
        return {float(r["metric"]["le"]): float(r["value"][1]) for r in body["data"]["result"] if "le" in r["metric"]}

    def drift(self, metric: str, selector: str, reference_end: float, current_end: float, window_s: float,
              policy: Policy = Policy()) -> dict[str, Any]:
        if not METRIC_NAME.match(metric) or not metric:
            raise SourceError(400, "'metric' must be a histogram's base name, e.g. inferwatch_gateway_request_prompt_tokens",
                              field="metric")
        if not SELECTOR.match(selector):
            raise SourceError(400, "'selector' must be label matchers like model=\"x\",variant=\"y\"", field="selector")
        if not all(math.isfinite(v) for v in (reference_end, current_end, window_s)):
            raise SourceError(400, "'reference_end', 'current_end' and 'window' must be finite numbers", field="reference_end")
        if window_s <= 0 or reference_end >= current_end:
            raise SourceError(400, "'reference_end' must be before 'current_end', and 'window' positive", field="reference_end")
        ref = buckets_to_histogram(self.buckets(metric, selector, reference_end, window_s))
        cur = buckets_to_histogram(self.buckets(metric, selector, current_end, window_s))
        if not np.array_equal(ref.edges.values, cur.edges.values):
            raise SourceError(422, "the bucket layout changed between the two ranges")
        results = fleet_results(ref, cur, policy)
        return {
            "metric": metric, "selector": selector, "window_s": window_s, "alpha": policy.alpha,
            "reference": {"end": reference_end, "counts": ref.counts.tolist()},
            "current": {"end": current_end, "counts": cur.counts.tolist()},
            "le": [float(x) for x in ref.edges.values[1:-1]] + ["+Inf"],
            "methods": {m: {"score": r.score, "threshold": r.threshold, "threshold_source": r.source,
                            "calibration_n": r.calibration_n, "p_value": r.p_value, "direction": r.direction,
                            "drifted": r.drifted, "status": r.status} for m, r in results.items()},
        }


def fleet_results(ref: Histogram, cur: Histogram, policy: Policy) -> dict[str, DriftResult]:
    """Every numeric method on two bucket histograms, on the reference's quantile bins and
    calibrated like the service's windows (both ranges are samples of the fleet's traffic)."""
    numeric = [m for m, s in METHODS.items() if s.applies_to == "numeric"]
    fixed = dict(policy.fixed)
    if min(ref.total, cur.total) < policy.min_samples:
        return {m: DriftResult(m, METHODS[m].kind, METHODS[m].direction, None, fixed.get(m, policy.alpha), False,
                               "insufficient_data", f"{ref.total} and {cur.total} observations; at least "
                               f"{policy.min_samples} each needed") for m in numeric}
    bins = merged_bins(ref.total)
    starts = quantile_starts(ref.counts, bins)
    edges = merged_edges(ref.edges, starts)
    null = null_distribution(ref.counts, ref.edges, size_band(cur.total), bins, policy.resamples)
    return method_results(merge(ref, starts, edges), merge(cur, starts, edges), null, policy, (ref, cur))
