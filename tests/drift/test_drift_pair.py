"""A drift pair, the way Prometheus runs for high availability: the gateway sends every
feature record and rating to each drift service through a queue of its own. One down
neither slows nor drops what goes to the other; back, it gets everything it missed (the
gateway held it), and then both give the same windows, verdicts and A/B decision.

Real drift services (their apps under uvicorn, SQLite on disk), the real gateway, a stub
upstream for answers."""

from __future__ import annotations

import asyncio
import re
import time
from pathlib import Path

import pytest
import requests
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from inferwatch.drift.service.app import DriftSettings, create_app
from inferwatch.serving.settings import GatewaySettings
from tests.support.servers import AppServer, GatewayServer, metric_sum
from tests.support.sockets import free_port
from tests.support.stub_upstream import StubUpstream
from tests.support.waiting import eventually

CHAT = "/v1/chat/completions"
USERS = 40
# what in the HTML report depends on when it was drawn: dates and times, ages in seconds
CLOCK = re.compile(r"\d{4}-\d\d-\d\d[ T]\d\d:\d\d(:\d\d(\.\d+)?)?(Z|[+-]\d\d:?\d\d| UTC)?|\b\d+(\.\d+)? ?s ago\b")


@pytest.fixture(scope="module")
def stub():
    with StubUpstream() as s:
        yield s


def pair_experiment(tmp_path, stub) -> Path:
    """Model 'chat' split evenly between v1 and v2, both on the stub."""
    path = tmp_path / "experiments.yaml"
    path.write_text(f"""
experiments:
  chat:
    name: pair
    variants:
      - {{name: v1, upstream_url: "{stub.url}", model: ok, weight: 0.5}}
      - {{name: v2, upstream_url: "{stub.url}", model: ok, weight: 0.5}}
""")
    return path


def drift_app(tmp_path, name: str):
    return create_app(DriftSettings(db_path=str(tmp_path / f"{name}.sqlite3")))


def ingested(drift: AppServer) -> float:
    return metric_sum(drift.metrics_text(), "inferwatch_drift_ingested_records_total")


def without_clock(doc: object) -> object:
    """The JSON with what depends on when it was asked (the clock, ages) left out."""
    if isinstance(doc, dict):
        return {k: without_clock(v) for k, v in doc.items()
                if not (k.endswith("_at") or k in ("now", "age_s", "window_end", "window_start", "generated"))}
    if isinstance(doc, list):
        return [without_clock(v) for v in doc]
    return doc


def views(drift: AppServer) -> dict:
    ab = requests.get(f"{drift.url}/v1/ab/chat", params={"control": "v1", "treatment": "v2", "min_units": 10},
                      timeout=10)
    assert ab.status_code == 200, ab.text
    return {"drift": without_clock(requests.get(drift.url + "/v1/drift", timeout=10).json()),
            "ab": without_clock(ab.json())}


