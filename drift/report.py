"""The HTML drift report: a summary first (which model and variant drifted, on which
features, since when; worst first), then per segment and feature the reference and
current distributions (inline SVG, no plotting dependency) with both sample sizes, the
headline score against its threshold over the retained history, and every method's score,
threshold and where that threshold came from."""

from __future__ import annotations

import html
import math
import time
from dataclasses import dataclass

from drift.binning import CategoricalCounts, Histogram, merge
from drift.methods import DriftResult
from drift.schema import FEATURES, UNITS
from drift.state import Baseline, HistoryPoint, headline
from drift.verdicts import SegmentVerdict

W, H = 620, 170  # chart area
LEFT, BOTTOM, TOP = 46, 40, 12
CHAR_PX = 6.2  # width of one tick-label character at 11 px
REF, CUR, THR = "#80868b", "#1a73e8", "#d93025"


@dataclass(frozen=True)
class SegmentReport:
    segment: tuple[str, str]
    baseline: Baseline
    current: dict
    verdict: SegmentVerdict
    history: list[HistoryPoint]
    since: float | None
    window_records: int


def _esc(text: object) -> str:
    return html.escape(str(text))


def _fmt(v: float | None) -> str:
    return "—" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v:.4g}"


def _when(t: float | None) -> str:
    return "—" if t is None else time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(t))


def _bin_labels(h: Histogram | CategoricalCounts) -> list[str]:
    if isinstance(h, CategoricalCounts):
        return list(h.labels)
    upper = h.edges.values[1:]
    if upper.size == 1:  # a baseline whose values all fell in one bin
        return ["all values"]
    return [f"≤{v:.3g}" for v in upper[:-1]] + [f">{upper[-2]:.3g}"]


def _every(labels: list[str], slot: float) -> int:
    """Label every k-th bin so that no two labels overlap."""
    widest = max((len(s) for s in labels), default=1) * CHAR_PX + 6
    return max(1, math.ceil(widest / max(slot, 1e-9)))


def bars_svg(ref: Histogram | CategoricalCounts, cur: Histogram | CategoricalCounts, unit: str) -> str:
    """Share of each window per bin: reference (grey) and current (blue), y axis in percent,
    x labels thinned so they never overlap, the unit under the axis."""
    p_ref = ref.counts / max(ref.counts.sum(), 1)
    p_cur = cur.counts / max(cur.counts.sum(), 1)
    top = float(max(p_ref.max(initial=0), p_cur.max(initial=0))) or 1.0
    n = len(p_ref)
    slot = (W - LEFT - 8) / n
    base = TOP + H
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{base + BOTTOM}" role="img" '
             f'font-family="sans-serif" font-size="11">']
    for frac in (0, 0.5, 1):
        y = base - H * frac
        parts.append(f'<line x1="{LEFT}" x2="{W - 8}" y1="{y:.1f}" y2="{y:.1f}" stroke="#e0e0e0"/>'
                     f'<text x="{LEFT - 4}" y="{y + 4:.1f}" text-anchor="end">{top * frac:.0%}</text>')
    labels = _bin_labels(ref)
    for i, (a, b) in enumerate(zip(p_ref, p_cur)):
        x = LEFT + i * slot
        for j, (v, color, name) in enumerate(((a, REF, "reference"), (b, CUR, "current"))):
            h = H * v / top
            parts.append(f'<rect x="{x + j * slot / 2:.1f}" y="{base - h:.1f}" width="{max(slot / 2 - 1, 1):.1f}" '
                         f'height="{h:.1f}" fill="{color}"><title>{name} {_esc(labels[i])}: {v:.2%}</title></rect>')
    step = _every(labels, slot)
    for i in range(0, n, step):
        parts.append(f'<text x="{LEFT + (i + 0.5) * slot:.1f}" y="{base + 14}" text-anchor="middle">'
                     f'{_esc(labels[i])}</text>')
    axis = f"{unit} (bins: the baseline's quantiles)" if unit else "category"
    parts.append(f'<text x="{(LEFT + W) / 2:.0f}" y="{base + 32}" text-anchor="middle" fill="#5f6368">'
                 f'{_esc(axis)}; y: share of window</text></svg>')
    return "".join(parts)


