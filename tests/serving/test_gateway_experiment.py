"""The split through the real gateway, in front of two stub upstreams (one per variant):
routing, stickiness, renaming, the assignment counter, the admin endpoint, persistence and
feedback. Real vLLM behind the split: tests/integration/test_ab_split.py."""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor

import orjson
import pytest
import requests

from inferwatch.serving.features import MemorySink
from inferwatch.serving.settings import GatewaySettings
from tests.support.servers import GatewayServer, metric_sum
from tests.support.stub_upstream import StubUpstream
from tests.support.waiting import eventually

CHAT = "/v1/chat/completions"
ADMIN = "adm1n"
AUTH = {"authorization": f"Bearer {ADMIN}"}


class MemoryFeedback:
    def __init__(self) -> None:
        self.records: list[dict] = []
        self.fail = False
        self.delay_s = 0.0  # a slow drift service: the await that concurrent ratings overlap on

    async def send(self, records: list[dict]) -> None:
        if self.delay_s:
            await asyncio.sleep(self.delay_s)
        if self.fail:
            raise ConnectionError("drift down")
        self.records.extend(records)

    async def close(self) -> None:
        return None


@pytest.fixture(scope="module")
def stubs():
    with StubUpstream() as a, StubUpstream() as b:
        yield a, b


@pytest.fixture
def experiment_file(tmp_path, stubs):
    a, b = stubs
    f = tmp_path / "experiments.yaml"
    f.write_text(f"""
experiments:
  chat:
    name: canary-1
    variants:
      - {{name: v1, upstream_url: "{a.url}", model: ok, weight: 0.5}}
      - {{name: v2, upstream_url: "{b.url}", model: ok, weight: 0.5}}
""")
    return f


def gateway(experiment_file, stubs, **extra) -> GatewayServer:
    settings = GatewaySettings(upstream_url=stubs[0].url, experiment_file=experiment_file, admin_token=ADMIN,
                               feature_flush_s=0.05, **extra)
    return GatewayServer(settings, feature_sink=MemorySink(), feedback_sink=MemoryFeedback())


@pytest.fixture
def gw(experiment_file, stubs):
    with gateway(experiment_file, stubs) as g:
        yield g


def chat(gw, user=None, stream=False, headers=None, model="chat"):
    body = {"model": model, "messages": [{"role": "user", "content": "hi"}], "stream": stream}
    if user is not None:
        body["user"] = user
    return requests.post(gw.url + CHAT, json=body, headers=headers, timeout=10)


def assignments(gw) -> dict[str, float]:
    text = gw.metrics_text()
    return {v: metric_sum(text, "inferwatch_gateway_assignments_total", model="chat", variant=v) for v in ("v1", "v2")}


def epoch(gw) -> int:
    return requests.get(gw.url + "/admin/experiments", headers=AUTH, timeout=5).json()["experiments"][0]["epoch"]


def weights(gw) -> list[float]:
    doc = requests.get(gw.url + "/admin/experiments", headers=AUTH, timeout=5).json()
    return [v["weight"] for v in doc["experiments"][0]["variants"]]


def test_each_user_keeps_a_variant_and_sees_the_public_name(gw, stubs):
    a, b = stubs
    seen_a, seen_b = len(a.seen), len(b.seen)
    by_user: dict[str, set[str]] = {}
    for _ in range(3):
        for i in range(30):
            r = chat(gw, user=f"user-{i}")
            assert r.status_code == 200 and r.json()["model"] == "chat"
            by_user.setdefault(f"user-{i}", set()).add(r.headers["x-inferwatch-variant"])
    assert all(len(v) == 1 for v in by_user.values())
    counts = {v: sum(3 for s in by_user.values() if s == {v}) for v in ("v1", "v2")}
    assert counts["v1"] > 0 and counts["v2"] > 0
    assert (len(a.seen) - seen_a, len(b.seen) - seen_b) == (counts["v1"], counts["v2"])
    assert {s["model"] for s in a.seen[seen_a:] + b.seen[seen_b:]} == {"ok"}  # the served name upstream
    assert assignments(gw) == counts
    text = gw.metrics_text()
    for v, n in counts.items():
        assert metric_sum(text, "inferwatch_gateway_requests_total", model="chat", variant=v, status_class="2xx") == n


