"""The demo's scenarios, in the order a newcomer meets them. Each one says up front what it
does and where its effect shows (panel, alert, page), runs for a bounded time on the shared
request budget, then looks for that effect where an SRE would (Prometheus, the local pager,
the drift service, the gateway) and reports what it saw. Nothing here asserts: the demo
reports, and `inferwatch demo` exits non-zero when an announced effect was not seen.

Times are at pace 1 (about six minutes in all, at `inferwatch up`'s default 10 s scrape
and evaluation); ``--pace`` scales the traffic phases, never the waits for Prometheus,
Alertmanager or the drift service, which run on their own clocks."""

from __future__ import annotations

import os
import signal
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import psutil
import requests

from inferwatch.demo.stack import DemoError, Stack, is_loopback
from inferwatch.demo.traffic import Ask, Load, short_asks

T = TypeVar("T")
AB_MIN_UNITS = 20  # units per arm before the verdict may say more than hold (the service's floor is 10)
CANARY_MIN_S = 60.0  # at pace 1: the canary's traffic outlasts a quick verdict, for the panels
RESTART_MAX_S = 300.0  # a restarted vLLM loads its model again: the tiny one in ~30-60 s on two cores


@dataclass(frozen=True)
class Seen:
    """One announced effect and whether the demo found it."""

    effect: str
    seen: bool
    detail: str = ""


@dataclass
class Demo:
    """What every scenario shares: the stack, the load and its budget, the pace, the console."""

    stack: Stack
    load: Load
    pace: float
    say: Callable[[str], None]
    marks: dict[str, float] = field(default_factory=dict)  # times scenarios leave for later ones

    def seconds(self, nominal: float) -> float:
        return max(5.0, nominal * self.pace)

    def wait_for(self, check: Callable[[], T], timeout_s: float, every_s: float = 2.0) -> T | None:
        """Poll until ``check()`` returns something truthy; None at the timeout. A read that
        fails (a service restarting) counts as not yet."""
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                if value := check():
                    return value
            except (requests.RequestException, KeyError, ValueError):
                pass
            if time.monotonic() >= deadline:
                return None
            time.sleep(every_s)


@dataclass(frozen=True)
class Scenario:
    name: str
    title: str
    nominal_s: float  # the traffic phase at pace 1
    announce: tuple[str, ...]
    run: Callable[[Demo], list[Seen]]


def _codes(counts: Counter[int]) -> str:
    return ", ".join(f"{n} × {code or 'no answer'}" for code, n in sorted(counts.items())) or "none sent"


def _window(since: float) -> str:
    return f"{max(1, int(time.time() - since) + 1)}s"


# -- steady ---------------------------------------------------------------------------------------

def steady(demo: Demo) -> list[Seen]:
    s = demo.stack
    start = time.time()
    counts = demo.load.run(demo.seconds(90), clients=2, asks=short_asks(s.model, seed=1, adapters=s.adapters()),
                           per_client_rps=1.5)
    demo.marks["steady_from"], demo.marks["steady_to"] = start, time.time()
    ok = counts[200]
    expr = (f'sum(increase(inferwatch_gateway_requests_total{{model="{s.model}",status_class="2xx"}}'
            f'[{_window(start)}]))')
    counted = demo.wait_for(lambda: (v := s.scalar(expr)) is not None and v >= 0.5 * ok and v, 45)
    return [Seen("requests answered", ok > 0 and set(counts) == {200}, _codes(counts)),
            Seen("Prometheus counts them at the gateway", counted is not None,
                 f"increase() over the scenario: {counted:.0f}" if counted else "no samples yet"),
            _no_page(s, start)]


def _no_page(s: Stack, since: float) -> Seen:
    pages = s.pages(None, since)
    return Seen("nothing pages", not pages, ", ".join(p["labels"]["alertname"] for p in pages))


STEADY = Scenario(
    "steady", "Steady traffic", 90,
    ("two clients, about 3 requests a second, short prompts, half of them streamed",
     "Serving → Requests per second and Time to first token fill in; Error ratio stays 0",
     "SLOs → no budget burns faster; nothing pages"), steady)


# -- burst ----------------------------------------------------------------------------------------

