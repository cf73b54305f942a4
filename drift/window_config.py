"""How the drift service holds its data: window length and buckets, samples kept, retention,
the verdict's alpha and floors, and the bounds on segments, calibrations and experiments.
One frozen value, shared by the roles (ingest, ratings, ledgers, baselines, thresholds,
verdicts)."""

from __future__ import annotations

from dataclasses import dataclass

from inferwatch.drift.binning import OTHER
from inferwatch.drift.calibration import RESAMPLES
from inferwatch.drift.windows import Segment

OTHER_SEGMENT: Segment = (OTHER, OTHER)  # where records of segments beyond the bound are counted


@dataclass(frozen=True)
class WindowConfig:
    window_s: float = 3600.0
    buckets: int = 60
    reservoir: int = 2000  # raw values per numeric feature per window, for exact tests
    retention_s: float = 7 * 86400.0  # stored batches, for baselines frozen from past ranges
    thresholds: tuple[tuple[str, float], ...] = ()  # method -> fixed threshold (else calibrated)
    alpha: float = 0.01  # false-alarm rate of one evaluation, per method and per segment
    min_samples: int = 50  # fewer values in either window: insufficient_data, not a verdict
    resamples: int = RESAMPLES
    max_segments: int = 1000  # (model, variant) pairs kept; records of more go to OTHER_SEGMENT
    calibration_cache: int = 8192  # null distributions kept (about 48 KB each; 6 per segment and size band)
    calibration_queue: int = 4096  # calibrations waiting for the background worker
    history: int = 240  # verdicts kept per segment for the report (one per time bucket)
    ab_experiments: int = 32  # experiment ledgers kept
    ab_units: int = 100_000  # unit rows per experiment ledger (about 150 bytes each) before units are sampled

    @property
    def bucket_s(self) -> float:
        return self.window_s / self.buckets