def test_streams_are_renamed_chunk_by_chunk(gw):
    r = chat(gw, user="streamer", stream=True)
    events = [orjson.loads(e[6:]) for e in r.content.split(b"\n\n") if e.startswith(b"data: {")]
    assert events and {e["model"] for e in events} == {"chat"}
    assert r.headers["x-inferwatch-variant"] in ("v1", "v2")


def test_unit_key_from_header_then_random_and_records_carry_the_hash(gw):
    variants = {chat(gw, headers={"x-inferwatch-unit": "team-9"}).headers["x-inferwatch-variant"] for _ in range(8)}
    assert len(variants) == 1
    anonymous = {chat(gw).headers["x-inferwatch-variant"] for _ in range(40)}
    assert anonymous == {"v1", "v2"}  # 2**-39 to fail by chance
    chat(gw, user="alice@example.com")
    sink = gw.gateway.features.sink
    records = eventually(lambda: len(sink.records) >= 49 and list(sink.records))
    assert {r.experiment for r in records} == {"canary-1"} and {r.model for r in records} == {"chat"}
    assert len({r.unit for r in records[:8]}) == 1 and all(r.unit is None for r in records[8:48])
    alice = records[48]
    assert alice.unit and "alice" not in alice.unit and alice.variant in ("v1", "v2")
    assert {(r.epoch, r.weight) for r in records} == {(0, 0.5)}  # the file's weights: epoch 0


FORCE = {"x-inferwatch-admin-token": ADMIN}


def test_a_forced_variant_is_routed_but_not_counted_nor_recorded(gw, stubs):
    before, b_seen = assignments(gw), len(stubs[1].seen)
    for _ in range(5):
        r = chat(gw, user="user-1", headers={"x-inferwatch-variant": "v2", **FORCE})
        assert r.status_code == 200 and r.headers["x-inferwatch-variant"] == "v2"
    assert len(stubs[1].seen) == b_seen + 5 and assignments(gw) == before
    chat(gw, user="user-1")  # an assigned request: its record is the only one
    sink = gw.gateway.features.sink
    records = eventually(lambda: len(sink.records) >= 1 and list(sink.records))
    assert [r.experiment for r in records] == ["canary-1"]  # test traffic stays out of the A/B arms and drift


@pytest.mark.parametrize("headers", [
    {"x-inferwatch-variant": "v2"},
    {"x-inferwatch-variant": "v2", "x-inferwatch-admin-token": "wrong"},
    {"x-inferwatch-variant": "v9"},  # no token: not even the variant names are told
])
def test_forcing_a_variant_needs_the_admin_token(gw, stubs, headers):
    seen = len(stubs[0].seen) + len(stubs[1].seen)
    r = chat(gw, user="user-1", headers=headers)
    err = r.json()["error"]
    assert r.status_code == 403 and err["code"] == "forcing_not_allowed" and err["param"] == "x-inferwatch-variant"
    assert "x-inferwatch-admin-token" in err["message"]
    assert len(stubs[0].seen) + len(stubs[1].seen) == seen and assignments(gw) == {"v1": 0, "v2": 0}


def test_forcing_is_off_without_an_admin_token(experiment_file, stubs):
    settings = GatewaySettings(upstream_url=stubs[0].url, experiment_file=experiment_file)
    with GatewayServer(settings) as g:
        r = chat(g, headers={"x-inferwatch-variant": "v2", **FORCE})
        assert r.status_code == 403 and r.json()["error"]["code"] == "forcing_not_allowed"


