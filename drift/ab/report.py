"""The A/B section of the HTML report, per watched experiment: the decision and its reasons,
the health checks, the epochs so far, a forest plot of every guardrail's relative effect
with its interval, and per metric the two arms side by side (distribution functions of the
per-unit means for latencies and lengths, rates with delta-method intervals for rates),
then the numbers in a table."""

from __future__ import annotations

import html
import math
from dataclasses import dataclass
from typing import Any, cast

import numpy as np

from inferwatch.drift.ab.book import LedgerBook
from inferwatch.drift.ab.decision import AbResult, Arm, MetricResult
from inferwatch.drift.ab.exposition import Watched, Watchlist, evaluate
from inferwatch.drift.ab.units import unit_means
from inferwatch.drift.binning import histogram
from inferwatch.drift.schema import FEATURES, NumericFeature

W, LEFT, RIGHT = 620, 150, 16
CONTROL, TREATMENT, WORSE, BETTER = "#80868b", "#1a73e8", "#c5221f", "#188038"
COLOURS = {"rollback": WORSE, "hold": "#e37400", "continue": TREATMENT, "promote": BETTER}


def _esc(text: object) -> str:
    return html.escape(str(text))


def _fmt(v: float | None, pct: bool = False) -> str:
    if v is None or not math.isfinite(v):
        return "—"
    return f"{v:+.1%}" if pct else f"{v:.4g}"


def forest_svg(metrics: list[MetricResult]) -> str:
    """Relative effect (treatment vs control) per judged metric with its interval; red where
    worse, green where better, grey otherwise; the dashed line is no difference."""
    rows = [m for m in metrics if m.status == "ok" and m.relative is not None and m.relative_interval is not None]
    if not rows:
        return "<p class='muted'>No judged metric has a relative effect yet.</p>"
    span: float = max(0.05, *(abs(x) for m in rows for x in m.relative_interval or () if math.isfinite(x)))
    row_h, top = 24, 10
    height = top + row_h * len(rows) + 34

    def x(v: float) -> float:
        return LEFT + (W - LEFT - RIGHT) * (max(-span, min(span, v)) + span) / (2 * span)

    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{height}" font-family="sans-serif" '
             f'font-size="11"><line x1="{x(0):.1f}" x2="{x(0):.1f}" y1="{top}" y2="{height - 30}" stroke="#9aa0a6" '
             f'stroke-dasharray="4 3"/>']
    for i, m in enumerate(rows):
        y = top + row_h * i + row_h / 2
        lo, hi = m.relative_interval  # type: ignore[misc]  # rows hold one
        colour = WORSE if m.verdict == "worse" else BETTER if m.verdict == "better" else "#5f6368"
        parts.append(f'<text x="{LEFT - 8}" y="{y + 4:.1f}" text-anchor="end">{_esc(m.spec.name)}</text>'
                     f'<line x1="{x(lo):.1f}" x2="{x(hi):.1f}" y1="{y:.1f}" y2="{y:.1f}" stroke="{colour}" '
                     f'stroke-width="2"/><circle cx="{x(m.relative):.1f}" cy="{y:.1f}" r="4" fill="{colour}">'  # type: ignore[arg-type]  # as above
                     f'<title>{_esc(m.spec.name)}: {_fmt(m.relative, True)} [{_fmt(lo, True)}, {_fmt(hi, True)}]'
                     f'</title></circle>')
    for v in (-span, 0.0, span):
        parts.append(f'<text x="{x(v):.1f}" y="{height - 16}" text-anchor="middle">{v:+.0%}</text>')
    parts.append(f'<text x="{(LEFT + W) / 2:.0f}" y="{height - 3}" text-anchor="middle" fill="#5f6368">treatment vs '
                 f'control, relative, with its 1 - alpha interval</text></svg>')
    return "".join(parts)


