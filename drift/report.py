"""The HTML drift report: per segment and feature, reference vs current as overlaid bar
charts (inline SVG, no plotting dependency) and the scores with their thresholds."""

from __future__ import annotations

import html
import time

from drift.binning import CategoricalCounts, Histogram
from drift.methods import DriftResult
from drift.schema import FEATURES

W, H, PAD = 560, 160, 24


def _labels(h: Histogram | CategoricalCounts) -> list[str]:
    if isinstance(h, CategoricalCounts):
        return list(h.labels)
    upper = h.edges.values[1:]
    return [f"≤{v:.3g}" for v in upper[:-1]] + [f">{upper[-2]:.3g}"]


def bars_svg(ref: Histogram | CategoricalCounts, cur: Histogram | CategoricalCounts) -> str:
    """Two share-of-window bar series per bin: reference (grey) and current (blue)."""
    p_ref = ref.counts / max(ref.counts.sum(), 1)
    p_cur = cur.counts / max(cur.counts.sum(), 1)
    top = float(max(p_ref.max(initial=0), p_cur.max(initial=0))) or 1.0
    n = len(p_ref)
    slot = (W - 2 * PAD) / n
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H + 30}" role="img">']
    for i, (a, b) in enumerate(zip(p_ref, p_cur)):
        x = PAD + i * slot
        for j, (v, color) in enumerate(((a, "#9aa0a6"), (b, "#1a73e8"))):
            h = (H - PAD) * v / top
            parts.append(f'<rect x="{x + j * slot / 2:.1f}" y="{H - h:.1f}" width="{max(slot / 2 - 1, 1):.1f}" '
                         f'height="{h:.1f}" fill="{color}"><title>{"reference" if j == 0 else "current"} '
                         f'{html.escape(_labels(ref)[i])}: {v:.3%}</title></rect>')
    labels = _labels(ref)
    for i in range(0, n, max(1, n // 8)):
        parts.append(f'<text x="{PAD + i * slot:.1f}" y="{H + 14}" font-size="10">{html.escape(labels[i])}</text>')
    parts.append("</svg>")
    return "".join(parts)


def render(segments: list[tuple[tuple[str, str], dict, dict, dict[str, dict[str, DriftResult]]]]) -> str:
    """``segments``: (segment, baseline histograms, current histograms, results)."""
    out = ["<!doctype html><html><head><meta charset='utf-8'><title>inferwatch drift report</title>",
           "<style>body{font-family:sans-serif;margin:2em}table{border-collapse:collapse}"
           "td,th{padding:2px 8px;border-bottom:1px solid #ddd}.drift{color:#c5221f;font-weight:bold}</style>",
           f"</head><body><h1>Drift report</h1><p>generated {time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime())}"
           "; grey: reference, blue: current window</p>"]
    if not segments:
        out.append("<p>No segment has both a baseline and a current window yet.</p>")
    for (model, variant), ref, cur, results in segments:
        out.append(f"<h2>{html.escape(model)} / {html.escape(variant)}</h2>")
        for name, methods in results.items():
            out.append(f"<h3>{html.escape(name)}</h3><p>{html.escape(FEATURES[name].description)}</p>")
            out.append(bars_svg(ref[name], cur[name]))
            out.append("<table><tr><th>method</th><th>score</th><th>threshold</th><th>direction</th>"
                       "<th>verdict</th></tr>")
            for r in methods.values():
                score = "—" if r.score is None else f"{r.score:.4g}"
                verdict = "insufficient data" if r.status != "ok" else ("DRIFT" if r.drifted else "ok")
                cls = " class='drift'" if r.drifted else ""
                out.append(f"<tr><td>{r.method}</td><td>{score}</td><td>{r.threshold:g}</td>"
                           f"<td>{r.direction.replace('_', ' ')}</td><td{cls}>{verdict}</td></tr>")
            out.append("</table>")
    out.append("</body></html>")
    return "".join(out)