def test_a_rolled_back_variant_cannot_be_forced_unless_allowed(experiment_file, stubs):
    for allow, status in ((False, 409), (True, 200)):
        with gateway(experiment_file, stubs, force_zero_weight=allow) as g:
            requests.put(g.url + "/admin/experiments/chat/weights", json={"weights": {"v2": 0}}, headers=AUTH,
                         timeout=5).raise_for_status()
            b_seen = len(stubs[1].seen)
            r = chat(g, headers={"x-inferwatch-variant": "v2", **FORCE})
            assert r.status_code == status and len(stubs[1].seen) == b_seen + (status == 200)
            if status == 409:
                err = r.json()["error"]
                assert err["code"] == "variant_rolled_back" and err["param"] == "x-inferwatch-variant"
                assert "INFERWATCH_GATEWAY_FORCE_ZERO_WEIGHT" in err["message"]
            assert chat(g, headers={"x-inferwatch-variant": "v1", **FORCE}).status_code == 200
        experiment_file.with_suffix(".state.json").unlink()


def test_an_unknown_forced_variant_is_a_400_naming_the_header_and_leaves_no_record(gw, stubs):
    seen = len(stubs[0].seen) + len(stubs[1].seen)
    r = chat(gw, headers={"x-inferwatch-variant": "v9", **FORCE})
    err = r.json()["error"]
    assert r.status_code == 400 and err["code"] == "unknown_variant" and err["param"] == "x-inferwatch-variant"
    assert "v1, v2" in err["message"]
    assert len(stubs[0].seen) + len(stubs[1].seen) == seen and assignments(gw) == {"v1": 0, "v2": 0}
    chat(gw, user="user-1")
    sink = gw.gateway.features.sink
    records = eventually(lambda: len(sink.records) >= 1 and list(sink.records))
    assert [r.variant for r in records] != ["default"] and len(records) == 1  # no record under a fake variant


def test_a_variants_params_are_set_over_the_clients(tmp_path, stubs):
    """A sampling configuration under test: the canary's requests carry its params, the
    control's the client's own; the record keeps the client's (its bins)."""
    a, b = stubs
    f = tmp_path / "experiments.yaml"
    f.write_text(f"""
experiments:
  chat:
    name: sampling-1
    variants:
      - {{name: v1, upstream_url: "{a.url}", model: ok, weight: 0}}
      - {{name: v2, upstream_url: "{b.url}", model: ok, weight: 1, params: {{repetition_penalty: 0.5, temperature:
      1.5}}}}
""")
    with gateway(f, stubs) as g:
        before = len(b.seen)
        r = requests.post(g.url + CHAT, json={"model": "chat", "messages": [{"role": "user", "content": "hi"}],
                                              "temperature": 0.2, "user": "u1"}, timeout=10)
        assert r.status_code == 200, r.text
        sent = b.seen[before]
        assert (sent["repetition_penalty"], sent["temperature"], sent["model"]) == (0.5, 1.5, "ok")
        assert r.json()["model"] == "chat"
        sink = g.gateway.features.sink
        record = eventually(lambda: sink.records[-1] if sink.records else None)
        assert record.variant == "v2" and record.temperature_bin == "0-0.5"


def test_models_outside_experiments_route_as_before(gw, stubs):
    r = chat(gw, model="ok", user="user-1")
    assert r.status_code == 200 and r.json()["model"] == "ok" and "x-inferwatch-variant" not in r.headers
    assert metric_sum(gw.metrics_text(), "inferwatch_gateway_requests_total", model="ok", variant="default") == 1
    ids = [m["id"] for m in requests.get(gw.url + "/v1/models", timeout=5).json()["data"]]
    assert "chat" in ids and "ok" in ids


