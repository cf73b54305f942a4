"""Schemathesis fuzzes the gateway's own endpoints (tests/serving/gateway_openapi.py) in
front of a stub upstream and holds the gateway to that document: no 5xx, answers as
documented, every request it allows accepted and every one it forbids refused, and every 4xx
an OpenAI error object whose message says what was wrong. Bounded: a fixed number of
examples per operation, derandomised, so a run is reproducible and takes seconds."""

from __future__ import annotations

import orjson
import pytest
import schemathesis
from aiohttp import web
from hypothesis import HealthCheck, settings
from schemathesis.checks import not_a_server_error
from schemathesis.config._checks import NegativeDataRejectionConfig, PositiveDataAcceptanceConfig
from schemathesis.generation import GenerationMode
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    negative_data_rejection,
    positive_data_acceptance,
    response_schema_conformance,
    status_code_conformance,
)

from inferwatch.serving.settings import GatewaySettings
from tests.serving.gateway_openapi import gateway_openapi
from tests.support.errors import error_names_what_was_wrong
from tests.support.servers import GatewayServer
from tests.support.stub_upstream import StubUpstream

EXAMPLES = 100
MAX_TOKENS = 256
schema = schemathesis.openapi.from_dict(gateway_openapi(["ok"], MAX_TOKENS))
schema.config.generation.update(modes=[GenerationMode.POSITIVE, GenerationMode.NEGATIVE])
# A valid rating of an answer this gateway never gave is a 404; a body over the configured
# size is a 413 whatever it holds. Invalid requests are a 400 (a 404 for an unknown model).
schema.config.checks.positive_data_acceptance = PositiveDataAcceptanceConfig(expected_statuses=["2xx", "404", "413"])
schema.config.checks.negative_data_rejection = NegativeDataRejectionConfig(expected_statuses=["400", "404", "413"])


@schema.hook("map_case")
def integers_without_a_fraction(context, case):
    """The gateway counts choices and tokens in JSON integers written as such and refuses a
    2.0 (the operations' descriptions say so; JSON Schema's ``integer`` cannot): a valid
    case writes its integral numbers as integers."""
    if case.meta is not None and case.meta.generation.mode.is_positive and isinstance(case.body, dict):
        case.body = {k: int(v) if k in ("n", "max_tokens", "max_completion_tokens") and isinstance(v, float) else v
                     for k, v in case.body.items()}
    return case


async def _completions(request: web.Request) -> web.StreamResponse:
    """/v1/completions, which the stub leaves out: one text choice, streamed or not."""
    body = await request.json()
    usage = {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4}
    choice = {"index": 0, "text": "hi", "finish_reason": "length"}
    if not body.get("stream"):
        return web.json_response({"id": "c", "object": "text_completion", "model": body["model"],
                                  "choices": [choice], "usage": usage})
    resp = web.StreamResponse(headers={"content-type": "text/event-stream"})
    await resp.prepare(request)
    await resp.write(b"data: " + orjson.dumps({"id": "c", "object": "text_completion", "choices": [choice]}) + b"\n\n")
    await resp.write(b"data: " + orjson.dumps({"id": "c", "choices": [], "usage": usage}) + b"\n\n")
    await resp.write(b"data: [DONE]\n\n")
    return resp


@pytest.fixture(scope="module")
def gateway():
    stub = StubUpstream()
    stub.app.router.add_post("/v1/completions", _completions)
    with stub, GatewayServer(GatewaySettings(upstream_url=stub.url, max_tokens_limit=MAX_TOKENS,
                                             upstream_timeout_s=5.0)) as gw:
        yield gw


@schema.parametrize()
@settings(max_examples=EXAMPLES, deadline=None, derandomize=True, database=None,
          suppress_health_check=list(HealthCheck))
def test_every_endpoint_answers_as_documented(case, gateway):
    response = case.call(base_url=gateway.url, timeout=30)
    case.validate_response(response, checks=[not_a_server_error, status_code_conformance, content_type_conformance,
                                             response_schema_conformance, positive_data_acceptance,
                                             negative_data_rejection, error_names_what_was_wrong])
