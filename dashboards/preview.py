"""Dashboards drawn from a live Prometheus into one PNG each, laid out as in Grafana.

Not Grafana: a reviewer's view of every panel's shape on real data, with the same queries
(``dashboards.queries``) and the same grid. Time series are lines, stats their last value,
heatmaps bucket counts over time.
"""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
from matplotlib.axes import Axes

from inferwatch.dashboards.queries import TimeRange, panel_results, resolve_variables

UNIT_SCALE = {"percentunit": (100, "%"), "bytes": (1 / 2**30, "GiB"), "Bps": (1 / 2**20, "MiB/s"),
              "hertz": (1e-6, "MHz"), "watt": (1, "W"), "joule": (1e-3, "kJ"), "celsius": (1, "°C"),
              "s": (1, "s"), "reqps": (1, "req/s"), "ops": (1, "/s"), "suffix:×": (1, "×"), "short": (1, "")}
CELL_W, CELL_H = 0.62, 0.32  # inches per grid column and row
PAD_BELOW_IN, PAD_ABOVE_IN = 0.35, 0.3  # inside a panel's cell: tick labels, title


def _legend(metric: dict[str, Any], fmt: str) -> str:
    if fmt and fmt != "__auto":
        return "".join(metric.get(part, "") if i % 2 else part
                       for i, part in enumerate(fmt.replace("{{", "\0").replace("}}", "\0").split("\0"))).strip()
    return ", ".join(f"{k}={v}" for k, v in sorted(metric.items()) if k != "__name__") or "value"


def _draw_timeseries(ax: Axes, panel: dict[str, Any], results: list[list[dict[str, Any]]], t_end: float) -> None:
    scale, suffix = UNIT_SCALE.get(panel["fieldConfig"]["defaults"]["unit"], (1, ""))
    for target, series in zip(panel["targets"], results):
        for s in series[:8]:
            ts = np.array([float(x) for x, _ in s["values"]])
            ys = np.array([float(y) for _, y in s["values"]]) * scale
            # one panel stands for a repeated panel's copies: the repeated label tells them apart
            legend = target.get("legendFormat", "") + (f" {{{{{panel['repeat']}}}}}" if panel.get("repeat") else "")
            ax.plot((ts - t_end) / 60, ys, linewidth=1, label=_legend(s["metric"], legend))
    ax.set_xlabel("minutes (0 = now)", fontsize=6)
    ax.set_ylabel(suffix, fontsize=6)
    if any(not str(line.get_label()).startswith("_") for line in ax.lines):
        ax.legend(fontsize=5, loc="upper left", frameon=False)


def _draw_stat(ax: Axes, panel: dict[str, Any], results: list[list[dict[str, Any]]]) -> None:
    """Each series' last value, as Grafana's stat panel shows one value per series."""
    scale, suffix = UNIT_SCALE.get(panel["fieldConfig"]["defaults"]["unit"], (1, ""))
    shown = [(_legend(s["metric"], t.get("legendFormat", "")), float(s["values"][-1][1]) * scale)
             for t, series in zip(panel["targets"], results) for s in series if s["values"]][:8]
    if not shown:
        ax.text(0.5, 0.45, "no data", ha="center", va="center", fontsize=14, transform=ax.transAxes)
    names_only = panel["options"].get("textMode") == "name"
    rows = max(1, min(len(shown), 2))  # Grafana wraps many values into a grid: two rows, as many columns as needed
    cols = math.ceil(len(shown) / rows)
    for i, (label, value) in enumerate(shown):
        text = label if names_only else "NaN" if math.isnan(value) else f"{value:.3g} {suffix}"
        label = "" if names_only else label
        x = (i // rows + 0.5) / cols
        y = 0.5 if rows == 1 else 0.75 - (i % rows) * 0.5
        ax.text(x, y, text + (f"  {label}" if len(shown) > 1 else ""), ha="center", va="center",
                fontsize=16 if len(shown) == 1 else 9 if cols == 1 else 7, transform=ax.transAxes)
    ax.set_xticks([])
    ax.set_yticks([])


def _draw_heatmap(ax: Axes, results: list[list[dict[str, Any]]], t_end: float) -> None:
    rows = sorted(results[0], key=lambda s: float(s["metric"].get("le", "inf")))
    if not rows:
        return
    grid = np.array([[float(v) for _, v in s["values"]] for s in rows if len(s["values"]) == len(rows[0]["values"])])
    counts = np.diff(np.vstack([np.zeros(grid.shape[1]), grid]), axis=0).clip(min=0)  # per bucket, not cumulative
    ts = [float(x) for x, _ in rows[0]["values"]]
    ax.imshow(counts, aspect="auto", origin="lower", cmap="inferno",
              extent=((ts[0] - t_end) / 60, (ts[-1] - t_end) / 60, 0, len(rows)))
    ax.set_yticks(np.arange(len(rows)) + 0.5, [s["metric"].get("le", "") for s in rows], fontsize=4)
    ax.set_xlabel("minutes (0 = now)", fontsize=6)


def render(doc: dict[str, Any], prometheus: str, out: Path, tr: TimeRange) -> Path:
    variables = resolve_variables(prometheus, doc, tr)
    height = max(p["gridPos"]["y"] + p["gridPos"]["h"] for p in doc["panels"])
    fig_h = height * CELL_H + 0.6
    fig = plt.figure(figsize=(24 * CELL_W, fig_h))
    # room inside each grid cell for tick labels below and the title on top, in inches: as
    # fractions of the figure they would vanish on a tall dashboard
    below, above = PAD_BELOW_IN / fig_h, (PAD_BELOW_IN + PAD_ABOVE_IN) / fig_h
    span = tr.end - tr.start
    shown = f"{span / 60:.0f} min" if span >= 120 else f"{span:.0f} s"
    fig.suptitle(f"{doc['title']}  (preview from Prometheus, last {shown})", fontsize=10)
    for panel in doc["panels"]:
        g = panel["gridPos"]
        box = (g["x"] / 24 + 0.03, 1 - (g["y"] + g["h"]) / height * 0.95 - below, g["w"] / 24 - 0.038,
               g["h"] / height * 0.95 - above)
        if panel["type"] == "row":
            fig.text(0.005, box[1] + box[3] + 0.012, panel["title"], fontsize=9, weight="bold")
            continue
        ax = fig.add_axes(box)
        ax.set_title(panel["title"], fontsize=7, loc="left")
        ax.tick_params(labelsize=5)
        results = panel_results(prometheus, panel, variables, tr)
        if panel["type"] == "stat":
            _draw_stat(ax, panel, results)
        elif panel["type"] == "heatmap":
            _draw_heatmap(ax, results, tr.end)
        else:
            _draw_timeseries(ax, panel, results, tr.end)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def render_all(docs: dict[str, dict[str, Any]], prometheus: str, out_dir: Path, minutes: float = 60,
               scrape_s: float = 10) -> list[Path]:
    out_dir.mkdir(parents=True, exist_ok=True)  # fail before any query if it cannot be written
    now = time.time()
    tr = TimeRange(now - minutes * 60, now, scrape_s)
    return [render(doc, prometheus, out_dir / f"{uid}.png", tr) for uid, doc in docs.items()]