@pytest.mark.parametrize("headers, body, status, code, param", [
    ({}, {"weights": {"v2": 0}}, 401, "invalid_admin_token", None),
    ({"authorization": "Bearer wrong"}, {"weights": {"v2": 0}}, 401, "invalid_admin_token", None),
    (AUTH, {"weights": {"v3": 0.5}}, 400, "invalid_weights", "weights.v3"),
    (AUTH, {"weights": {"v1": 0.5, "v2": 0.6}}, 400, "invalid_weights", "weights"),
    (AUTH, {"weights": {"v2": -0.1}}, 400, "invalid_weights", "weights.v2"),
    (AUTH, {"weights": {"v1": 0.2}, "extra": 1}, 400, "invalid_weights", "weights"),
    (AUTH, [1], 400, "invalid_weights", "weights"),
])
def test_bad_admin_calls_change_nothing(gw, experiment_file, headers, body, status, code, param):
    r = requests.put(gw.url + "/admin/experiments/chat/weights", json=body, headers=headers, timeout=5)
    err = r.json()["error"]
    assert r.status_code == status and err["code"] == code and err["param"] == param and err["message"]
    assert weights(gw) == [0.5, 0.5] and epoch(gw) == 0
    saved = orjson.loads(experiment_file.with_suffix(".state.json").read_bytes())  # as written at start
    assert saved["chat"]["weights"] == [0.5, 0.5] and saved["chat"]["epoch"] == 0
    assert metric_sum(gw.metrics_text(), "inferwatch_gateway_experiment_weight_ratio", variant="v2") == 0.5


def test_admin_for_a_model_without_experiment_is_a_404(gw):
    r = requests.put(gw.url + "/admin/experiments/ok/weights", json={"weights": {"v2": 0}}, headers=AUTH, timeout=5)
    assert r.status_code == 404 and r.json()["error"]["code"] == "experiment_not_found"


def test_admin_is_off_without_a_token(experiment_file, stubs):
    settings = GatewaySettings(upstream_url=stubs[0].url, experiment_file=experiment_file)
    with GatewayServer(settings) as g:
        r = requests.put(g.url + "/admin/experiments/chat/weights", json={"weights": {"v2": 0}}, headers=AUTH,
                         timeout=5)
        assert r.status_code == 403 and "INFERWATCH_GATEWAY_ADMIN_TOKEN" in r.json()["error"]["message"]


def test_rollback_in_one_call_persists_across_a_restart(experiment_file, stubs, caplog):
    with gateway(experiment_file, stubs) as g:
        r = requests.put(g.url + "/admin/experiments/chat/weights", json={"weights": {"v2": 0}}, headers=AUTH,
                         timeout=5)
        assert r.status_code == 200 and [v["weight"] for v in r.json()["variants"]] == [1.0, 0.0]
        assert {chat(g, user=f"u{i}").headers["x-inferwatch-variant"] for i in range(40)} == {"v1"}
        assert assignments(g) == {"v1": 40, "v2": 0}
        assert metric_sum(g.metrics_text(), "inferwatch_gateway_experiment_weight_ratio", variant="v2") == 0
    assert "weights v1=0.5, v2=0.5 -> v1=1, v2=0, epoch 0 -> 1" in caplog.text
    with gateway(experiment_file, stubs) as g:
        assert weights(g) == [1.0, 0.0] and epoch(g) == 1
        r = requests.put(g.url + "/admin/experiments/chat/weights", json={"weights": {"v2": 0.05}}, headers=AUTH,
                         timeout=5)
        assert [v["weight"] for v in r.json()["variants"]] == pytest.approx([0.95, 0.05]) and r.json()["epoch"] == 2
        chat(g, user="after-restart")
        records = eventually(lambda: list(g.gateway.features.sink.records))
        assert all(r.epoch == 2 and r.weight == pytest.approx((0.95, 0.05)[r.variant == "v2"]) for r in records)
    with gateway(experiment_file, stubs) as g:
        assert weights(g) == pytest.approx([0.95, 0.05]) and epoch(g) == 2
    # the operator edits the file's weights: the file wins, in the epoch after the saved one
    experiment_file.write_text(experiment_file.read_text().replace("weight: 0.5}", "weight: 0.6}", 1).replace(
        "weight: 0.5}", "weight: 0.4}", 1))
    with gateway(experiment_file, stubs) as g:
        assert weights(g) == pytest.approx([0.6, 0.4]) and epoch(g) == 3


