"""The HTML drift report: a summary first (every A/B experiment and drift segment, worst
first: rollback, hold, drift, calibrating, continue, promote, no drift, insufficient data),
then in the same order the worst ``detail`` of them in full: per A/B experiment its
decision and guardrails, per drift segment and feature the reference and current
distributions (inline SVG, no plotting dependency) with both sample sizes, the headline
score against its threshold over the retained history, and every method's score, threshold
and where that threshold came from.

Bounded: the rest are rows of the summary only (about 0.3 KB each) and the page says how to
see them (``model``, ``variant``, ``detail``): with ~920 segments every one in full was 36.6 MB."""

from __future__ import annotations

import html
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from inferwatch.drift.ab.report import AbEntry
from inferwatch.drift.baseline import Baseline
from inferwatch.drift.binning import CategoricalCounts, Histogram, merge
from inferwatch.drift.methods import DriftResult
from inferwatch.drift.schema import FEATURES, UNITS
from inferwatch.drift.segment_verdicts import HistoryPoint, headline
from inferwatch.drift.verdicts import SegmentVerdict

W, H = 900, 170  # chart area
LEFT, BOTTOM, TOP = 46, 40, 12
CHAR_PX = 6.2  # width of one tick-label character at 11 px
REF, CUR, THR = "#80868b", "#1a73e8", "#d93025"
DETAIL = 20  # sections shown in full by default
# worst first: what needs a person now, then what is being decided, then what is fine
RANK = {"rollback": 0, "hold": 1, "drift": 2, "calibrating": 3, "continue": 4, "promote": 5, "no_drift": 6,
        "insufficient_data": 7}


@dataclass(frozen=True)
class SegmentReport:
    segment: tuple[str, str]
    baseline: Baseline
    current: dict[str, Any]
    verdict: SegmentVerdict
    history: list[HistoryPoint]
    since: float | None
    window_records: int


def _esc(text: object) -> str:
    return html.escape(str(text))


