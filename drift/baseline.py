"""A segment's baseline: the histograms and samples a verdict compares the current window
with, how they were made, and its stored form (every value checked on the way in)."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import numpy as np

from inferwatch.drift.binning import CategoricalCounts, Histogram
from inferwatch.drift.schema import FEATURES, NUMERIC_FEATURES, Batch, BatchError, NumericFeature
from inferwatch.drift.verdicts import Reference, Windows, analysis_edges, reference_of

BASELINE_SAMPLE = 5000  # raw values per numeric feature kept with a frozen baseline, for exact tests


@dataclass(frozen=True)
class Baseline:
    histograms: Windows
    samples: dict[str, np.ndarray]
    records: int
    source: dict[str, Any]
    starts: dict[str, np.ndarray]  # per numeric feature: how the fine bins merge (quantiles)
    created_at: float = 0.0

    @cached_property
    def reference(self) -> Reference:
        """Keyed by content: calibrations depend on the counts alone, and a key that outlives
        its baseline (a calibration still running when the baseline is replaced) can never
        be taken for another baseline's."""
        digest = hashlib.blake2b(digest_size=16)
        for name in sorted(self.histograms):
            digest.update(name.encode())
            digest.update(self.histograms[name].counts.tobytes())
        return Reference(self.histograms, self.starts, f"baseline:{digest.hexdigest()}")



def subset(batch: Batch, rows: np.ndarray) -> Batch:
    return Batch(
        size=rows.size, model=[batch.model[i] for i in rows], variant=[batch.variant[i] for i in rows],
        finished_at=batch.finished_at[rows], status=batch.status[rows],
        numeric={k: v[rows] for k, v in batch.numeric.items()},
        finish_reason=[batch.finish_reason[i] for i in rows], experiment=[batch.experiment[i] for i in rows],
        unit=[batch.unit[i] for i in rows], epoch=batch.epoch[rows], weight=batch.weight[rows],
        categorical={k: [v[i] for i in rows] for k, v in batch.categorical.items()},
    )


def make_baseline(hists: Windows, samples: dict[str, np.ndarray], records: int, source: dict[str, Any],
              created_at: float, starts: dict[str, np.ndarray] | None = None) -> Baseline:
    plan = reference_of(hists, "").starts if starts is None else starts
    return Baseline(hists, samples, records, source, plan, created_at)


def baseline_doc(b: Baseline) -> dict[str, Any]:
    edges = {name: e.values.tolist() for name, e in analysis_edges(b.reference).items()}
    return {"histograms": {k: h.counts.tolist() for k, h in b.histograms.items()},
            "samples": {k: v.tolist() for k, v in b.samples.items()}, "records": b.records, "source": b.source,
            "edges": edges, "created_at": b.created_at}


MAX_COUNT = 10**12  # per bin; sums stay far inside int64


def baseline_from_doc(doc: dict[str, Any]) -> Baseline:
    """A baseline from its stored or uploaded form; every value checked, so a bad upload is a
    422 naming the feature, never an overflow later."""
    hists: Windows = {}
    given = doc.get("histograms")
    if not isinstance(given, dict) or not given:
        raise BatchError("'histograms' must map feature names to bin counts (GET /v1/features)", field="histograms")
    unknown = set(given) - set(FEATURES)
    if unknown:
        raise BatchError(f"unknown features: {', '.join(sorted(unknown))}; known: {', '.join(FEATURES)}",
                         field=sorted(unknown)[0])
    for name, feature in FEATURES.items():
        counts = given.get(name)
        size = feature.edges.bins if isinstance(feature, NumericFeature) else len(feature.categories) + 1
        if counts is None:
            counts = [0] * size
        if (not isinstance(counts, list) or len(counts) != size
                or not all(isinstance(c, int) and not isinstance(c, bool) and 0 <= c <= MAX_COUNT for c in counts)):
            raise BatchError(f"histogram '{name}' must be {size} integers between 0 and {MAX_COUNT} "
                             f"(counts per bin of GET /v1/features)", field=name)
        arr = np.array(counts, dtype=np.int64)
        hists[name] = Histogram(feature.edges, arr) if isinstance(feature, NumericFeature) else CategoricalCounts(
            feature.categories, arr)
    if not any(h.total for h in hists.values()):
        raise BatchError("'histograms' holds no counts: a baseline needs records", field="histograms")
    starts: dict[str, np.ndarray[Any, Any]] | None = None
    if isinstance(doc.get("edges"), dict):  # stored with the baseline: reuse exactly
        starts = {}
        for f in NUMERIC_FEATURES:
            values = np.asarray(doc["edges"].get(f.name, []), dtype=float)
            idx = np.searchsorted(f.edges.values, values)
            if values.size < 2 or idx.max() >= f.edges.values.size or not np.allclose(f.edges.values[idx], values):
                starts = None  # the grid changed since: recompute from the counts
                break
            starts[f.name] = idx[:-1].astype(np.int64)
    samples = {k: np.array(v, dtype=float) for k, v in (doc.get("samples") or {}).items()}
    records = int(doc.get("records") or hists["status_class"].counts.sum() or
                  max(h.counts.sum() for h in hists.values()))
    return make_baseline(hists, samples, records, doc.get("source") or {"kind": "upload"},
                     float(doc.get("created_at") or 0.0), starts)
