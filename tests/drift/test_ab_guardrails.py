"""Guardrails are declared once (drift/ab/spec.py): each is computed by the path its kind
names, from the columns or feature its entry gives, and an entry missing what its kind reads
is refused where it is declared."""

from __future__ import annotations

import numpy as np
import pytest

from inferwatch.drift.ab.decision import BY_KIND, Experiment, evaluate_metric
from inferwatch.drift.ab.spec import METRICS, MetricSpec
from inferwatch.drift.ab.units import COL, COLUMNS, COUNT_COLUMNS, FEEDBACK_COUNTS, RECORD_COUNTS, UNIT_FEATURES
from tests.support.ab_sim import Effects, arm_at, stream

EXP = Experiment("v1", "v2", shared_tokenizer=True)


@pytest.fixture(scope="module")
def arms():
    rng = np.random.default_rng(3)
    return (arm_at("v1", stream(4000, Effects(), rng), 4000, feedback_every=3),
            arm_at("v2", stream(4000, Effects(error_rate=0.05), rng), 4000, feedback_every=3))


@pytest.mark.parametrize("spec", METRICS, ids=lambda s: s.name)
def test_every_guardrail_is_computed_by_the_path_its_kind_names(spec, arms):
    control, treatment = arms
    result = evaluate_metric(spec, control, treatment, EXP)
    assert result.spec is spec and result.test == BY_KIND[spec.kind][1]
    if spec.kind == "throughput":  # no cost source in these arms: said, not guessed
        assert result.status == "not_applicable"
        return
    assert result.status == "ok", result.note
    if spec.kind == "proportion":  # the rate of the declared columns, summed over units
        for arm, rate in ((control, result.control), (treatment, result.treatment)):
            units = arm.units[arm.units[:, COL[spec.denominator]] > 0]
            assert rate == pytest.approx(units[:, COL[spec.numerator]].sum() / units[:, COL[spec.denominator]].sum())


def test_a_new_guardrail_of_an_existing_kind_is_one_entry(arms):
    spec = MetricSpec("finish_rate", "answers that finished", "proportion", "lower_is_worse", 0.01,
                      numerator="finished", denominator="requests")
    control, treatment = arms
    result = evaluate_metric(spec, control, treatment, EXP)
    assert result.test == "delta_method" and result.status == "ok"
    assert result.control == pytest.approx(control.units[:, COL["finished"]].sum() / control.units[:, COL["requests"]].sum())


@pytest.mark.parametrize(("kind", "fields", "says"), [
    ("proportion", {}, "needs numerator and denominator"),
    ("proportion", {"numerator": "errors"}, "needs numerator and denominator"),
    ("proportion", {"numerator": "errors", "denominator": "requests", "feature": "ttft_s"}, "and no feature"),
    ("rank", {}, "needs a feature"),
    ("mean", {"feature": "mean_logprob", "numerator": "errors", "denominator": "requests"}, "and no columns"),
    ("request_mean", {"numerator": "errors", "denominator": "requests"}, "needs a feature"),
    ("throughput", {"feature": "ttft_s"}, "neither a feature nor columns"),
])
def test_an_entry_missing_what_its_kind_reads_is_refused_where_it_is_declared(kind, fields, says):
    with pytest.raises(ValueError, match=says):
        MetricSpec("new", "a new guardrail", kind, "higher_is_worse", 0.01, **fields)


def test_the_unit_columns_are_the_guardrails():
    named = {c for m in METRICS for c in (m.numerator, m.denominator) if c}
    assert set(COUNT_COLUMNS) == named | {"requests"} and COUNT_COLUMNS[0] == "requests"
    assert set(COUNT_COLUMNS) <= RECORD_COUNTS.keys() | set(FEEDBACK_COUNTS)
    assert set(UNIT_FEATURES) == {m.feature for m in METRICS if m.feature}
    assert len(COLUMNS) == len(set(COLUMNS)) == len(COUNT_COLUMNS) + 2 * len(UNIT_FEATURES)