BURST_CLIENTS = 12  # 24 starved vLLM's own /metrics past a 1 s scrape timeout on two cores: a false VLLMDown


def burst(demo: Demo) -> list[Seen]:
    s = demo.stack
    start = time.time()
    # prompts as the steady traffic's (3 to 12 words): the drift scenario's baseline is the steady
    # traffic, and its window holds the burst too, so longer prompts here would be a drift of their own
    asks = lambda i: Ask(s.model, 3 + i % 10, 64, True)  # noqa: E731
    counts = demo.load.run(demo.seconds(45), clients=BURST_CLIENTS, asks=asks)
    expr = (f'max_over_time(sum(inferwatch_gateway_requests_in_flight{{model="{s.model}"}})'
            f'[{_window(start)}:1s])')
    peak = demo.wait_for(lambda: (v := s.scalar(expr)) is not None and v >= BURST_CLIENTS / 2 and v, 30)
    return [Seen("requests answered", counts[200] > 0, _codes(counts)),
            Seen(f"at least {BURST_CLIENTS // 2} requests in flight at the gateway", peak is not None,
                 f"peak seen by Prometheus: {peak:.0f}" if peak else "no scrape saw the burst"),
            _no_page(s, start)]


BURST = Scenario(
    "burst", "A burst", 45,
    (f"{BURST_CLIENTS} clients stream long answers at once, as a batch job or a retry storm would",
     "Serving → In flight jumps, vLLM's Waiting queue and Time to first token p95 rise, KV cache usage climbs",
     "nothing pages: a short burst is within the SLO"), burst)


# -- vLLM outage ----------------------------------------------------------------------------------

def supervised_vllm(vllm_url: str) -> psutil.Process:
    """vLLM's API server on this machine, when `inferwatch up` supervises it (and so restarts
    it): the only vLLM the demo will crash. One started by hand would stay down."""
    from urllib.parse import urlsplit

    port = urlsplit(vllm_url).port
    if not is_loopback(vllm_url) or port is None:
        raise DemoError(f"vLLM at {vllm_url} is not on this machine's loopback: the outage crashes a local process")
    try:
        pids = {c.pid for c in psutil.net_connections("tcp")
                if c.status == psutil.CONN_LISTEN and getattr(c.laddr, "port", None) == port and c.pid}  # laddr: () when unbound
        server = psutil.Process(min(pids)) if pids else None
        parent = server.parent() if server else None
        supervised = parent is not None and {"inferwatch", "up"} <= {os.path.basename(a) for a in parent.cmdline()}
    except (psutil.AccessDenied, psutil.NoSuchProcess) as exc:
        raise DemoError(f"cannot look at the process on port {port}: {exc}") from None
    if server is None:
        raise DemoError(f"no process of this user listens on port {port} (vLLM {vllm_url})")
    if not supervised:
        raise DemoError(f"vLLM on port {port} (pid {server.pid}) is not run by `inferwatch up`, which would restart "
                        "it: the demo leaves it alone")
    return server


