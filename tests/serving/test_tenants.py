"""Tenants, their budgets and goodput's objectives: the declarations and the arithmetic, with
a clock of our own; the budgets of gateway replicas through a real redis-server.

The replicas' answers come from the stub upstream (4 tokens each, as its usage says): what
is under test is the fleet's arithmetic, which real vLLM's usage feeds the same way
(tests/integration/test_tenants_vllm.py reads it from vLLM).
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime

import pytest
import requests

from inferwatch.config.settings import SLO, Model, Settings
from inferwatch.serving.admission import PolicyError, key_id, parse_policy
from inferwatch.serving.budgets import Budgets, period_of
from inferwatch.serving.goodput import Goodput, Objectives
from inferwatch.serving.settings import GatewaySettings
from inferwatch.serving.tenants import Budget
from inferwatch.serving.upstream import served_models
from inferwatch.serving.validation import ModelInfo
from tests.serving.test_shared_state import replica
from tests.support.redis_server import RedisServer
from tests.support.servers import GatewayServer, metric_sum, samples
from tests.support.stub_upstream import StubUpstream
from tests.support.waiting import eventually

KEYS = {"search": "sk-search-1", "chat": "sk-chat-1", "stray": "sk-stray-1"}
STUB_TOKENS = 4  # the stub's usage per answer with max_tokens 1: 3 prompt, 1 completion


def unix(text: str) -> float:
    return datetime.fromisoformat(text).replace(tzinfo=UTC).timestamp()


# -- declarations ----------------------------------------------------------------------


def test_a_key_belongs_to_its_declared_tenant_and_any_other_key_to_other():
    policy = parse_policy(f"""
tenants:
  search: {{keys: [{key_id(KEYS['search'])}]}}
  chat: {{keys: [{key_id(KEYS['chat'])}], critical: true, budget: {{tokens: 1000}}}}
""", "limits.yaml")
    assert policy.tenant_of(key_id(KEYS["search"])) == "search"
    assert policy.tenant_of(key_id(KEYS["chat"])) == "chat"
    assert policy.tenant_of(key_id(KEYS["stray"])) == "other"
    assert policy.tenant_of("anonymous") == "anonymous"
    assert policy.tenants["chat"].budget == Budget(tokens=1000, period="day")


@pytest.mark.parametrize(("text", "message"), [
    ("tenants: {other: {keys: []}}", "'other' is reserved"),
    ("tenants: {anonymous: {}}", "'anonymous' is reserved"),
    (f"tenants: {{a: {{keys: [{key_id('x')}]}}, b: {{keys: [{key_id('x')}]}}}}", "declared for 'a' too"),
    ("tenants: {a: {keys: [sk-the-raw-key]}}", "should match pattern"),
    ("tenants: {Search: {}}", "should match pattern"),
    ("tenants: {a: {budget: {tokens: 10, dollars: 1}}}", "either tokens or dollars"),
    ("tenants: {a: {budget: {period: week, tokens: 10}}}", "'day' or 'month'"),
    ("tenants: {a: {budget: {dollars: 5}}}", "a dollar budget needs default_price"),
    ("tenants: {a: {budget: {tokens: -1}}}", "greater than 0"),
    ("tenants: {a: {budget: {tokens: 1e400}}}", "finite number"),  # YAML's 1e400 is inf: no budget at all
    ("tenants: {a: {budget: {dollars: .inf}}}\ndefault_price: {input: 1, output: 1}", "finite number"),
    ("default_price: {input: .nan, output: 1}", "finite number"),
])
def test_a_declaration_that_would_make_a_tenant_ambiguous_is_refused_with_why(text, message):
    with pytest.raises(PolicyError, match=message):
        parse_policy(text, "limits.yaml")


# -- periods and budgets -----------------------------------------------------------------


@pytest.mark.parametrize(("now", "period", "ident", "resets"), [
    ("2026-12-06T10:00:00", "day", "2026-12-06", "2026-12-07T00:00:00"),
    ("2026-12-31T23:59:59", "day", "2026-12-31", "2027-01-01T00:00:00"),
    ("2026-12-31T23:59:59", "month", "2026-12", "2027-01-01T00:00:00"),
    ("2028-02-29T12:00:00", "month", "2028-02", "2028-03-01T00:00:00"),
    ("2026-01-31T00:00:00", "month", "2026-01", "2026-02-01T00:00:00"),
])
def test_a_period_is_the_utc_day_or_month_and_resets_at_its_end(now, period, ident, resets):
    assert period_of(period, unix(now)) == (ident, unix(resets))


def test_a_spent_budget_refuses_until_its_period_resets_and_says_when():
    clock = [unix("2026-12-06T23:00:00")]
    budgets, budget = Budgets(clock=lambda: clock[0]), Budget(tokens=100)
    for _ in range(3):
        assert budgets.refusal("search", budget) is None
        budgets.charge("search", budget, 40)  # charged after the fact: the third overshoots
    refusal = budgets.refusal("search", budget)
    assert refusal is not None and refusal.retry_after_s == pytest.approx(3600)
    assert "tenant 'search'" in refusal.message and "100 tokens per day" in refusal.message
    assert "120 tokens used" in refusal.message and "2026-12-07T00:00:00Z" in refusal.message
    assert budgets.refusal("chat", budget) is None  # a tenant of its own
    clock[0] = unix("2026-12-07T00:00:01")
    assert budgets.refusal("search", budget) is None  # a new day
    assert budgets.refusal("search", Budget(tokens=100, period="month")) is None  # a new period kind: its own count


def test_dollars_are_charged_at_the_models_price():
    policy = parse_policy("""
