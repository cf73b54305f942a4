"""``inferwatch validate`` on bad files: each gets exit 2 and a line naming the file, the line
and column of the value at fault, and the field's path. What only the whole can tell (an
unknown alert name, an SLO no model holds) is located the same way."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import jsonschema
import pytest
from typer.testing import CliRunner

from inferwatch.cli import app
from inferwatch.config.load import parse, schema
from inferwatch.config.settings import Settings
from inferwatch.generate import SCHEMA, artifacts

RUNNER = CliRunner()

# (name, file, line of the fault, field path printed)
BAD = [
    ("models not a list", "models: 3\n", 1, "models"),
    ("unknown section", "modles: []\n", 1, "modles"),
    ("unknown field in a section", "links:\n  grafana: http://g\n", 2, "links.grafana"),
    ("objective over 1", "slos:\n  - {name: a, sli: availability, objective: 1.5}\n", 2, "slos.0.objective"),
    ("objective 0", "slos:\n  - {name: a, sli: availability, objective: 0}\n", 2, "slos.0.objective"),
    ("objective as text", "slos:\n  - {name: a, sli: availability, objective: '0.99'}\n", 2, "slos.0.objective"),
    ("unknown SLI", "slos:\n  - {name: a, sli: latency, objective: 0.9}\n", 2, "slos.0.sli"),
    ("latency SLO without threshold", "slos:\n  - name: t\n    sli: ttft\n    objective: 0.99\n", 2, "slos.0"),
    ("threshold off the buckets", "slos:\n  - {name: t, sli: ttft, objective: 0.99, threshold_s: 0.7}\n", 2,
     "slos.0"),
    ("availability with a threshold", "slos:\n  - {name: a, sli: availability, objective: 0.9, threshold_s: 1}\n",
     2, "slos.0"),
    ("period under a day", "slos:\n  - {name: a, sli: availability, objective: 0.9, period: 12h}\n", 2,
     "slos.0.period"),
    ("period in words", "slos:\n  - {name: a, sli: availability, objective: 0.9, period: 30 days}\n", 2,
     "slos.0.period"),
    ("window the rules do not record", "burn_rate:\n  tiers:\n    - name: f\n      severity: critical\n"
     "      windows: [{long: 4h, short: 5m, budget_share: 0.02}]\n", 5, "burn_rate.tiers.0.windows.0.long"),
    ("short window not shorter", "burn_rate:\n  tiers:\n    - name: f\n      severity: critical\n"
     "      windows:\n        - {long: 1h, short: 1h, budget_share: 0.02}\n", 6, "burn_rate.tiers.0.windows.0"),
    ("budget share 0", "burn_rate:\n  tiers:\n    - name: f\n      severity: critical\n"
     "      windows:\n        - {long: 1h, short: 5m, budget_share: 0}\n", 6,
     "burn_rate.tiers.0.windows.0.budget_share"),
    ("no tier pages", "burn_rate:\n  tiers:\n    - name: s\n      severity: warning\n"
     "      windows: [{long: 1d, short: 2h, budget_share: 0.1}]\n", 2, "burn_rate"),
    ("floors upside down", "burn_rate:\n  min_events: 3\n  min_bad_events: 5\n", 2, "burn_rate"),
    ("key given twice", "links:\n  grafana_url: http://a\n  grafana_url: http://b\n", 3, "links.grafana_url"),
    ("not YAML", "links: {grafana_url: http://a\n", 2, "(top level)"),
    ("a list, not sections", "- models\n", 1, "(top level)"),
    ("a model names an SLO not declared", "models:\n  - {name: m, slos: [latency]}\n", 2, "models.0.slos.0"),
    ("two models of one name", "models:\n  - {name: m}\n  - {name: m}\n", 3, "models.1.name"),
    ("two SLOs of one name", "slos:\n  - {name: a, sli: availability, objective: 0.9}\n"
     "  - {name: a, sli: availability, objective: 0.99}\n", 3, "slos.1.name"),
    ("alert name unknown", "alerts:\n  disabled: [GPUThrottle]\n", 2, "alerts.disabled.0"),
    ("for of an alert unknown", "alerts:\n  for:\n    NoSuchAlert: 5m\n", 3, "alerts.for.NoSuchAlert"),
    ("for not a duration", "alerts:\n  for:\n    GPUThrottled: 10 minutes\n", 3, "alerts.for.GPUThrottled"),
    ("KV cache share over 1", "alerts:\n  thresholds:\n    kv_cache_high: 1.2\n", 3,
     "alerts.thresholds.kv_cache_high"),
    ("Slack channel without #", "routing:\n  receivers:\n    slack: {api_url_file: /k, channel: oncall}\n", 3,
     "routing.receivers.slack.channel"),
    ("PagerDuty key file relative", "routing:\n  receivers:\n    pagerduty: {routing_key_file: key.txt}\n", 3,
     "routing.receivers.pagerduty.routing_key_file"),
    ("group_by not a label name", "routing:\n  group_by: [model-name]\n", 2, "routing.group_by.0"),
    ("inhibition matcher unquoted", "routing:\n  inhibitions:\n    - source_matchers: [severity=critical]\n"
     "      target_matchers: ['severity=\"warning\"']\n", 3, "routing.inhibitions.0.source_matchers.0"),
    ("price below 0", "cost:\n  gpu_hour_price: -1\n", 2, "cost.gpu_hour_price"),
    ("a GPU model's price 0", "cost:\n  gpu_hour_prices:\n    NVIDIA L4: 0\n", 3, "cost.gpu_hour_prices.NVIDIA L4"),
    ("Grafana URL without a scheme", "links:\n  grafana_url: grafana:3000\n", 2, "links.grafana_url"),
    ("registry with a scheme", "deployment:\n  registry: https://ghcr.io/me\n", 2, "deployment.registry"),
    ("tag with a blank", "deployment:\n  tag: 1.0 beta\n", 2, "deployment.tag"),
    ("namespace in capitals", "deployment:\n  namespace: ML_Serving\n", 2, "deployment.namespace"),
    ("three drift replicas", "deployment:\n  drift_replicas: 3\n", 2, "deployment.drift_replicas"),
    ("overlay of a model not deployed", "deployment:\n  overlays: {prod: llama-70b}\n", 2, "deployment.overlays.prod"),
    ("replicas upside down", "models:\n  - name: m\n    kubernetes:\n      image: vllm/vllm-openai:v1\n"
     "      args: []\n      resources: {requests: {cpu: '1'}}\n      min_replicas: 5\n      max_replicas: 2\n",
     4, "models.0.kubernetes"),
    ("image placeholder unknown", "models:\n  - name: m\n    kubernetes:\n      image: '{registry}/vllm:{version}'\n"
     "      args: []\n      resources: {requests: {cpu: '1'}}\n", 4, "models.0.kubernetes.image"),
    ("model name with a quote", "models:\n  - name: 'a\"b'\n", 2, "models.0.name"),
    ("an SLO no model holds", "models:\n  - {name: m, slos: [availability]}\n", 1, "slos.1.name"),
    ("resource not a quantity", "deployment:\n  gateway_resources: {requests: {cpu: lots}}\n", 2,
     "deployment.gateway_resources.requests.cpu"),
    ("gateway replicas over the maximum", "deployment:\n  gateway_replicas: 9\n", 2, "deployment"),
]


@pytest.mark.parametrize(("name", "text", "line", "path"), BAD, ids=[b[0] for b in BAD])
def test_a_bad_file_exits_2_with_its_line_and_field(tmp_path, name, text, line, path):
    config = tmp_path / "inferwatch.yaml"
    config.write_text(text)
    result = RUNNER.invoke(app, ["validate", str(config)])
    assert result.exit_code == 2, result.output
    lines = [x for x in result.output.splitlines() if x.startswith(str(config))]
    assert any(x.startswith(f"{config}:{line}:") and f": {path}: " in x for x in lines), result.output
    assert "Traceback" not in result.output


def test_the_table_is_big_enough():
    assert len(BAD) >= 30


def test_every_problem_of_a_file_is_reported_not_only_the_first(tmp_path):
    config = tmp_path / "inferwatch.yaml"
    config.write_text("links:\n  grafana_url: g\ncost:\n  gpu_hour_price: 0\ndeployment:\n  tag: 'a b'\n")
    result = RUNNER.invoke(app, ["validate", str(config)])
    assert result.exit_code == 2
    assert [x.split(": ")[0].split(":")[1] for x in result.output.splitlines() if x.startswith(str(config))] \
        == ["2", "4", "6"]


def test_an_empty_file_is_the_defaults_and_validates(tmp_path):
    config = tmp_path / "inferwatch.yaml"
    config.write_text("# nothing set\n")
    assert parse(config.read_text()) == Settings()
    result = RUNNER.invoke(app, ["validate", str(config)])
    assert result.exit_code == 0 and "valid" in result.output


def test_the_committed_schema_is_the_declarations_and_checks_files_as_the_loader_does():
    """inferwatch.schema.json is generated (the golden test holds it committed); an editor
    checking a file by it agrees with the loader on the fields' shapes."""
    assert json.loads(artifacts()[SCHEMA]) == schema()
    validator = jsonschema.Draft202012Validator(schema())
    for text in ("slos:\n  - {name: a, sli: availability, objective: 1.5}\n", "modles: []\n",
                 "deployment:\n  tag: 'a b'\n", "cost:\n  gpu_hour_price: -1\n"):
        import yaml

        assert list(validator.iter_errors(yaml.safe_load(text))), text
    validator.validate({})