def outage(demo: Demo) -> list[Seen]:
    s = demo.stack
    if not demo.wait_for(lambda: requests.get(f"{s.vllm}/health", timeout=2).status_code == 200, RESTART_MAX_S):
        return [Seen("vLLM crashed", False, f"vLLM at {s.vllm} has not been healthy for {RESTART_MAX_S:.0f} s")]
    if s.firing("VLLMDown"):
        demo.say("  VLLMDown still fires from an earlier outage: waiting for it to resolve, so this one pages anew")
        if not demo.wait_for(lambda: not s.firing("VLLMDown"), 120):
            return [Seen("vLLM crashed", False, "VLLMDown from an earlier outage did not resolve within 2 minutes")]
    try:
        server = supervised_vllm(s.vllm)
    except DemoError as exc:
        return [Seen("vLLM crashed", False, str(exc))]
    start = time.time()
    stop = threading.Event()
    result: dict[str, Counter[int]] = {}
    client = Load(demo.load.gateway, demo.load.budget, timeout_s=5, api_keys=demo.load.keys)  # gives up as a user would
    light = threading.Thread(target=lambda: result.setdefault("c", client.run(
        RESTART_MAX_S, clients=1, asks=short_asks(s.model, seed=3), per_client_rps=1, stop=stop.is_set)))
    os.killpg(os.getpgid(server.pid), signal.SIGKILL)  # the API server and its engine core, as an OOM kill would
    demo.say(f"  vLLM (pid {server.pid} and its engine) killed; `inferwatch up` restarts it")
    light.start()
    try:
        firing = demo.wait_for(lambda: s.firing("VLLMDown"), 90)
        back = demo.wait_for(lambda: requests.get(f"{s.vllm}/health", timeout=2).status_code == 200 and time.time(),
                             RESTART_MAX_S)
        demo.say(f"  vLLM serves again after {back - start:.0f} s" if back else "  vLLM has not come back")
        page = demo.wait_for(lambda: s.pages("VLLMDown", start), 60)
    finally:
        stop.set()
        light.join()
    counts = result.get("c", Counter())
    return [Seen("VLLMDown fires in Prometheus", firing is not None),
            Seen("VLLMDown pages the on-call (local pager)", page is not None,
                 f"received {page[0]['received_at'] - start:.0f} s after the crash" if page else "no page"),
            Seen("clients got errors while vLLM was down", sum(n for c, n in counts.items() if c != 200) > 0,
                 _codes(counts)),
            Seen("the supervisor brought vLLM back", back is not None,
                 f"after {back - start:.0f} s" if back else f"not within {RESTART_MAX_S:.0f} s")]


OUTAGE = Scenario(
    "outage", "vLLM outage", 60,
    ("vLLM is killed (SIGKILL, as the kernel's OOM killer would) and `inferwatch up` restarts it, while one client "
     "keeps asking, giving up after 5 s",
     "Serving → Error ratio goes red with 503s, Gateways reaching vLLM drops, Restarts counts one",
     "VLLMDown (critical) pages the local pager; the availability SLO burns but its page is inhibited while "
     "vLLM is down; VLLMDown resolves about a minute after vLLM serves again (three kills within 15 minutes "
     "also page InferwatchCrashLooping)"), outage)


# -- slow canary ----------------------------------------------------------------------------------

def _treatment(exp: dict[str, Any]) -> str:
    names = [v["name"] for v in exp["variants"] if v["name"] != exp["control"]]
    return "canary" if "canary" in names else names[0]


def canary(demo: Demo) -> list[Seen]:
    s = demo.stack
    try:
        exp = s.experiment()
    except DemoError as exc:
        return [Seen("the canary takes half the traffic", False, str(exc))]
    control, treatment = exp["control"], _treatment(exp)
    run = uuid.uuid4().hex[:8]
    asks = lambda i: Ask(s.ab_model, 4 + i % 8, 16, True, user=f"demo-{run}-{i}")  # noqa: E731
    verdict: dict[str, Any] = {}

    def judged() -> dict[str, Any] | None:  # the epoch this ramp opened, not an earlier run's
        r = s.drift_get(f"/v1/ab/{s.ab_model}", control=control, treatment=treatment, min_units=AB_MIN_UNITS,
                        epoch=epoch)
        if r.status_code in (200, 412):
            verdict.update(r.json())
        return verdict if verdict.get("decision") == "rollback" else None

    stop = threading.Event()
    epoch = s.set_weights({control: 0.5, treatment: 0.5})["epoch"]
    ramped = time.monotonic()
    demo.say(f"  {s.ab_model}: {control} 50 % / {treatment} 50 % (weight epoch {epoch})")
    try:
        load = threading.Thread(target=lambda: demo.load.run(demo.seconds(180), clients=4, asks=asks,
                                                             per_client_rps=2, stop=stop.is_set))
        load.start()
        rolled = demo.wait_for(judged, demo.seconds(180) + 30, every_s=3)
        time.sleep(max(0.0, demo.seconds(CANARY_MIN_S) - (time.monotonic() - ramped)))  # long enough to see
        stop.set()
        load.join()
    finally:
        stop.set()
        after = s.set_weights({control: 1.0, treatment: 0.0})
    demo.say(f"  rolled back: {s.ab_model} sends all traffic to {control}")
    weight = next(v["weight"] for v in after["variants"] if v["name"] == treatment)
    # per user or per request: each request comes from a new user, so either may be the one Holm names first
    named = {"ttft", "ttft_per_request"} & set(verdict.get("worse", ()))
    return [Seen("the A/B verdict says rollback, naming time to first token", bool(rolled) and bool(named),
                 f"{verdict.get('decision', 'no verdict')}, worse: {', '.join(verdict.get('worse', [])) or 'none'}: "
                 f"{'; '.join(verdict.get('reasons', []))[:300]}"),
            Seen("the canary's weight is back to 0 at the gateway", weight == 0, f"{treatment} weight {weight}")]