default_price: {input: 1.0, output: 2.0}
prices: {big: {input: 10, output: 30}}
tenants: {a: {budget: {dollars: 5, period: month}}}
""", "limits.yaml")
    assert policy.price_of("small").dollars(1_000_000, 500_000) == pytest.approx(2.0)
    assert policy.price_of("big").dollars(100_000, 100_000) == pytest.approx(4.0)
    # a LoRA adapter is charged at its own price if it has one, else at its base model's
    assert policy.price_of("big-lora", "big").dollars(100_000, 100_000) == pytest.approx(4.0)
    assert policy.price_of("small-lora", "small").dollars(1_000_000, 500_000) == pytest.approx(2.0)


def test_vllms_model_list_gives_each_adapter_its_base_and_the_bases_context():
    """vLLM 0.32's /v1/models (abridged): an adapter names its base as ``parent`` and has no
    ``max_model_len``; anything not shaped like a model card is skipped."""
    listing = {"object": "list", "data": [
        {"id": "tiny-llama", "root": "/m/tiny", "parent": None, "max_model_len": 512},
        {"id": "tiny-lora", "root": "/m/tiny-lora", "parent": "tiny-llama", "max_model_len": None},
        {"id": "lora-of-unlisted", "parent": "gone", "max_model_len": None},
        {"id": "self-parent", "parent": "self-parent", "max_model_len": 64},
        {"id": 7}, "not a card",
    ]}
    models = served_models(listing)
    assert models == {"tiny-llama": ModelInfo("tiny-llama", 512), "tiny-lora": ModelInfo("tiny-lora", 512, "tiny-llama"),
                      "lora-of-unlisted": ModelInfo("lora-of-unlisted", None, "gone"),
                      "self-parent": ModelInfo("self-parent", 64)}
    assert [m.base for m in models.values()] == ["tiny-llama", "tiny-llama", "gone", "self-parent"]
    for broken in ({"data": 7}, {}, ["tiny-llama"]):
        with pytest.raises(ValueError, match="list of models"):
            served_models(broken)


# -- goodput's objectives ----------------------------------------------------------------


@pytest.mark.parametrize(("status", "ttft", "tpot", "e2e", "good"), [
    (200, 0.5, 0.05, 10.0, True),
    (200, 1.0, 0.1, 30.0, True),  # at the threshold: within (a bucket's le)
    (200, 1.01, 0.05, 10.0, False),
    (200, 0.5, 0.11, 10.0, False),
    (200, 0.5, 0.05, 30.5, False),
    (200, None, None, 10.0, True),  # unary: no first token or gaps of its own to judge
    (499, 0.5, 0.05, 10.0, False),
    (503, None, None, 0.1, False),
])
def test_a_request_is_good_when_it_meets_every_objective_together(status, ttft, tpot, e2e, good):
    assert Objectives(ttft_s=1.0, tpot_s=0.1, e2e_s=30.0).met(status, ttft, tpot, e2e) is good


def test_objectives_come_from_the_slos_each_model_is_held_to():
    settings = Settings(
        slos=[SLO(name="availability", sli="availability", objective=0.999),
              SLO(name="ttft", sli="ttft", objective=0.99, threshold_s=1.0),
              SLO(name="ttft-tail", sli="ttft", objective=0.999, threshold_s=5.0),
              SLO(name="itl", sli="itl", objective=0.99, threshold_s=0.1),
              SLO(name="e2e", sli="e2e_latency", objective=0.99, threshold_s=30.0)],
        models=[Model(name="chat"), Model(name="batch", slos=["availability", "e2e"])])
    goodput = Goodput(settings)
    assert goodput.objectives("chat") == Objectives(ttft_s=1.0, tpot_s=0.1, e2e_s=30.0)  # the tighter TTFT
    assert goodput.objectives("batch") == Objectives(e2e_s=30.0)
    # a model the file does not name: held to the SLOs every named model is held to (as the
    # rules select no model for them), not to those some are not
    assert goodput.objectives("unnamed") == Objectives(e2e_s=30.0)
    assert Goodput(Settings()).objectives("anything") == Objectives(ttft_s=1.0, e2e_s=30.0)


# -- budgets across replicas, through Redis ------------------------------------------------


@pytest.fixture(scope="module")
def stubs():
    with StubUpstream() as a:
        yield a, a


@pytest.fixture(scope="module")
def redis_server(tmp_path_factory):
    with RedisServer(tmp_path_factory.mktemp("redis")) as server:
        yield server


@pytest.fixture
def prefix(request) -> str:
    return "b" + str(abs(hash(request.node.nodeid)))


def limits_file(tmp_path, budget_tokens: int, tenant: str = "search"):
    f = tmp_path / "limits.yaml"
    f.write_text(f"tenants:\n  {tenant}: {{keys: [{key_id(KEYS['search'])}], critical: true, "
                 f"budget: {{tokens: {budget_tokens}}}}}\n")
    return f


def ask(gw, key: str, session: requests.Session | None = None) -> requests.Response:
    return (session or requests).post(gw.url + "/v1/chat/completions", timeout=10,
                                      headers={"authorization": f"Bearer {key}"},
                                      json={"model": "ok", "messages": [{"role": "user", "content": "hi"}],
                                            "max_tokens": 1})


def flood(gateways, key: str, clients: int, after_refusal_s: float, deadline_s: float) -> list[requests.Response]:
    """Clients sending through the replicas in turn, until ``after_refusal_s`` past the first
    429 (or ``deadline_s``): every answer."""
    refused: list[float] = []
    deadline = time.monotonic() + deadline_s

    def client(i: int) -> list[requests.Response]:
        out, n, session = [], i, requests.Session()
        while time.monotonic() < deadline and not (refused and time.monotonic() > refused[0] + after_refusal_s):
            r = ask(gateways[n % len(gateways)], key, session)
            if r.status_code == 429 and not refused:
                refused.append(time.monotonic())
            out.append(r)
            n += 1
        return out

    with ThreadPoolExecutor(clients) as pool:
        return [r for part in pool.map(client, range(clients)) for r in part]


def used(gateways) -> float:
    return max(metric_sum(g.metrics_text(), "inferwatch_gateway_tenant_budget_used", tenant="search")
               for g in gateways)


def test_three_replicas_hold_a_tenants_budget_within_five_percent(redis_server, prefix, stubs, tmp_path):
    budget = 10_000  # 2,500 answers of the stub's 4 tokens
    extra = {"limits_file": limits_file(tmp_path, budget), "api_keys": list(KEYS.values())}
    with replica(redis_server.url, prefix, stubs, **extra) as a, replica(redis_server.url, prefix, stubs, **extra) as b, \
            replica(redis_server.url, prefix, stubs, **extra) as c:
        answers = flood((a, b, c), KEYS["search"], 6, after_refusal_s=2, deadline_s=60)
        admitted = sum(r.status_code == 200 for r in answers)
        assert {r.status_code for r in answers} == {200, 429}, "the budget never ran out"
        spent = admitted * STUB_TOKENS
        assert budget <= spent <= budget * 1.05, (admitted, spent)
        body = ask(a, KEYS["search"])
        error = body.json()["error"]
        assert error["code"] == "insufficient_quota" and error["type"] == "insufficient_quota"
        assert "tenant 'search'" in error["message"] and "resets at" in error["message"]
        reset = period_of("day", time.time())[1]
        assert abs(int(body.headers["retry-after"]) - (reset - time.time())) < 5
        # another tenant's keys are not held to it
        assert ask(a, KEYS["chat"]).status_code == 200 and ask(b, KEYS["stray"]).status_code == 200
        eventually(lambda: used((a, b, c)) == spent, timeout_s=5)
        for g in (a, b, c):
            text = g.metrics_text()
            assert metric_sum(text, "inferwatch_gateway_tenant_budget_limit", tenant="search", unit="tokens",
                              period="day", critical="true") == budget
        rejected = sum(metric_sum(g.metrics_text(), "inferwatch_gateway_admission_rejected_total", scope="tenant",
                                  limit="budget") for g in (a, b, c))
        assert rejected == sum(r.status_code == 429 for r in answers) + 1  # and the one asked after the flood


def test_a_redis_restarted_empty_does_not_hand_the_budget_back(tmp_path, stubs):
    with RedisServer(tmp_path / "redis") as server:
        extra = {"limits_file": limits_file(tmp_path, 40), "api_keys": list(KEYS.values())}
        with replica(server.url, "r", stubs, **extra) as a, replica(server.url, "r", stubs, **extra) as b:
            statuses = []
            for i in range(14):
                statuses.append(ask((a, b)[i % 2], KEYS["search"]).status_code)
                time.sleep(0.3)  # past two syncs: one replica charged it, the other learned it
            assert statuses.count(200) == 10, statuses
            server.stop()
            server.start()  # empty: --save "" keeps nothing
            eventually(lambda: all(g.gateway.shared.up for g in (a, b)), timeout_s=10)
            for g in (a, b):
                eventually(lambda g=g: ask(g, KEYS["search"]).status_code == 429, timeout_s=5)
            key = f"r:budget:search:tokens:{period_of('day', time.time())[0]}"
            eventually(lambda: float(server.client().get(key) or 0) == 40, timeout_s=5)  # each replica's floor


def test_while_redis_is_silent_each_replica_spends_as_if_all_did(tmp_path, stubs):
    with RedisServer(tmp_path / "redis") as server:
        extra = {"limits_file": limits_file(tmp_path, 120), "api_keys": list(KEYS.values())}
        with replica(server.url, "d", stubs, **extra) as a, replica(server.url, "d", stubs, **extra):
            eventually(lambda: a.gateway.shared.replicas == 2, timeout_s=5)
            for _ in range(5):  # 20 of 120 tokens, known to both
                assert ask(a, KEYS["search"]).status_code == 200
            time.sleep(0.3)
            server.pause()
            try:
                eventually(lambda: not a.gateway.shared.up, timeout_s=5)
                statuses = [ask(a, KEYS["search"]).status_code for _ in range(30)]
            finally:
                server.resume()
            # 100 tokens were left; counting each of its 4 as 8 (two replicas), this one admits
            # while 20 + 8k < 120: k = 0..12
            admitted = statuses.count(200)
            assert admitted == 13, statuses
            eventually(lambda: float(server.client().get(
                f"d:budget:search:tokens:{period_of('day', time.time())[0]}") or 0) == (5 + admitted) * STUB_TOKENS,
                timeout_s=5)


def test_a_tenant_renamed_in_the_file_counts_under_its_new_name(tmp_path, stubs):
    settings = GatewaySettings(upstream_url=stubs[0].url, limits_file=limits_file(tmp_path, 8),
                               api_keys=list(KEYS.values()))
    with GatewayServer(settings) as gw:
        assert [ask(gw, KEYS["search"]).status_code for _ in range(3)] == [200, 200, 429]
        limits_file(tmp_path, 8, tenant="search-v2")
        eventually(lambda: ask(gw, KEYS["search"]).status_code == 200, timeout_s=5)
        # a request is counted once its answer has gone out: the scrape may come first
        def counted() -> str:
            text = gw.metrics_text()
            served = metric_sum(text, "inferwatch_gateway_tenant_requests_total", tenant="search-v2", status_class="2xx")
            return text if served >= 1 else ""

        text = eventually(counted, timeout_s=5)
        assert metric_sum(text, "inferwatch_gateway_tenant_budget_limit", tenant="search") == 0
        assert metric_sum(text, "inferwatch_gateway_tenant_budget_limit", tenant="search-v2") == 8


def test_a_thousand_keys_over_fifty_tenants_add_series_per_tenant_not_per_key(tmp_path, stubs):
    keys = [f"sk-{i:04d}" for i in range(1000)]
    f = tmp_path / "limits.yaml"
    f.write_text("tenants:\n" + "".join(
        f"  t{t:02d}: {{keys: [{', '.join(key_id(k) for k in keys[t * 20:(t + 1) * 20 - 2])}]}}\n" for t in range(50)))
    settings = GatewaySettings(upstream_url=stubs[0].url, limits_file=f, api_keys=keys)
    with GatewayServer(settings) as gw:
        with ThreadPoolExecutor(4) as pool:
            statuses = list(pool.map(lambda k: ask(gw, k).status_code, keys))
        assert statuses == [200] * 1000
        families = samples(gw.metrics_text())
        tenants = {value for (name, labels) in families if name.startswith("inferwatch_gateway_tenant_")
                   for label, value in labels if label == "tenant"}
        assert tenants == {f"t{t:02d}" for t in range(50)} | {"other"}  # 2 keys of every 20 are undeclared
        per_tenant = [n for (n, labels) in families if ("tenant", "t07") in labels]
        # 3 status classes, 5 token and goodput counters, two histograms of 8 buckets (+Inf, count,
        # sum): 30 samples, and the 10 _created of the counters and histograms
        assert len(per_tenant) == 40, sorted(per_tenant)
        assert metric_sum(gw.metrics_text(), "inferwatch_gateway_tenant_requests_total", tenant="other") == 100


def test_with_allow_anonymous_a_request_without_a_valid_key_is_served_as_anonymous(tmp_path, stubs):
    """The openai client always sends a key: with allow_anonymous, keys name tenants and do
    not guard the gateway. Without it, the same requests are refused."""
    body = {"model": "ok", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}
    for allow, refused in ((True, 0), (False, 3)):
        settings = GatewaySettings(upstream_url=stubs[0].url, limits_file=limits_file(tmp_path, 1000),
                                   api_keys=list(KEYS.values()), allow_anonymous=allow)
        with GatewayServer(settings) as gw:
            statuses = [requests.post(gw.url + "/v1/chat/completions", json=body, timeout=10).status_code,
                        ask(gw, "sk-wrong").status_code,
                        requests.post(gw.url + "/v1/chat/completions", json=body, headers={"authorization": ""},
                                      timeout=10).status_code]
            assert statuses == ([200] * 3 if allow else [401] * 3)
            assert ask(gw, KEYS["search"]).status_code == 200
            text = gw.metrics_text()
            assert metric_sum(text, "inferwatch_gateway_tenant_requests_total", tenant="anonymous",
                              status_class="2xx") == 3 - refused
            assert metric_sum(text, "inferwatch_gateway_tenant_requests_total", tenant="anonymous",
                              status_class="4xx") == refused
            assert metric_sum(text, "inferwatch_gateway_tenant_requests_total", tenant="search",
                              status_class="2xx") == 1
