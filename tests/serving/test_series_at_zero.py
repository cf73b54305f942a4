"""The series the SLOs read exist at 0 from the moment a model is served (issue 19).

Prometheus's ``rate()`` needs a sample before an increase to see it: a 5xx child created by
the first failure starts at 1, and a model's first burst of failures would never count
toward its SLO. The gateway creates every status class of every route of a model when it
reads the model list, before any request."""

import requests

from inferwatch.serving.metrics import STATUS_CLASSES
from inferwatch.serving.settings import GatewaySettings
from inferwatch.serving.validation import ROUTE_PATHS
from tests.support.servers import GatewayServer, metric_sum
from tests.support.stub_upstream import MODELS


def test_every_status_class_of_every_served_model_is_exported_at_zero_before_any_request(stub):
    settings = GatewaySettings(upstream_url=stub.url, variant="v7")
    with GatewayServer(settings) as gw:
        text = gw.metrics_text()
        for model in MODELS:
            for route in ROUTE_PATHS.values():
                for status_class in STATUS_CLASSES:
                    labels = f'model="{model}",route="{route}",status_class="{status_class}",variant="v7"'
                    assert f"inferwatch_gateway_requests_total{{{labels}}} 0.0" in text, labels
                    assert f"inferwatch_gateway_request_duration_seconds_count{{{labels}}} 0.0" in text, labels
        # the first failure then moves a series Prometheus has already seen at 0
        answer = requests.post(gw.url + "/v1/chat/completions", timeout=10,
                               json={"model": "http500", "messages": [{"role": "user", "content": "hi"}]})
        assert answer.status_code >= 500
        assert metric_sum(gw.metrics_text(), "inferwatch_gateway_requests_total", model="http500",
                          status_class="5xx") == 1