def test_feedback_reaches_the_sink_joined_to_the_variant(gw):
    r = chat(gw, user="rater")
    variant, rid = r.headers["x-inferwatch-variant"], r.json()["id"]
    stream = chat(gw, user="rater", stream=True)
    stream_id = orjson.loads(stream.content.split(b"\n\n")[0][6:])["id"]
    fb = gw.gateway.feedback_sink
    for response_id, rating in ((rid, {"thumbs": "up"}), (stream_id, {"score": 0.2})):
        answer = requests.post(gw.url + "/v1/feedback", json={"response_id": response_id, **rating}, timeout=5)
        assert answer.status_code == 200 and answer.json()["variant"] == variant
    assert [(x["model"], x["variant"], x["experiment"], x["epoch"], x["score"]) for x in fb.records] == [
        ("chat", variant, "canary-1", 0, 1.0), ("chat", variant, "canary-1", 0, 0.2)]
    assert len({x["unit"] for x in fb.records}) == 1 and "rater" not in fb.records[0]["unit"]
    again = requests.post(gw.url + "/v1/feedback", json={"response_id": rid, "thumbs": "down"}, timeout=5)
    assert again.status_code == 409 and len(fb.records) == 2
    text = gw.metrics_text()
    assert metric_sum(text, "inferwatch_gateway_feedback_total", variant=variant, outcome="positive") == 1
    assert metric_sum(text, "inferwatch_gateway_feedback_total", variant=variant, outcome="negative") == 1


def test_undelivered_feedback_is_a_503_and_can_be_retried(gw):
    rid = chat(gw, user="rater").json()["id"]
    fb = gw.gateway.feedback_sink
    fb.fail = True
    r = requests.post(gw.url + "/v1/feedback", json={"response_id": rid, "thumbs": "up"}, timeout=5)
    assert r.status_code == 503 and r.json()["error"]["code"] == "feedback_unavailable"
    fb.fail = False
    r = requests.post(gw.url + "/v1/feedback", json={"response_id": rid, "thumbs": "up"}, timeout=5)
    assert r.status_code == 200 and len(fb.records) == 1


def test_concurrent_ratings_of_one_answer_count_once(gw):
    rid = chat(gw, user="rater").json()["id"]
    fb = gw.gateway.feedback_sink
    fb.delay_s = 0.2

    def rate(_: int) -> int:
        return requests.post(gw.url + "/v1/feedback", json={"response_id": rid, "thumbs": "up"}, timeout=10).status_code

    with ThreadPoolExecutor(20) as pool:
        statuses = sorted(pool.map(rate, range(20)))
    assert statuses == [200] + [409] * 19 and len(fb.records) == 1


def test_concurrent_ratings_while_delivery_fails_leave_the_answer_rateable(gw):
    rid = chat(gw, user="rater").json()["id"]
    fb = gw.gateway.feedback_sink
    fb.delay_s, fb.fail = 0.2, True
    with ThreadPoolExecutor(5) as pool:
        statuses = set(pool.map(lambda _: requests.post(gw.url + "/v1/feedback", json={
            "response_id": rid, "thumbs": "up"}, timeout=10).status_code, range(5)))
    assert statuses <= {503, 409} and 503 in statuses and fb.records == []
    fb.delay_s, fb.fail = 0.0, False
    r = requests.post(gw.url + "/v1/feedback", json={"response_id": rid, "thumbs": "down"}, timeout=5)
    assert r.status_code == 200 and len(fb.records) == 1


