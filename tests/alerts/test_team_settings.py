"""A team's own settings, as the issue that made settings data describes one: three models, a
99.5 % availability SLO over 28 days on all of them, a TTFT SLO on one model only, its own
GPU-hour price, PagerDuty and Slack, its Prometheus Operator release. Generated through the
same function as ``inferwatch generate``, accepted by promtool and amtool, and with the burn
thresholds the SRE workbook's arithmetic gives, replayed by promtool over incident timelines."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
import yaml

from inferwatch.config.load import parse
from inferwatch.generate import artifacts
from tests.alerts.promtool import run_promtool
from tests.alerts.timelines import CHAT, Incident, Timeline, doc, expected, promtool_timeline, workbook_detection_s

TEAM = """
models:
  - name: m1                 # the one CHAT (tests/alerts/timelines.py) sends: held to TTFT too
  - name: coder-7b
    slos: [availability]
  - name: Qwen/Qwen2.5-1.5B  # a served name with a slash and dots
    slos: [availability]
slos:
  - {name: availability, sli: availability, objective: 0.995, period: 28d}
  - {name: ttft, sli: ttft, objective: 0.99, period: 28d, threshold_s: 0.5}
cost:
  gpu_hour_price: 3.25
routing:
  receivers:
    pagerduty: {routing_key_file: KEYDIR/pagerduty}
    slack: {api_url_file: KEYDIR/slack, channel: "#llm-oncall"}
links:
  grafana_url: https://grafana.team.example
deployment:
  release: prom
  registry: registry.team.example/ml
  tag: "2026.12"
"""


@pytest.fixture(scope="module")
def team(tmp_path_factory) -> tuple[Path, dict[Path, str]]:
    keys = tmp_path_factory.mktemp("keys")
    (keys / "pagerduty").write_text("0123456789abcdef0123456789abcdef\n")
    (keys / "slack").write_text("https://hooks.slack.com/services/T000/B000/XXXX\n")
    out = tmp_path_factory.mktemp("team")
    files = artifacts(parse(TEAM.replace("KEYDIR", str(keys))))
    for path, text in files.items():
        (out / path).parent.mkdir(parents=True, exist_ok=True)
        (out / path).write_text(text)
    return out, files


def _rules(out: Path) -> list[dict]:
    return [r for path in sorted((out / "alerts" / "rules").glob("*.yml"))
            for g in yaml.safe_load(path.read_text())["groups"] for r in g["rules"]]


def test_promtool_and_amtool_accept_what_the_team_file_generates(team):
    out, _ = team
    subprocess.run(["promtool", "check", "rules", *map(str, sorted((out / "alerts" / "rules").glob("*.yml")))],
                   check=True, capture_output=True)
    for name in ("alertmanager.yml", "alertmanager-pagerduty.yml"):
        result = subprocess.run(["amtool", "check-config", str(out / "deploy" / "alertmanager" / name)],
                                capture_output=True, text=True)
        assert result.returncode == 0, result.stdout + result.stderr


def test_the_burn_thresholds_follow_the_workbook_for_a_995_objective_over_28_days(team):
    """factor = budget share x period / long window; threshold = factor x (1 - objective)."""
    out, _ = team
    period_h = 28 * 24
    workbook = {("fast", "1h"): 0.02 * period_h / 1, ("fast", "6h"): 0.05 * period_h / 6,
                ("slow", "1d"): 0.10 * period_h / 24, ("slow", "3d"): 0.10 * period_h / 72}
    assert workbook[("fast", "1h")] == pytest.approx(13.44)
    burn = {(r["labels"]["slo"], r["labels"]["burn"]): r["expr"] for r in _rules(out)
            if r.get("alert") == "SLOErrorBudgetBurn"}
    assert set(burn) == {("availability", "fast"), ("availability", "slow"), ("ttft", "fast"), ("ttft", "slow")}
    for tier in ("fast", "slow"):
        found = {w: float(t) for w, t in re.findall(r'ratio_rate(\w+)\{slo="availability"\}(?:\[\d+s\]\))? > ([0-9.e-]+)',
                                                   burn[("availability", tier)])}
        short = {"1h": "5m", "6h": "30m", "1d": "2h", "3d": "6h"}  # a pair's windows share its threshold
        want = {w: factor * 0.005 for (t, long), factor in workbook.items() if t == tier for w in (long, short[long])}
        assert found.keys() == want.keys() and all(found[w] == pytest.approx(want[w], rel=1e-6) for w in want), found
    budget = {r["labels"]["slo"]: r["expr"] for r in _rules(out) if r.get("record") == "inferwatch_slo:error_budget:ratio"}
    assert budget == {"availability": "vector(0.005)", "ttft": "vector(0.01)"}
    period = [r["expr"] for r in _rules(out) if r.get("record") == "inferwatch_slo:sli_error:ratio_period"]
    assert all("[28d]" in e for e in period) and len(period) == 2


def test_the_ttft_slo_holds_its_one_model_and_availability_every_model(team):
    out, _ = team
    raw = {r["labels"]["slo"]: r["expr"] for r in _rules(out) if r.get("record") == "inferwatch_slo:sli_errors:rate5m"}
    assert 'model=~"m1"' in raw["ttft"] and 'le="0.5"' in raw["ttft"]
    assert "model=~" not in raw["availability"], "held by every declared model: covers new models too"


def _run(tmp_path, out: Path, step_s: int, *tests: dict) -> None:
    result = run_promtool(doc(list(tests), step_s, out / "alerts" / "rules" / "slos.yml"), tmp_path)
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-3000:]


def _team_spec(team_files):
    from inferwatch.alerts.spec import build

    return build(parse(TEAM.replace("KEYDIR", "/k")))


def test_a_burn_just_over_the_28_day_page_threshold_pages_at_the_workbooks_time(team, tmp_path):
    """At 8 % errors the 1h window crosses 13.44 x 0.5 % = 6.72 % after 6.72 / 8 of an hour
    (50.4 minutes); the 1h window alone decides that (the 6h pair needs 2.8 % over 6h: later)."""
    out, _ = team
    spec = _team_spec(team)
    availability = spec.slo_of("availability")
    fast, _slow = spec.tiers
    history = 6 * 3600
    burn = Incident(history, history + 3 * 3600, 0.08)
    tl = Timeline(per_s=5, incidents=(burn,), length_s=history + 2 * 3600, step_s=60)
    at = burn.onset_s + workbook_detection_s(availability, fast.windows[0], burn.bad_share)
    assert at - burn.onset_s == pytest.approx(0.0672 / 0.08 * 3600)
    [(start, firing, tol)] = expected(tl, availability, fast).changes
    assert firing and start == pytest.approx(at, abs=5)
    _run(tmp_path, out, tl.step_s, promtool_timeline("8% errors, 99.5% over 28d", tl, availability,
                                                     {fast: [(at - tol, False), (at + tol, True)]}, grid_s=300))


def test_a_burn_just_under_the_28_day_page_threshold_opens_a_ticket_only(team, tmp_path):
    """2.5 % errors: under the 6h pair's 5.6 x 0.5 % = 2.8 % and the 1h's 6.72 %, over the 1d
    ticket's 2.8 x 0.5 % = 1.4 %: no page, a ticket."""
    out, _ = team
    spec = _team_spec(team)
    availability = spec.slo_of("availability")
    fast, slow = spec.tiers
    history = 3600
    tl = Timeline(per_s=2, incidents=(Incident(history, 10**9, 0.025),), length_s=history + 12 * 3600, step_s=60)
    assert expected(tl, availability, fast).changes == []
    [(start, _, tol)] = expected(tl, availability, slow).changes
    _run(tmp_path, out, tl.step_s, promtool_timeline("2.5% errors, 99.5% over 28d", tl, availability,
                                                     {fast: [], slow: [(start - tol, False), (start + tol, True)]},
                                                     grid_s=600))