def ecdf_svg(feature: str, control: np.ndarray, treatment: np.ndarray, unit: str) -> str:
    """Both arms' distribution functions from counts on the feature's bins, on a log axis
    over the bins either arm uses."""
    edges = cast(NumericFeature, FEATURES[feature]).edges.values  # the A/B report plots numeric features
    used = np.flatnonzero((control + treatment) > 0)
    first, last = int(used[0]), int(used[-1])
    xs = np.log(np.maximum(edges[first:last + 2], 1e-9))
    height, top, bottom = 150, 10, 34

    def path(counts: np.ndarray) -> str:
        cdf = np.concatenate([[0.0], np.cumsum(counts[first:last + 1]) / max(counts.sum(), 1)])
        pts = [(LEFT + (W - LEFT - RIGHT) * (v - xs[0]) / max(xs[-1] - xs[0], 1e-9), top + (height - top) * (1 - c))
               for v, c in zip(xs, cdf)]
        return " ".join(f"{px:.1f},{py:.1f}" for px, py in pts)

    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{height + bottom}" font-family="sans-serif" '
             f'font-size="11">']
    for frac in (0, 0.5, 0.95):
        y = top + (height - top) * (1 - frac)
        parts.append(f'<line x1="{LEFT}" x2="{W - RIGHT}" y1="{y:.1f}" y2="{y:.1f}" stroke="#e0e0e0"/>'
                     f'<text x="{LEFT - 4}" y="{y + 4:.1f}" text-anchor="end">{frac:.0%}</text>')
    parts.append(f'<polyline points="{path(control)}" fill="none" stroke="{CONTROL}" stroke-width="2"/>'
                 f'<polyline points="{path(treatment)}" fill="none" stroke="{TREATMENT}" stroke-width="1.5"/>')
    for v, anchor, px in ((edges[first], "start", LEFT), (edges[last + 1], "end", W - RIGHT)):
        parts.append(f'<text x="{px}" y="{height + 14}" text-anchor="{anchor}">{v:.3g}</text>')
    parts.append(f'<text x="{(LEFT + W) / 2:.0f}" y="{height + 28}" text-anchor="middle" fill="#5f6368">'
                 f'{_esc(unit)} (log scale); y: share of units whose mean is at or below</text></svg>')
    return "".join(parts)


def rates_svg(m: MetricResult, alpha: float) -> str:
    """Both arms' rates as points with intervals as wide as the delta method makes the
    difference's (each arm's share of it)."""
    rates = [m.control or 0.0, m.treatment or 0.0]
    half = (m.interval[1] - m.interval[0]) / 2 / math.sqrt(2) if m.interval else 0.0
    ivs = [(max(0.0, r - half), min(1.0, r + half)) for r in rates]
    top_v = max(0.01, *(hi for _, hi in ivs)) * 1.1
    height, units = 70, (m.n_control, m.n_treatment)

    def x(v: float) -> float:
        return LEFT + (W - LEFT - RIGHT) * v / top_v

    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{height + 20}" font-family="sans-serif" '
             f'font-size="11">']
    for i, (name, colour) in enumerate((("control", CONTROL), ("treatment", TREATMENT))):
        y = 18 + 26 * i
        lo, hi = ivs[i]
        parts.append(f'<text x="{LEFT - 8}" y="{y + 4}" text-anchor="end">{name} ({units[i]:,} units)</text>'
                     f'<line x1="{x(lo):.1f}" x2="{x(hi):.1f}" y1="{y}" y2="{y}" stroke="{colour}" stroke-width="2"/>'
                     f'<circle cx="{x(rates[i]):.1f}" cy="{y}" r="4" fill="{colour}"/>'
                     f'<text x="{x(hi) + 6:.1f}" y="{y + 4}">{rates[i]:.2%}</text>')
    parts.append(f'<text x="{LEFT}" y="{height + 14}">0%</text><text x="{W - RIGHT}" y="{height + 14}" '
                 f'text-anchor="end">{top_v:.1%}</text></svg>')
    return "".join(parts)


def _p95(m: MetricResult) -> str:
    if m.p95 is None:
        return "—"
    lo, hi = m.p95.interval
    return f"{m.p95.difference:+.4g} [{lo:+.4g}, {hi:+.4g}]"


def _plot(m: MetricResult, control: Arm, treatment: Arm, alpha: float) -> str:
    if m.status != "ok":
        return ""
    if m.spec.kind == "rank" and m.spec.feature is not None:
        edges = cast(NumericFeature, FEATURES[m.spec.feature]).edges  # a rank metric's feature is numeric
        counts = [histogram(unit_means(arm.units, m.spec.feature), edges).counts for arm in (control, treatment)]
        return ecdf_svg(m.spec.feature, counts[0], counts[1], m.spec.unit)
    if m.spec.kind == "proportion":
        return rates_svg(m, alpha)
    return ""


def _srm(result: AbResult) -> str:
    srm = result.srm
    if srm is None:
        return "weights unknown"
    return (f"treatment share {result.treatment_share:.1%} of the units against a weight share of "
            f"{srm.result.expected_share[1]:.1%} (always-valid p = {srm.p_value_sequential:.3g}, chi-square on "
            f"the units seen p = {srm.result.p_value:.3g}{', MISMATCH' if srm.alarm else ''})")