def test_one_drift_service_down_costs_the_other_nothing_and_it_catches_up_when_back(stub, tmp_path):
    experiments = pair_experiment(tmp_path, stub)
    b_port = free_port()
    b_url = f"http://127.0.0.1:{b_port}"
    with AppServer(drift_app(tmp_path, "a")) as a:
        settings = GatewaySettings(upstream_url=stub.url, drift_urls=[a.url, b_url], feature_flush_s=0.05,
                                   experiment_file=experiments)
        with GatewayServer(settings) as gw:
            took, ids = [], []
            started = time.time()
            for i in range(USERS):  # B is down the whole time
                t0 = time.monotonic()
                r = requests.post(gw.url + CHAT, json={"model": "chat", "user": f"user-{i}",
                                                       "messages": [{"role": "user", "content": "hi"}]}, timeout=10)
                took.append(time.monotonic() - t0)
                assert r.status_code == 200
                ids.append(r.json()["id"])
            assert sorted(took)[USERS // 2] < 0.05
            for rid in ids[:10]:
                fb = requests.post(gw.url + "/v1/feedback", json={"response_id": rid, "thumbs": "up"}, timeout=10)
                assert fb.status_code == 200, fb.text  # taken by A
            eventually(lambda: ingested(a) == USERS, timeout_s=10)
            text = gw.metrics_text()
            assert metric_sum(text, "inferwatch_gateway_feature_records_total", outcome="sent", destination=a.url) \
                == USERS
            assert metric_sum(text, "inferwatch_gateway_feature_queue_depth", destination=b_url) == USERS  # held
            assert metric_sum(text, "inferwatch_gateway_rating_queue_depth", destination=b_url) == 10
            assert metric_sum(text, "inferwatch_gateway_delivery_failures_total", destination=b_url) > 0
            assert metric_sum(text, "inferwatch_gateway_feature_records_total", outcome="dropped_send_error") == 0

            with AppServer(drift_app(tmp_path, "b"), port=b_port) as b:  # B is back, on its address
                eventually(lambda: ingested(b) == USERS, timeout_s=20)  # within the retry backoff (10 s at most)
                eventually(lambda: metric_sum(gw.metrics_text(), "inferwatch_gateway_rating_queue_depth",
                                              destination=b_url) == 0, timeout_s=20)
                # a baseline reaches both the documented way: the same POST to each replica
                window = {"model": "chat", "variant": "v1", "from": started - 60, "to": time.time() + 1}
                for drift in (a, b):
                    r = requests.post(drift.url + "/v1/baselines", json=window, timeout=10)
                    assert r.status_code in (200, 201), r.text
                baselines = [without_clock(requests.get(d.url + "/v1/baselines", timeout=10).json()) for d in (a, b)]
                assert baselines[0] == baselines[1] and baselines[0]
                first, second = views(a), views(b)
                assert first["ab"]["units"] == {"control": first["ab"]["units"]["control"],
                                                "treatment": USERS - first["ab"]["units"]["control"]}
                assert first["ab"]["metrics"]["feedback"]["n"] == second["ab"]["metrics"]["feedback"]["n"]
                assert sum(first["ab"]["metrics"]["feedback"]["n"].values()) == 10
                assert first == second
                reports = [re.sub(CLOCK, "<time>", requests.get(d.url + "/report", timeout=30).text) for d in (a, b)]
                assert reports[0] == reports[1] and "pair" in reports[0]  # the HTML report too, clock aside
            text = gw.metrics_text()
            assert metric_sum(text, "inferwatch_gateway_feature_records_total", outcome="sent", destination=b_url) \
                == USERS
            assert metric_sum(text, "inferwatch_gateway_feature_records_total", outcome="dropped_full") == 0


def answer_losing_proxy(target: str, lost_batches: int, slow_ratings: int, slow_s: float
                        ) -> tuple[Starlette, dict[str, int]]:
    """In front of a drift service: passes every request on, but answers the first
    ``lost_batches`` batches 502 after the service stored them (the answer lost on the way),
    and the first ``slow_ratings`` ratings only after ``slow_s`` (a replica too slow for the
    gateway's timeout, which still stores what it was sent). Also returns how many requests
    of each path it passed on so far."""
    left = {"/v1/ingest": lost_batches, "/v1/feedback": slow_ratings}
    passed = {"/v1/ingest": 0, "/v1/feedback": 0}

    async def forward(request: Request) -> Response:
        body, path = await request.body(), request.url.path
        headers = {k: v for k, v in request.headers.items() if k in ("content-type", "idempotency-key")}
        hold = left.get(path, 0) > 0
        if hold:
            left[path] -= 1
            if path == "/v1/feedback":
                await asyncio.sleep(slow_s)
        r = await run_in_threadpool(requests.request, request.method, target + path, data=body, headers=headers,
                                    timeout=10)
        passed[path] = passed.get(path, 0) + 1
        if hold and path == "/v1/ingest":
            return Response(status_code=502)
        return Response(r.content, r.status_code, media_type=r.headers.get("content-type"))

    return Starlette(routes=[Route("/{path:path}", forward, methods=["GET", "POST"])]), passed


def test_a_drift_replica_whose_answers_are_lost_or_late_stores_each_thing_once_and_holds_no_rating_up(stub,
                                                                                                        tmp_path):
    """The gateway sends again what a drift replica stored but did not confirm in time: the
    replica keeps each batch once (its Idempotency-Key) and each rating once (its answer's
    id). A rating waits for neither: the other replica took it."""
    experiments = pair_experiment(tmp_path, stub)
    with AppServer(drift_app(tmp_path, "a")) as a, AppServer(drift_app(tmp_path, "b")) as b:
        proxy, passed = answer_losing_proxy(a.url, lost_batches=2, slow_ratings=1, slow_s=6.0)
        with AppServer(proxy) as to_a, GatewayServer(GatewaySettings(
                upstream_url=stub.url, drift_urls=[to_a.url, b.url], feature_flush_s=0.05,
                experiment_file=experiments)) as gw:
            ids = []
            for i in range(USERS):
                r = requests.post(gw.url + CHAT, json={"model": "chat", "user": f"user-{i}",
                                                       "messages": [{"role": "user", "content": "hi"}]}, timeout=10)
                assert r.status_code == 200
                ids.append(r.json()["id"])
            for rid in ids[:5]:
                t0 = time.monotonic()
                fb = requests.post(gw.url + "/v1/feedback", json={"response_id": rid, "thumbs": "up"}, timeout=10)
                assert fb.status_code == 200, fb.text
                assert time.monotonic() - t0 < 2.5  # not the slow one's 6 s: the other took it
            # A got four ratings at once, the slow one's copy after the gateway's 5 s timeout (from
            # its queue), and then the slow one itself
            eventually(lambda: passed["/v1/feedback"] == 6, timeout_s=30)
            eventually(lambda: metric_sum(gw.metrics_text(), "inferwatch_gateway_feature_queue_depth") == 0,
                       timeout_s=30)
            text = gw.metrics_text()
            assert metric_sum(text, "inferwatch_gateway_delivery_failures_total", kind="features",
                              destination=to_a.url) == 2
            assert metric_sum(text, "inferwatch_gateway_rating_queue_depth", destination=to_a.url) == 0
            assert ingested(a) == ingested(b) == USERS
            assert metric_sum(a.metrics_text(), "inferwatch_drift_rejected_batches_total", reason="duplicate") == 2
            # B's copies of the ratings are not awaited above (only A's queue): the two views
            # agree once both have what was sent, and then hold 5 ratings each, not 6
            first, second = eventually(lambda: (v := (views(a), views(b)))[0] == v[1] and v, timeout_s=15)
            assert sum(first["ab"]["metrics"]["feedback"]["n"].values()) == 5
            assert first == second


def test_a_rating_neither_drift_service_takes_is_refused_and_not_queued(stub, tmp_path):
    down = [f"http://127.0.0.1:{free_port()}", f"http://127.0.0.1:{free_port()}"]
    settings = GatewaySettings(upstream_url=stub.url, drift_urls=down, feature_flush_s=0.05)
    with GatewayServer(settings) as gw:
        r = requests.post(gw.url + CHAT, json={"model": "ok", "messages": [{"role": "user", "content": "hi"}]},
                          timeout=10)
        fb = requests.post(gw.url + "/v1/feedback", json={"response_id": r.json()["id"], "thumbs": "up"}, timeout=10)
        assert fb.status_code == 503 and fb.json()["error"]["code"] == "feedback_unavailable"
        assert metric_sum(gw.metrics_text(), "inferwatch_gateway_rating_queue_depth") == 0  # the client retries


@pytest.mark.parametrize("urls", ["http://a:1,http://a:1", "http://a:1,ftp://b", "http://a:1 http://b:2", "http://"])
def test_drift_urls_that_cannot_work_are_refused_at_start(urls, monkeypatch):
    from pydantic import ValidationError
    monkeypatch.setenv("INFERWATCH_GATEWAY_DRIFT_URLS", urls)
    with pytest.raises(ValidationError) as info:
        GatewaySettings()
    assert "drift_urls" in str(info.value)