def test_a_slow_first_token_on_a_model_without_the_ttft_slo_pages_nobody(team, tmp_path):
    out, _ = team
    spec = _team_spec(team)
    ttft = spec.slo_of("ttft")
    fast, _ = spec.tiers
    tl = Timeline(per_s=5, incidents=(Incident(3600, 10**9, 1.0),), length_s=3 * 3600, step_s=60)
    held = promtool_timeline("every first token slow, m1", tl, ttft, {fast: [(3 * 3600, True)]}, grid_s=1800)
    other = promtool_timeline("every first token slow, coder-7b", tl, ttft, {fast: [(3 * 3600, False)]}, grid_s=10**6)
    other["input_series"] = [{**s, "series": s["series"].replace(f'model="{CHAT["model"]}"', 'model="coder-7b"')}
                             for s in other["input_series"]]
    other["promql_expr_test"] = [{**t, "exp_samples": []} for t in other["promql_expr_test"]]
    _run(tmp_path, out, tl.step_s, held, other)


def test_routes_reach_pagerduty_and_slack_and_kubernetes_takes_the_teams_names(team):
    out, files = team
    am = yaml.safe_load((out / "deploy" / "alertmanager" / "alertmanager.yml").read_text())
    pager = next(r for r in am["receivers"] if r["name"] == "pager")
    assert pager["pagerduty_configs"][0]["routing_key_file"].endswith("/pagerduty")
    assert pager["slack_configs"][0]["channel"] == "#llm-oncall"
    result = subprocess.run(["amtool", "config", "routes", "test", f"--config.file={out}/deploy/alertmanager/alertmanager.yml",
                             "--verify.receivers=pager", "severity=critical", "alertname=VLLMDown"],
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
    kube = "\n".join(text for path, text in files.items() if path.parts[:2] == ("deploy", "kubernetes"))
    assert "image: registry.team.example/ml/inferwatch:2026.12" in kube
    assert "inferwatch:0.1.0" not in kube
    assert "release: prom" in kube and "release: kube-prometheus-stack" not in kube
    assert "https://grafana.team.example/d/" in kube