def _fmt(v: float | None) -> str:
    return "—" if v is None or math.isnan(v) else f"{v:.4g}"


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
    """The headline method's score (blue) and its threshold (red, dashed) over time, with a
    few time and value ticks; a single evaluation is a point, not a line."""
    pts = [(t, s, thr) for t, s, thr in points if s is not None and math.isfinite(thr)]
    hh = 110
    if not pts:
        return f"<p class='muted'>{method} over time: shown once an evaluation has a threshold.</p>"
    t0, t1 = pts[0][0], pts[-1][0]
    values = [v for _, s, thr in pts for v in (s, thr)]
    lo, hi = min(values + [0.0]), max(values)
    hi = hi if hi > lo else lo + 1
    span = max(t1 - t0, 1e-9)

    def x(t: float) -> float:
        return LEFT + (W - LEFT - 8) * ((t - t0) / span if t1 > t0 else 0.5)

    def y(v: float) -> float:
        return TOP + hh * (1 - (v - lo) / (hi - lo))

    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{TOP + hh + 34}" font-family="sans-serif" '
             f'font-size="11">']
    for frac in (0, 0.25, 0.5, 0.75, 1):
        v = lo + (hi - lo) * frac
        parts.append(f'<line x1="{LEFT}" x2="{W - 8}" y1="{y(v):.1f}" y2="{y(v):.1f}" stroke="#e0e0e0"/>'
                     f'<text x="{LEFT - 4}" y="{y(v) + 4:.1f}" text-anchor="end">{v:.3g}</text>')
    if len(pts) == 1:
        t, score, thr = pts[0]
        parts.append(f'<line x1="{x(t) - 12:.1f}" x2="{x(t) + 12:.1f}" y1="{y(thr):.1f}" y2="{y(thr):.1f}" '
                     f'stroke="{THR}" stroke-width="2"/><circle cx="{x(t):.1f}" cy="{y(score):.1f}" r="4" '
                     f'fill="{CUR}"/>')
        ticks = [t]
    else:
        scores = " ".join(f"{x(t):.1f},{y(s):.1f}" for t, s, _ in pts)
        thresholds = " ".join(f"{x(t):.1f},{y(th):.1f}" for t, _, th in pts)
        parts.append(f'<polyline points="{thresholds}" fill="none" stroke="{THR}" stroke-dasharray="4 3"/>'
                     f'<polyline points="{scores}" fill="none" stroke="{CUR}" stroke-width="1.5"/>')
        ticks = [t0 + span * k / 4 for k in range(5)]
    for i, t in enumerate(ticks):
        anchor = "middle" if len(ticks) == 1 else ("start" if i == 0 else "end" if i == len(ticks) - 1 else "middle")
        parts.append(f'<text x="{x(t):.1f}" y="{TOP + hh + 14}" text-anchor="{anchor}">'
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


Entry = SegmentReport | AbEntry


def _order(e: Entry) -> tuple[Any, ...]:
    if isinstance(e, AbEntry):
        return RANK[e.decision], 0.0, (e.model, e.control, e.treatment)
    return RANK[e.verdict.status], _worst_p(e.verdict), e.segment


def _anchor(e: Entry) -> str:
    return f"ab-{e.model}" if isinstance(e, AbEntry) else f"{e.segment[0]}/{e.segment[1]}"


def _summary_row(e: Entry) -> str:
    link = f"<a href='#{_esc(_anchor(e))}'>"
    if isinstance(e, AbEntry):
        cls = " class='drift'" if e.decision in ("rollback", "hold") else ""
        return (f"<tr><td>A/B</td><td>{link}{_esc(e.model)}: {_esc(e.control)} vs {_esc(e.treatment)}</a></td>"
                f"<td{cls}>{e.decision.upper()}</td><td>{_esc('; '.join(e.reasons) or '—')}</td><td>—</td>"
                f"<td>{e.requests[0]:,} / {e.requests[1]:,} (control / treatment)</td></tr>")
    v = e.verdict
    cls = " class='drift'" if v.status == "drift" else ""
    return (f"<tr><td>drift</td><td>{link}{_esc(e.segment[0])} / {_esc(e.segment[1])}</a></td>"
            f"<td{cls}>{v.status.replace('_', ' ')}</td><td>{_esc(', '.join(v.drifted_features) or '—')}</td>"
            f"<td>{_when(e.since)}</td><td>{e.window_records:,} / {e.baseline.records:,} (window / baseline)</td></tr>")


def _summary(entries: list[Entry]) -> str:
    rows = ["<table class='summary'><tr><th>kind</th><th>model / variant</th><th>verdict</th>"
            "<th>drifted features or reasons</th><th>since</th><th>records</th></tr>"]
    rows.extend(_summary_row(e) for e in entries)
    rows.append("</table>")
    return "".join(rows)


def _segment(s: SegmentReport) -> str:
    model, variant = s.segment
    names = sorted(s.verdict.features, key=lambda n: (not s.verdict.features[n].drifted,
                                                      s.verdict.features[n].p_value or 2.0))
    return (f"<h2 id='{_esc(model)}/{_esc(variant)}'>{_esc(model)} / {_esc(variant)}: "
            f"{s.verdict.status.replace('_', ' ')}</h2>" + "".join(_feature(name, s) for name in names))


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


def render(segments: list[SegmentReport], now: float | None = None, ab: Sequence[AbEntry] = (),
           detail: int = DETAIL) -> str:
    """The report: every A/B experiment (``drift.ab.report.sections``) and drift segment in
    one summary, worst first, then the worst ``detail`` of them in full."""
    now = time.time() if now is None else now
    entries: list[Entry] = sorted([*ab, *segments], key=_order)
    alpha = min(segments, key=_order).verdict.alpha if segments else None
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
    if not entries:
        out.append("<p>No segment has both a baseline and a current window yet, and no experiment is watched.</p>")
    else:
        out.append("<h2>Summary</h2><p class='muted'>Worst first: rollback, hold, drift, calibrating, continue, "
                   "promote, no drift, insufficient data.</p>" + _summary(entries))
    shown = entries[:max(detail, 0)]
    if len(entries) > len(shown):
        out.append(f"<p class='muted'>The worst {len(shown)} of {len(entries)} are shown in full below; the rest are "
                   "in the summary only. Ask for one with <code>?model=</code> and <code>&amp;variant=</code>, or "
                   "for more with <code>?detail=</code> (at most 200).</p>")
    out.extend(e.html if isinstance(e, AbEntry) else _segment(e) for e in shown)
    out.append("</body></html>")
    return "".join(out)