def history_svg(points: list[tuple[float, float | None, float]], method: str) -> str:
    """The headline method's score (blue) and its threshold (red, dashed) over time."""
    pts = [(t, s, thr) for t, s, thr in points if s is not None and math.isfinite(thr)]
    hh = 90
    if len(pts) < 2:
        return f"<p class='muted'>{method} over time: shown once two evaluations are retained.</p>"
    t0, t1 = pts[0][0], pts[-1][0]
    values = [v for _, s, thr in pts for v in (s, thr)]
    lo, hi = min(values + [0.0]), max(values)
    hi = hi if hi > lo else lo + 1

    def xy(t: float, v: float) -> str:
        return f"{LEFT + (W - LEFT - 8) * (t - t0) / max(t1 - t0, 1e-9):.1f},{TOP + hh * (1 - (v - lo) / (hi - lo)):.1f}"

    score = " ".join(xy(t, s) for t, s, _ in pts)  # type: ignore[arg-type]
    thr = " ".join(xy(t, th) for t, _, th in pts)
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{TOP + hh + 34}" font-family="sans-serif" '
             f'font-size="11">']
    for v in (lo, hi):
        y = TOP + hh * (1 - (v - lo) / (hi - lo))
        parts.append(f'<line x1="{LEFT}" x2="{W - 8}" y1="{y:.1f}" y2="{y:.1f}" stroke="#e0e0e0"/>'
                     f'<text x="{LEFT - 4}" y="{y + 4:.1f}" text-anchor="end">{v:.3g}</text>')
    parts.append(f'<polyline points="{thr}" fill="none" stroke="{THR}" stroke-dasharray="4 3"/>'
                 f'<polyline points="{score}" fill="none" stroke="{CUR}" stroke-width="1.5"/>')
    for t, anchor, x in ((t0, "start", LEFT), (t1, "end", W - 8)):
        parts.append(f'<text x="{x}" y="{TOP + hh + 14}" text-anchor="{anchor}">'
                     f'{time.strftime("%H:%M", time.gmtime(t))}</text>')
    parts.append(f'<text x="{(LEFT + W) / 2:.0f}" y="{TOP + hh + 28}" text-anchor="middle" fill="#5f6368">'
                 f'{_esc(method)} (blue) vs its threshold (red, dashed), UTC</text></svg>')
    return "".join(parts)


def _source(r: DriftResult) -> str:
    if r.status == "calibrating":
        return r.detail
    if r.source == "calibrated":
        return f"calibrated at n={r.calibration_n}"
    return "p-value vs alpha" if r.source == "alpha" else "fixed"


def _methods_table(methods: dict[str, DriftResult]) -> str:
    rows = ["<table><tr><th>method</th><th>score</th><th>threshold</th><th>threshold from</th><th>p-value</th>"
            "<th>drift when</th><th>verdict</th></tr>"]
    for r in methods.values():
        verdict = r.status.replace("_", " ") if r.status != "ok" else ("DRIFT" if r.drifted else "ok")
        cls = " class='drift'" if r.drifted else ""
        rows.append(f"<tr><td>{r.method}</td><td>{_fmt(r.score)}</td><td>{_fmt(r.threshold)}</td>"
                    f"<td>{_source(r)}</td><td>{_fmt(r.p_value)}</td>"
                    f"<td>score {'above' if r.direction == 'higher_is_drift' else 'below'}</td>"
                    f"<td{cls}>{verdict}</td></tr>")
    rows.append("</table>")
    return "".join(rows)


def _worst_p(v: SegmentVerdict) -> float:
    return min((f.p_value for f in v.features.values() if f.p_value is not None), default=2.0)


def _order(s: SegmentReport) -> tuple:
    rank = {"drift": 0, "calibrating": 1, "no_drift": 2, "insufficient_data": 3}[s.verdict.status]
    return rank, _worst_p(s.verdict), s.segment