CANARY = Scenario(
    "canary", "A slow canary in an A/B experiment", 180,
    ("the experiment's canary is the same vLLM behind a relay that holds each request back (a slower build); "
     "it gets 50 % of the A/B model's traffic (4 clients, 8 requests a second), each request from a new user",
     "Drift → A/B verdicts: the decision turns to rollback, with time to first token worse; Serving → latency "
     "per variant splits",
     "the demo then rolls the canary back to 0 % (ABCanaryHurtingUsers would page after 2 minutes above 5 %)"),
    canary)


# -- prompt-length drift --------------------------------------------------------------------------

def _segment(s: Stack) -> dict[str, Any] | None:
    segments = s.drift_get("/v1/drift", model=s.model).json()["segments"]
    return next((seg for seg in segments if seg["model"] == s.model), None)


def _baseline(demo: Demo) -> str:
    """A baseline of the steady traffic for the model's segment, unless one exists."""
    s = demo.stack
    seg = demo.wait_for(lambda: _segment(s), 30)
    if seg is None:
        raise DemoError(f"the drift service holds no records of {s.model}: run the steady scenario first "
                        "(--scenario steady --scenario drift)")
    if seg["status"] != "no_baseline":
        return f"{s.model}/{seg['variant']} already has a baseline"
    if "steady_from" not in demo.marks:
        raise DemoError("no baseline yet and no steady traffic to freeze one from: run the steady scenario first")
    r = requests.post(f"{s.drift}/v1/baselines", timeout=30, json={
        "model": s.model, "variant": seg["variant"], "from": demo.marks["steady_from"],
        "to": demo.marks["steady_to"]})
    if r.status_code != 201:
        raise DemoError(f"the drift service refused a baseline of the steady traffic: {r.status_code} {r.text[:300]}")
    return f"froze a baseline of {s.model}/{seg['variant']} from the steady traffic ({r.json().get('records')} records)"


def drift(demo: Demo) -> list[Seen]:
    s = demo.stack
    try:
        demo.say(f"  {_baseline(demo)}")
    except DemoError as exc:
        return [Seen("prompt_tokens drifts", False, str(exc))]
    def drifted() -> dict[str, Any] | None:
        seg = _segment(s)
        return seg if seg and seg["status"] == "drift" and "prompt_tokens" in seg["drifted_features"] else None

    before = drifted()
    asks = lambda i: Ask(s.model, 50 + i % 50, 8, False)  # noqa: E731  (≤ ~350 tokens: max_model_len is 512)
    counts = demo.load.run(demo.seconds(90), clients=2, asks=asks, per_client_rps=2)
    seg = demo.wait_for(drifted, 90, every_s=3)
    last = seg or _segment(s) or {}
    earlier = (" (it did before this run: an earlier run's long prompts are in the hour-long window, so this run "
               "cannot show the change)" if before else "")
    return [Seen("long prompts answered", counts[200] > 0, _codes(counts)),
            Seen("the drift verdict names prompt_tokens", seg is not None and not before and counts[200] > 0,
                 f"{last.get('status')}: drifted {', '.join(last.get('drifted_features', [])) or 'nothing'} "
                 f"({last.get('window_records')} records in the window){earlier}")]


DRIFT = Scenario(
    "drift", "A prompt-length drift", 90,
    ("the steady traffic becomes the baseline, then two clients send prompts about 10 times longer, 4 a second",
     "Drift → Drift score vs threshold: prompt_tokens crosses its threshold; the drift report "
     "(/report on the drift service) shows the two histograms apart",
     "DriftDetected opens a ticket once the drift has held for 15 minutes"), drift)

SCENARIOS: dict[str, Scenario] = {sc.name: sc for sc in (STEADY, BURST, OUTAGE, CANARY, DRIFT)}