@pytest.mark.parametrize("body, status, code, param", [
    ({"response_id": "chatcmpl-never", "thumbs": "up"}, 404, "response_not_found", "response_id"),
    ({"response_id": "x", "thumbs": "sideways"}, 400, "invalid_feedback", "thumbs"),
    ({"response_id": "x", "score": 2}, 400, "invalid_feedback", "score"),
    ({"response_id": "x", "score": 1, "thumbs": "up"}, 400, "invalid_feedback", "score"),
    ({"response_id": "x"}, 400, "invalid_feedback", "score"),
    ({"response_id": 7, "score": 1}, 400, "invalid_feedback", "response_id"),
    ({"response_id": "x", "score": 1, "text": "great"}, 400, "invalid_feedback", "text"),
])
def test_bad_feedback_is_a_clear_4xx_and_sends_nothing(gw, body, status, code, param):
    r = requests.post(gw.url + "/v1/feedback", json=body, timeout=5)
    err = r.json()["error"]
    assert r.status_code == status and err["code"] == code and err["param"] == param
    assert gw.gateway.feedback_sink.records == []
    assert metric_sum(gw.metrics_text(), "inferwatch_gateway_rejected_requests_total", route="/v1/feedback",
                      code=code) == 1


def test_the_cli_ramps_and_rolls_back_through_the_admin_endpoint(gw):
    from typer.testing import CliRunner

    from inferwatch.cli import app

    env = {"INFERWATCH_GATEWAY_URL": gw.url, "INFERWATCH_GATEWAY_ADMIN_TOKEN": ADMIN}
    runner = CliRunner()
    for step in ("1%", "5%", "25%", "50%", "100%"):
        result = runner.invoke(app, ["experiment", "set-weights", "chat", f"v2={step}"], env=env)
        assert result.exit_code == 0, result.output
        assert weights(gw) == pytest.approx([1 - float(step[:-1]) / 100, float(step[:-1]) / 100])
    result = runner.invoke(app, ["experiment", "set-weights", "chat", "v2=0"], env=env)
    assert result.exit_code == 0 and weights(gw) == [1.0, 0.0]
    assert "v1" in runner.invoke(app, ["experiment", "show"], env=env).output
    bad = runner.invoke(app, ["experiment", "set-weights", "chat", "v3=0.5"], env=env)
    assert bad.exit_code == 2 and "no variant 'v3'" in bad.output and weights(gw) == [1.0, 0.0]
    unauthorized = runner.invoke(app, ["experiment", "show"], env={**env, "INFERWATCH_GATEWAY_ADMIN_TOKEN": "x"})
    assert unauthorized.exit_code == 2 and "401" in unauthorized.output
    for args, says in ((["v2=nan"], "finite number"), (["v2=inf%"], "finite number"), (["v2=1e-400"], "from 0"),
                       (["v2=0.5", "v2=0.6"], "given twice: v2"), (["v2=half"], "must be a number")):
        refused = runner.invoke(app, ["experiment", "set-weights", "chat", *args], env=env)
        assert refused.exit_code == 2 and says in refused.output, (args, refused.output)
    assert weights(gw) == [1.0, 0.0]  # none of them reached the gateway


def test_each_upstream_exports_the_largest_share_routed_to_it(experiment_file, stubs):
    """GatewayUpstreamDown stands down for an upstream at 0 (a rolled-back canary may be gone)."""
    a, b = stubs
    share = lambda g, url: metric_sum(g.metrics_text(), "inferwatch_gateway_upstream_weight_ratio",  # noqa: E731
                                      upstream=url)
    with gateway(experiment_file, stubs) as g:
        assert (share(g, a.url), share(g, b.url)) == (1.0, 0.5)  # a is also the default upstream
        for given, expected in (({"v2": 0}, 0.0), ({"v2": 0.25}, 0.25), ({"v1": 0}, 1.0)):
            r = requests.put(g.url + "/admin/experiments/chat/weights", json={"weights": given}, headers=AUTH,
                             timeout=5)
            assert r.status_code == 200, r.text
            assert (share(g, a.url), share(g, b.url)) == (1.0, expected), given