def test_the_command_line_exits_2_on_a_bad_file(tmp_path):
    config = tmp_path / "inferwatch.yaml"
    config.write_text(textwrap.dedent("""\
        slos:
          - {name: availability, sli: availability, objective: 99.5}
        """))
    for command in (["validate", str(config)], ["generate", "--config", str(config), "--out", str(tmp_path / "o")]):
        result = subprocess.run([sys.executable, "-m", "inferwatch", *command], capture_output=True, text=True,
                                timeout=120)
        assert result.returncode == 2, result.stderr
        assert f"{config}:2:" in result.stderr and "slos.0.objective" in result.stderr
    assert not (tmp_path / "o").exists(), "nothing is written from a bad file"


def test_the_example_in_the_docs_is_valid_and_generates():
    """docs/settings.md's example team file, as a reader copies it."""
    import re
    from pathlib import Path

    from inferwatch.alerts.spec import build

    page = (Path(__file__).resolve().parents[2] / "docs" / "settings.md").read_text()
    [example] = [block for block in re.findall(r"```yaml\n(.*?)```", page, re.S) if "models:" in block]
    settings = parse(example)
    assert [s.name for s in settings.slos] == ["availability", "ttft"]
    assert build(settings).slo_of("availability").objective == 0.995
    assert artifacts(settings)


def test_a_field_in_the_wrong_section_says_where_it_belongs_and_a_percentage_is_named(tmp_path):
    config = tmp_path / "inferwatch.yaml"
    config.write_text("namespace: llm\ndeployment:\n  grafana_url: http://g\n"
                      "slos:\n  - {name: a, sli: availability, objective: 99.9}\n")
    result = RUNNER.invoke(app, ["validate", str(config)])
    assert result.exit_code == 2
    assert f"{config}:1:1: namespace: unknown field (it belongs at deployment.namespace)" in result.output
    assert f"{config}:3:3: deployment.grafana_url: unknown field (it belongs at links.grafana_url)" in result.output
    assert "slos.0.objective: Input should be less than 1: a share, e.g. 0.999 for 99.9 %, got 99.9" in result.output
