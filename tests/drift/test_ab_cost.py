"""The cost guardrail: output tokens per GPU-second of two variants, paired in time, its
test against scipy's, when it does not judge, and its samples read from a real Prometheus."""

from __future__ import annotations

import math
import shutil
import time
from dataclasses import replace

import numpy as np
import pytest
import yaml
from prometheus_client import CollectorRegistry, Gauge, start_http_server
from scipy import stats as sps

from inferwatch.drift.ab.cost import COST_SERIES, PrometheusCost
from inferwatch.drift.ab.decision import MIN_COST_SAMPLES, Arm, Experiment, analyse
from tests.support.prometheus_server import running_prometheus
from tests.support.sockets import free_port
from tests.support.waiting import eventually

EXP = Experiment("v1", "v2")


def priced_arms(control: np.ndarray, treatment: np.ndarray, weights=(0.5, 0.5)) -> tuple[Arm, Arm]:
    return Arm("v1", weight=weights[0], throughput=control), Arm("v2", weight=weights[1], throughput=treatment)


def load(n: int, seed: int) -> np.ndarray:
    """Tokens per GPU-second following a day's load: both arms see the same."""
    rng = np.random.default_rng(seed)
    return 800 + 300 * np.sin(np.linspace(0, 6, n)) + rng.normal(0, 5, n)


def test_a_slower_canary_is_worse_and_the_test_is_scipys_paired_t():
    base = load(48, 1)  # four hours of 5-minute samples
    noise = np.random.default_rng(2).normal(0, 0.03, 48)
    control, treatment = base, base * 0.8 * np.exp(noise)
    cost = analyse(EXP, *priced_arms(control, treatment)).metrics["cost"]
    assert cost.verdict == "worse" and cost.test == "paired_log_ratio"
    assert cost.relative == pytest.approx(0.8 * math.exp(noise.mean()) - 1)
    expected = sps.ttest_1samp(np.log(treatment) - np.log(control), 0.0)
    assert cost.p_value == pytest.approx(expected.pvalue, rel=1e-9)
    assert cost.relative_interval[0] < cost.relative < cost.relative_interval[1] < 0


def test_an_equally_fast_canary_is_not_worse():
    base = load(48, 3)
    treatment = base * np.exp(np.random.default_rng(4).normal(0, 0.03, 48))
    cost = analyse(EXP, *priced_arms(base, treatment)).metrics["cost"]
    assert cost.status == "ok" and cost.verdict in ("non_inferior", "inconclusive")


def test_it_judges_only_at_equal_weights_with_enough_samples_and_says_why_not():
    base = load(48, 5)
    skewed = analyse(EXP, *priced_arms(base, base * 0.5, weights=(0.95, 0.05))).metrics["cost"]
    assert skewed.verdict == "not_applicable" and "equal weights" in skewed.note
    short = analyse(EXP, *priced_arms(base[:MIN_COST_SAMPLES - 1], base[:MIN_COST_SAMPLES - 1] * 0.5))
    assert short.metrics["cost"].verdict == "insufficient_data"
    unpriced = analyse(EXP, replace(Arm("v1", weight=0.5), throughput_note="no series for v2"), Arm("v2", weight=0.5))
    assert unpriced.metrics["cost"].verdict == "not_applicable" and unpriced.metrics["cost"].note == "no series for v2"


@pytest.fixture(scope="module")
def priced(tmp_path_factory):
    """A real Prometheus scraping a gauge every second and recording it, every second, as the
    cost rules' series (a colon is no exporter's to write)."""
    assert shutil.which("prometheus"), "prometheus is installed by `make test` (Debian package)"
    registry = CollectorRegistry()
    gauge = Gauge("variant_tokens_per_gpu_second", "output tokens per GPU-second", ["model", "variant"],
                  registry=registry)
    port = free_port()
    server, _ = start_http_server(port, addr="127.0.0.1", registry=registry)
    tmp = tmp_path_factory.mktemp("prom")
    rules = tmp / "rules.yml"
    rules.write_text(yaml.safe_dump({"groups": [{"name": "cost", "rules": [
        {"record": COST_SERIES, "expr": "max without (instance, job) (variant_tokens_per_gpu_second)"}]}]}))
    config = {"global": {"scrape_interval": "1s", "evaluation_interval": "1s"}, "rule_files": [str(rules)],
              "scrape_configs": [{"job_name": "rules", "static_configs": [{"targets": [f"127.0.0.1:{port}"]}]}]}
    try:
        with running_prometheus(config, tmp) as url:
            yield gauge, url
    finally:
        server.shutdown()


def test_samples_are_read_paired_in_time_from_prometheus(priced):
    gauge, url = priced
    start = time.time()
    for i in range(8):
        gauge.labels("chat.v1", "stable").set(100 + i)
        gauge.labels("chat.v1", "canary").set(70 + i)
        gauge.labels("other", "canary").set(1)
        time.sleep(1)
    source = PrometheusCost(url, step_s=1)
    got = eventually(lambda: (p := source.paired("chat.v1", "stable", "canary", start, time.time())) and
                     not isinstance(p, str) and p[0].size >= MIN_COST_SAMPLES and p)
    control, treatment = got
    assert control.size == treatment.size
    assert set(np.round(control - treatment, 6)) == {30.0}  # each pair from one instant
    missing = source.paired("chat.v1", "stable", "blue", start, time.time())
    assert isinstance(missing, str) and "blue" in missing and "GPUs of its own" in missing


def test_a_prometheus_that_does_not_answer_costs_the_guardrail_only():
    source = PrometheusCost(f"http://127.0.0.1:{free_port()}", step_s=1)
    reason = source.paired("m", "a", "b", time.time() - 60, time.time())
    assert isinstance(reason, str) and "did not answer" in reason