def _summary(segments: list[SegmentReport]) -> str:
    rows = ["<table class='summary'><tr><th>model / variant</th><th>verdict</th><th>drifted features</th>"
            "<th>since</th><th>window / baseline records</th></tr>"]
    for s in segments:
        v = s.verdict
        cls = " class='drift'" if v.status == "drift" else ""
        anchor = _esc(f"{s.segment[0]}/{s.segment[1]}")
        rows.append(f"<tr><td><a href='#{anchor}'>{anchor}</a></td><td{cls}>{v.status.replace('_', ' ')}</td>"
                    f"<td>{_esc(', '.join(v.drifted_features) or '—')}</td><td>{_when(s.since)}</td>"
                    f"<td>{s.window_records:,} / {s.baseline.records:,}</td></tr>")
    rows.append("</table>")
    return "".join(rows)


def _feature(name: str, s: SegmentReport) -> str:
    f = s.verdict.features[name]
    ref, cur = s.baseline.histograms[name], s.current[name]
    if isinstance(ref, Histogram):
        merged = s.baseline.reference.merged(name)
        ref, cur = merged, merge(cur, s.baseline.starts[name], merged.edges)
    state = f.status.replace("_", " ") if f.status != "ok" else ("DRIFT" if f.drifted else "no drift")
    cls = " class='drift'" if f.drifted else ""
    unit = UNITS[name]
    method = headline(name)
    points = [(p.t, *p.features[name][:2]) for p in s.history if name in p.features]
    return (f"<div class='feature'><h3>{_esc(name)} <span{cls}>{state}</span></h3>"
            f"<p class='muted'>{_esc(FEATURES[name].description)}{f' ({unit})' if unit else ''}. "
            f"<span style='color:{REF}'>■</span> reference n={f.n_ref:,} · <span style='color:{CUR}'>■</span> "
            f"current n={f.n_cur:,} · feature p-value {_fmt(f.p_value)}</p>"
            f"{bars_svg(ref, cur, unit)}{history_svg(points, method)}{_methods_table(f.methods)}</div>")


def render(segments: list[SegmentReport], now: float | None = None, ab: str = "") -> str:
    """The report; ``ab`` is the A/B section (drift.ab.report), placed after the summary."""
    now = time.time() if now is None else now
    segments = sorted(segments, key=_order)
    alpha = segments[0].verdict.alpha if segments else None
    out = ["<!doctype html><html><head><meta charset='utf-8'><title>inferwatch drift report</title><style>"
           "body{font-family:sans-serif;margin:2em;color:#202124}table{border-collapse:collapse;margin:.5em 0}"
           "td,th{padding:3px 10px;border-bottom:1px solid #ddd;text-align:left}.drift{color:#c5221f;"
           "font-weight:bold}.muted{color:#5f6368}.feature{margin:1.5em 0 2.5em}h3{margin-bottom:.2em}</style>"
           f"</head><body><h1>Drift report</h1><p class='muted'>generated {_when(now)}"]
    if alpha is not None:
        out.append(f"; each verdict's false-alarm rate is alpha = {alpha:g} per evaluation (per method, and per "
                   "segment across all its features by Holm's procedure); thresholds are calibrated from each "
                   "baseline at the current window's size unless marked fixed")
    out.append("</p>")
    if not segments:
        out.append("<p>No segment has both a baseline and a current window yet.</p>")
    else:
        out.append("<h2>Summary</h2>" + _summary(segments))
    out.append(ab)
    for s in segments:
        model, variant = s.segment
        out.append(f"<h2 id='{_esc(model)}/{_esc(variant)}'>{_esc(model)} / {_esc(variant)}: "
                   f"{s.verdict.status.replace('_', ' ')}</h2>")
        names = sorted(s.verdict.features, key=lambda n: (not s.verdict.features[n].drifted,
                                                          s.verdict.features[n].p_value or 2.0))
        out.extend(_feature(name, s) for name in names)
    out.append("</body></html>")
    return "".join(out)