def _epochs(doc: dict[str, Any]) -> str:
    rows = "".join(
        f"<tr><td>{e['epoch']}</td><td>{_fmt(e['weights']['control'])} / {_fmt(e['weights']['treatment'])}</td>"
        f"<td>{e['units']['control']:,} / {e['units']['treatment']:,}</td>"
        f"<td>{e['requests']['control']:,} / {e['requests']['treatment']:,}</td><td>{e['alpha']:.3g}</td>"
        f"<td style='color:{COLOURS[e['decision']]}'>{e['decision']}</td></tr>" for e in doc["epochs"])
    return ("<table><tr><th>epoch</th><th>weights</th><th>units</th><th>requests</th><th>alpha spent</th>"
            f"<th>decision</th></tr>{rows}</table>")


def section(model: str, result: AbResult, doc: dict[str, Any], control: Arm, treatment: Arm) -> str:
    exp = result.experiment
    colour = COLOURS[result.decision]
    out = [f"<h2 id='ab-{_esc(model)}'>A/B {_esc(model)}, experiment {_esc(doc['experiment'])} epoch {doc['epoch']}: "
           f"{_esc(exp.control)} (control) vs {_esc(exp.treatment)} (treatment): "
           f"<span style='color:{colour}'>{result.decision.upper()}</span></h2><ul>",
           *(f"<li>{_esc(r)}</li>" for r in result.reasons),
           f"</ul><p class='muted'>units {result.units[0]:,} / {result.units[1]:,} (requests {result.requests[0]:,} "
           f"/ {result.requests[1]:,}); {_srm(result)}; always-valid p-values, Holm across guardrails at alpha = "
           f"{exp.alpha:.3g}, this epoch's share of {doc['alpha_experiment']:g} over the experiment's life</p>",
           _epochs(doc), forest_svg(list(result.metrics.values())),
           "<table><tr><th>metric</th><th>test</th><th>verdict</th><th>control</th><th>treatment</th>"
           "<th>effect</th><th>relative [interval]</th><th>p95 difference [interval]</th><th>p</th>"
           "<th>p (always valid)</th><th>n</th></tr>"]
    for m in result.metrics.values():
        cls = " class='drift'" if m.verdict == "worse" else ""
        rel = (f"{_fmt(m.relative, True)} [{_fmt(m.relative_interval[0], True)}, {_fmt(m.relative_interval[1], True)}]"
               if m.relative_interval else _fmt(m.relative, True))
        out.append(f"<tr><td title='{_esc(m.spec.title)}'>{_esc(m.spec.name)}</td><td>{_esc(m.test)}</td>"
                   f"<td{cls}>{m.verdict.replace('_', ' ')}</td><td>{_fmt(m.control)}</td><td>{_fmt(m.treatment)}"
                   f"</td><td>{_fmt(m.effect)} {_esc(m.spec.unit)}</td><td>{rel}</td><td>{_p95(m)}</td>"
                   f"<td>{_fmt(m.p_value)}</td>"
                   f"<td>{_fmt(m.p_value_sequential)}</td><td>{m.n_control:,} / {m.n_treatment:,}</td></tr>")
    out.append("</table>")
    for m in result.metrics.values():
        plot = _plot(m, control, treatment, exp.alpha)
        if plot:
            out.append(f"<div class='feature'><h3>{_esc(m.spec.name)} <span{' class=drift' if m.verdict == 'worse' else ''}>"
                       f"{m.verdict.replace('_', ' ')}</span></h3><p class='muted'>{_esc(m.spec.title)}. "
                       f"<span style='color:{CONTROL}'>■</span> control · <span style='color:{TREATMENT}'>■</span> "
                       f"treatment · {_esc(m.note)}</p>{plot}</div>")
    return "".join(out)


@dataclass(frozen=True)
class AbEntry:
    """One experiment for the report: what its summary row says, and its section. The drift
    report orders these with the drift segments, worst first."""

    model: str
    control: str
    treatment: str
    decision: str  # rollback, hold, continue, promote
    reasons: tuple[str, ...]
    requests: tuple[int, int]
    html: str


def _entry(ledgers: LedgerBook, watched: Watched, watchlist: Watchlist) -> AbEntry | None:
    evaluated = evaluate(ledgers, watched, watchlist.cost)
    if evaluated is None:
        return None
    reading, result, doc = evaluated
    req, view = watched.request, reading.views[reading.current]
    return AbEntry(watched.model, req.control, req.treatment, result.decision, result.reasons, result.requests,
                   section(watched.model, result, doc, view.control, view.treatment))


def sections(ledgers: LedgerBook, watchlist: Watchlist, model: str | None = None) -> list[AbEntry]:
    """Every watched experiment (or one model's) that still has a ledger."""
    entries = (_entry(ledgers, w, watchlist) for w in watchlist.items() if model is None or w.model == model)
    return [e for e in entries if e is not None]
