"""How verdicts are reached: alpha (the false-alarm rate of one evaluation) and each method's
threshold, fixed or calibrated. Changed at run time and kept in the store, so a change
survives restarts; every change is checked whole before any of it applies."""

from __future__ import annotations

import math
import threading
from collections.abc import Callable
from typing import Any

from typing_extensions import TypeIs

from inferwatch.drift.methods import METHODS
from inferwatch.drift.schema import BatchError
from inferwatch.drift.store import Store
from inferwatch.drift.verdicts import Policy
from inferwatch.drift.window_config import WindowConfig


def smallest_alpha(resamples: int) -> float:
    """Below 1/(B + 1) no calibrated p-value can reach alpha: every calibrated threshold would
    be infinite, a verdict that can never fire."""
    return 1 / (resamples + 1)


def _number(value: object) -> TypeIs[int | float]:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


class Thresholds:
    def __init__(self, store: Store, config: WindowConfig, lock: threading.RLock) -> None:
        self.store, self.config = store, config
        self._lock = lock
        self.alpha = config.alpha
        self.fixed: dict[str, float] = dict(config.thresholds)
        self.on_change: Callable[[], None] = lambda: None  # under the lock: cached verdicts are stale

    @property
    def policy(self) -> Policy:
        return Policy(self.alpha, self.config.min_samples, self.config.resamples, tuple(sorted(self.fixed.items())))

    def set(self, changes: dict[str, object]) -> dict[str, Any]:
        """Change alpha, or give a method a fixed threshold (a number) or hand it back to
        calibration (null), at run time; persisted, so changes survive restarts. All or nothing."""
        if not changes:
            raise BatchError(f"give 'alpha' or a method's threshold ({', '.join(METHODS)})", field="alpha")
        for key, value in changes.items():
            if key == "alpha":
                if not _number(value) or not 0 < value <= 0.5:
                    raise BatchError("'alpha' must be a number in (0, 0.5]: the false-alarm rate per evaluation",
                                     field="alpha")
                if value < smallest_alpha(self.config.resamples):
                    raise BatchError(f"'alpha' {value:g} is below what {self.config.resamples} resamples can resolve "
                                     f"(1/{self.config.resamples + 1}); raise INFERWATCH_DRIFT_RESAMPLES or alpha",
                                     field="alpha")
                continue
            spec = METHODS.get(key)
            if spec is None:
                raise BatchError(f"unknown method '{key}'; known: alpha, {', '.join(METHODS)}", field=key)
            if value is None:
                continue
            if not _number(value) or value <= 0:
                raise BatchError(f"threshold for '{key}' must be a positive number, or null to calibrate it",
                                 field=key)
            if spec.kind == "p_value" and value >= 1:
                raise BatchError(f"'{key}' is a p-value test: its threshold must be below 1", field=key)
        with self._lock:
            for key, value in changes.items():
                if key == "alpha":
                    self.alpha = float(value)  # type: ignore[arg-type]  # checked a number above
                elif value is None:
                    self.fixed.pop(key, None)
                else:
                    self.fixed[key] = float(value)  # type: ignore[arg-type]  # checked a number above
            self.on_change()
        self.store.put_setting("thresholds", {"alpha": self.alpha, "fixed": self.fixed})
        return self.describe()

    def describe(self) -> dict[str, Any]:
        return {"alpha": self.alpha, "min_samples": self.config.min_samples, "resamples": self.config.resamples,
                "methods": {m: ({"mode": "fixed", "threshold": self.fixed[m]} if m in self.fixed else
                                {"mode": "alpha" if s.kind == "p_value" else "calibrated"})
                            for m, s in METHODS.items()}}

    def restore(self) -> None:
        saved = self.store.setting("thresholds", {})
        if isinstance(saved, dict):
            self.alpha = float(saved.get("alpha", self.alpha))
            fixed = saved.get("fixed", {k: v for k, v in saved.items() if k in METHODS})  # older format: flat
            self.fixed.update({k: float(v) for k, v in fixed.items() if k in METHODS})
