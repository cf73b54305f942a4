"""What the gateway costs: added latency, throughput on one core, CPU per request and per
streamed token, and /metrics render time. Prints markdown tables; medians of several runs.

Set-up (2-core box): the proxy under test runs pinned to core 0; the mock upstream
(bench/mock_upstream.py) and the load generator (wrk, C) share core 1, so the proxy's core
is its own. "direct" is wrk against the mock. Yardsticks in the same run, in front of the
same mock: nginx as a plain reverse proxy (the floor for one proxy hop: Debian's nginx,
one process, keep-alive upstream, no buffering), LiteLLM's proxy (when
bench/.venv-litellm exists: `make bench` makes it), bench/byte_relay.py (bytes copied in
Python on uvloop, no HTTP: the floor for any Python proxy) and bench/http_relay.py
(requests and answers parsed with httptools and relayed as they came: the floor for an
HTTP-aware one, below which no feature of the gateway's can take it). "gateway
(production)" is the gateway as a fleet runs it (``production`` below: API keys, feature
records, 10 % of traces, two replicas, Redis); ratios are CPU per request against nginx's.

With ``--baseline DIR`` (a checkout of an earlier commit, e.g. ``git worktree add DIR
<commit>``), that tree's gateway runs beside this one, in the same run, and the gateway rows
get a ratio against it: a change to the request path shows its cost against what it changed.

At a constant rate (bench/open_loop.py, open loop: no coordinated omission) the same
mock's requests go through nginx, the gateway and its production configuration; the
added percentiles are each proxy's minus nginx's.

    python bench/gateway_overhead.py [--runs 3] [--seconds 4] [--baseline DIR]
        [--latency-only | --open-loop-only [--rate 1000] | --stream-only]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from contextlib import ExitStack, contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.procs import running  # noqa: E402
from tests.support import nginx as nginx_conf  # noqa: E402
from tests.support.gateway_metrics import populated_registry  # noqa: E402
from tests.support.package_tree import importable  # noqa: E402
from tests.support.redis_server import RedisServer  # noqa: E402
from tests.support.servers import metric_sum  # noqa: E402
from tests.support.sockets import free_port  # noqa: E402

GATEWAY_CPU, LOAD_CPU = "0", "1"
CHAT_BODY = '{"model":"bench-model","messages":[{"role":"user","content":"hi"}],"max_tokens":10}'
STREAM_BODY = '{"model":"bench-model","messages":[{"role":"user","content":"hi"}],"max_tokens":200,"stream":true}'
CLK_TCK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> tuple[float, float]:
    """(user, system) CPU seconds of a process: system time is the kernel's share (syscalls,
    and on loopback the receiving side's TCP work, which is charged to the sender)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[11]) / CLK_TCK, int(fields[12]) / CLK_TCK


def mock(port: int, tokens: int, interval_ms: float):
    return running("mock", [sys.executable, str(ROOT / "bench" / "mock_upstream.py"), "--port", str(port),
                            "--tokens", str(tokens), "--token-interval-ms", str(interval_ms)],
                   f"http://127.0.0.1:{port}/health", cpus=LOAD_CPU)


API_KEY = "bench-key"
LITELLM_VENV = ROOT / "bench" / ".venv-litellm"


BASELINE: Path | None = None  # --baseline: another checkout whose gateway runs beside this one


def gateway(port: int, upstream_port: int, otlp: str | None = None, sample_ratio: float = 1.0,
            production_sink: str | None = None, tree: Path | None = None, limits: Path | None = None,
            redis_url: str | None = None, more_replicas: tuple[int, ...] = (), api_keys: str | None = None):
    """This checkout's gateway, or with ``tree`` that checkout's (run from its own folder);
    ``more_replicas``: ports of more upstream replicas beside ``upstream_port``."""
    env = {"INFERWATCH_GATEWAY_UPSTREAM_URL": ",".join(f"http://127.0.0.1:{p}"
                                                       for p in (upstream_port, *more_replicas)),
           "INFERWATCH_GATEWAY_MAX_TOKENS_LIMIT": "32768"}
    if limits:
        env["INFERWATCH_GATEWAY_LIMITS_FILE"] = str(limits)
    if api_keys:
        env["INFERWATCH_GATEWAY_API_KEYS"] = api_keys
    if redis_url:
        env["INFERWATCH_GATEWAY_REDIS_URL"] = redis_url
    if otlp:
        env["INFERWATCH_GATEWAY_OTLP_ENDPOINT"] = otlp
        env["INFERWATCH_GATEWAY_TRACE_SAMPLE_RATIO"] = str(sample_ratio)
    if production_sink:
        env["INFERWATCH_GATEWAY_API_KEYS"] = API_KEY
        env["INFERWATCH_GATEWAY_DRIFT_URL"] = production_sink
    if tree is None:
        argv = [sys.executable, "-m", "inferwatch", "gateway", "--port", str(port)]
    else:
        root = importable(tree)
        argv = [sys.executable, "-c", f"import os, runpy, sys; os.chdir({str(tree)!r}); sys.path.insert(0, "
                f"{str(root)!r}); runpy.run_module('inferwatch', run_name='__main__', alter_sys=True)",
                "gateway", "--port", str(port)]
    return running("gateway", argv, f"http://127.0.0.1:{port}/health", cpus=GATEWAY_CPU, env=env)


# Limits a busy gateway would have, each enforced on every request: per key and per model,
# requests and tokens per minute and requests in flight, high enough that none refuses here.
# With Redis, the request limit's leases come back a few times a second at this rate.
SHARED_LIMITS = """
default_key: {requests_per_minute: 600000, tokens_per_minute: 600000000, max_in_flight: 10000}
default_model: {requests_per_minute: 600000, tokens_per_minute: 600000000, max_in_flight: 10000}
"""


# 1,000 keys over 50 tenants, each with a token budget no request here reaches: the key's
# lookup, its tenant, the budget's check and charge, and the per-tenant series per request.
TENANT_KEYS = [API_KEY, *(f"bench-key-{i}" for i in range(1, 1000))]


def tenant_limits() -> str:
    from inferwatch.serving.admission import key_id

    lines = ["tenants:"]
    for t in range(50):
        ids = ", ".join(key_id(k) for k in TENANT_KEYS[t * 20:(t + 1) * 20])
        lines.append(f"  tenant-{t:02d}: {{keys: [{ids}], budget: {{tokens: 1.0e+15, period: month}}}}")
    return "\n".join(lines) + "\n"


@contextmanager
def redis_server():
    """Debian's redis-server on the load's core, as the mock upstream (another host's work)."""
    server = RedisServer(Path(tempfile.mkdtemp(prefix="inferwatch-bench-redis-"))).start()
    try:
        os.sched_setaffinity(server.proc.pid, {int(LOAD_CPU)})
        yield server
    finally:
        server.stop()


def production(port: int, upstream_ports: tuple[int, int], sink: OTLPSink, redis_url: str | None,
               tree: Path | None = None):
    """The gateway as a fleet runs it: API keys, feature records to a drift sink, 10 % of
    traces, the balancer over two replicas, state shared in Redis (when redis-server is
    installed), output-quality judging (always on)."""
    return gateway(port, upstream_ports[0], otlp=sink.endpoint, sample_ratio=0.1, production_sink=sink.base,
                   tree=tree, redis_url=redis_url, more_replicas=upstream_ports[1:])


def baseline_gateway(port: int, upstream_port: int, **kwargs):
    return gateway(port, upstream_port, tree=BASELINE, **kwargs)


def nginx(port: int, upstream_port: int):
    """One nginx process (master_process off), so its pid is the one doing the work."""
    workdir = Path(tempfile.mkdtemp(prefix="inferwatch-bench-nginx-"))
    return running("nginx", nginx_conf.configure(workdir, port, [upstream_port], health_path="/health", keepalive=256),
                   f"http://127.0.0.1:{port}/health", cpus=GATEWAY_CPU)


def byte_relay(port: int, upstream_port: int):
    """bench/byte_relay.py: the cost of relaying bytes in Python on uvloop, with no HTTP."""
    return running("byte-relay", [sys.executable, str(ROOT / "bench" / "byte_relay.py"), "--port", str(port),
                                  "--upstream-port", str(upstream_port)],
                   f"http://127.0.0.1:{port}/health", cpus=GATEWAY_CPU)


def http_relay(port: int, upstream_port: int):
    """bench/http_relay.py: an HTTP-aware Python proxy with no features, the gateway's floor."""
    return running("http-relay", [sys.executable, str(ROOT / "bench" / "http_relay.py"), "--port", str(port),
                                  "--upstream-port", str(upstream_port)],
                   f"http://127.0.0.1:{port}/health", cpus=GATEWAY_CPU)


def litellm(port: int, upstream_port: int):
    workdir = Path(tempfile.mkdtemp(prefix="inferwatch-bench-litellm-"))
    conf = workdir / "config.yaml"
    conf.write_text(f"model_list:\n  - model_name: bench-model\n    litellm_params:\n      model: openai/bench-model\n"
                    f"      api_base: http://127.0.0.1:{upstream_port}/v1\n      api_key: unused\n")
    env = {"LITELLM_TELEMETRY": "False", "LITELLM_LOG": "ERROR", "DISABLE_SCHEMA_UPDATE": "true"}
    return running("litellm", [str(LITELLM_VENV / "bin" / "litellm"), "--config", str(conf), "--port", str(port),
                               "--num_workers", "1"],
                   f"http://127.0.0.1:{port}/health/liveliness", cpus=GATEWAY_CPU, env=env)


class OTLPSink:
    """Accepts OTLP/HTTP exports and drops them: tracing cost without a collector's. It keeps
    connections alive, as a collector and the drift service do; a sink that closed each one
    would charge the gateway a TCP connect per exported batch."""

    def __init__(self) -> None:
        class H(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self):
                self.rfile.read(int(self.headers.get("content-length", 0)))
                self.send_response(200)
                self.send_header("content-length", "0")
                self.end_headers()

            def log_message(self, *a):
                return None

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), H)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.base = f"http://127.0.0.1:{self.server.server_address[1]}"  # also takes drift ingest batches
        self.endpoint = f"{self.base}/v1/traces"


UNITS = {"us": 1e-6, "ms": 1e-3, "s": 1.0}


def wrk(url: str, body: str, connections: int, seconds: float, auth: bool = False, cpus: str | None = LOAD_CPU,
        threads: int = 1) -> dict:
    """wrk's percentiles, rate and request count; pinned to ``cpus`` (None: any core)."""
    with tempfile.NamedTemporaryFile("w", suffix=".lua", delete=False) as f:
        f.write(f'wrk.method = "POST"\nwrk.body = \'{body}\'\nwrk.headers["Content-Type"] = "application/json"\n')
        if auth:
            f.write(f'wrk.headers["Authorization"] = "Bearer {API_KEY}"\n')
        script = f.name
    pin = ["taskset", "-c", cpus] if cpus else []
    out = subprocess.run([*pin, "wrk", f"-t{threads}", f"-c{connections}", f"-d{int(seconds)}s", "--latency",
                          "-s", script, url], capture_output=True, text=True, check=True).stdout
    os.unlink(script)
    pct = {m[0]: float(m[1]) * UNITS[m[2]] for m in re.findall(r"^\s+(\d+)%\s+([\d.]+)(us|ms|s)\s*$", out, re.M)}
    requests = int(re.search(r"(\d+) requests in", out).group(1))
    errors = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    if errors:
        raise RuntimeError(f"wrk saw {errors.group(1)} failed responses:\n{out}")
    return {"p50": pct["50"], "p99": pct["99"], "rps": float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1)),
            "requests": requests}


def measure(url: str, body: str, conns: int, seconds: float, pid: int | None, auth: bool = False) -> dict:
    c0 = cpu_seconds(pid) if pid else (0.0, 0.0)
    r = wrk(url, body, conns, seconds, auth)
    if pid:
        c1 = cpu_seconds(pid)
        r["user_per_req"] = (c1[0] - c0[0]) / r["requests"]
        r["sys_per_req"] = (c1[1] - c0[1]) / r["requests"]
        r["cpu_per_req"] = r["user_per_req"] + r["sys_per_req"]
    return r


def med(runs: list[dict], key: str) -> float:
    return statistics.median(r[key] for r in runs)


def latency_table(runs: int, seconds: float) -> list[str]:
    ports = {name: free_port() for name in ("mock", "mock-2", "mock-3", "nginx", "relay", "http-relay", "gateway",
                                            "replicas",
                                            "production",
                                            "traced", "litellm", "baseline", "baseline-production", "limits",
                                            "shared", "keyed", "tenants")}
    sink = OTLPSink()
    rows = ["| concurrency | path | p50 | p99 | added p50 | added p99 | req/s | proxy CPU/req (user + sys) "
            "| CPU/req vs nginx |", "|---|---|---|---|---|---|---|---|---|"]
    with ExitStack() as stack:
        for name in ("mock", "mock-2", "mock-3"):
            stack.enter_context(mock(ports[name], 100, 2.0))
        redis = stack.enter_context(redis_server()) if shutil.which("redis-server") else None
        redis_url = redis.url if redis else None
        two = (ports["mock"], ports["mock-2"])
        targets = [("direct", ports["mock"], None, False),
                   ("nginx", ports["nginx"], stack.enter_context(nginx(ports["nginx"], ports["mock"])).pid, False),
                   # bytes relayed in Python on uvloop, no HTTP: any Python proxy's floor
                   ("python byte relay", ports["relay"],
                    stack.enter_context(byte_relay(ports["relay"], ports["mock"])).pid, False),
                   # requests and answers parsed with httptools, nothing else: any Python HTTP proxy's floor
                   ("python HTTP relay", ports["http-relay"],
                    stack.enter_context(http_relay(ports["http-relay"], ports["mock"])).pid, False),
                   ("gateway", ports["gateway"],
                    stack.enter_context(gateway(ports["gateway"], ports["mock"])).pid, False),
                   # the same upstream as three replicas: what least outstanding and its
                   # bookkeeping cost a request
                   ("gateway over 3 replicas", ports["replicas"],
                    stack.enter_context(gateway(ports["replicas"], ports["mock"],
                                                more_replicas=(ports["mock-2"], ports["mock-3"]))).pid, False),
                   ("gateway (production)", ports["production"],
                    stack.enter_context(production(ports["production"], two, sink, redis_url)).pid, True),
                   ("gateway + tracing (all)", ports["traced"],
                    stack.enter_context(gateway(ports["traced"], ports["mock"], otlp=sink.endpoint)).pid, False),
                   ("gateway + API key", ports["keyed"],
                    stack.enter_context(gateway(ports["keyed"], ports["mock"], api_keys=API_KEY)).pid, True)]
        tenants = Path(tempfile.mkdtemp(prefix="inferwatch-bench-tenants-")) / "limits.yaml"
        tenants.write_text(tenant_limits())
        targets.append(("gateway + 50 tenants, 1,000 keys, budgets", ports["tenants"],
                        stack.enter_context(gateway(ports["tenants"], ports["mock"], limits=tenants,
                                                    api_keys=",".join(TENANT_KEYS))).pid, True))
        if redis is not None:
            limits = Path(tempfile.mkdtemp(prefix="inferwatch-bench-limits-")) / "limits.yaml"
            limits.write_text(SHARED_LIMITS)
            targets += [("gateway + limits, in process", ports["limits"],
                         stack.enter_context(gateway(ports["limits"], ports["mock"], limits=limits)).pid, False),
                        ("gateway + limits, shared in Redis", ports["shared"],
                         stack.enter_context(gateway(ports["shared"], ports["mock"], limits=limits,
                                                     redis_url=redis_url)).pid, False)]
        if BASELINE is not None:
            targets += [("gateway (baseline)", ports["baseline"],
                         stack.enter_context(baseline_gateway(ports["baseline"], ports["mock"])).pid, False),
                        ("gateway (production, baseline)", ports["baseline-production"],
                         stack.enter_context(production(ports["baseline-production"], two, sink, redis_url,
                                                        tree=BASELINE)).pid, True)]
        if (LITELLM_VENV / "bin" / "litellm").exists():
            targets.append(("LiteLLM proxy", ports["litellm"],
                            stack.enter_context(litellm(ports["litellm"], ports["mock"])).pid, False))
        for _, port, _pid, auth in targets:  # warm up connections, caches, lazy imports
            wrk(f"http://127.0.0.1:{port}/v1/chat/completions", CHAT_BODY, 4, 1, auth)
        for conns in (1, 32):
            results = {name: [] for name, *_ in targets}
            for _ in range(runs):  # interleaved, so drift in machine load hits every path alike
                for name, port, pid, auth in targets:
                    results[name].append(measure(f"http://127.0.0.1:{port}/v1/chat/completions", CHAT_BODY, conns,
                                                 seconds, pid, auth))
            d50, d99 = med(results["direct"], "p50"), med(results["direct"], "p99")
            floor = med(results["nginx"], "cpu_per_req")
            for name, _, pid, _ in targets:
                r = results[name]
                p50, p99 = med(r, "p50"), med(r, "p99")
                added = (f"{(p50 - d50) * 1e3:.3f} ms", f"{(p99 - d99) * 1e3:.3f} ms") if pid else ("—", "—")
                cpu = (f"{med(r, 'cpu_per_req') * 1e6:.0f} µs ({med(r, 'user_per_req') * 1e6:.0f} + "
                       f"{med(r, 'sys_per_req') * 1e6:.0f})" if pid else "—")
                ratio = f"{med(r, 'cpu_per_req') / floor:.1f}×" if pid else "—"
                rows.append(f"| {conns} | {name} | {p50 * 1e3:.3f} ms | {p99 * 1e3:.3f} ms | {added[0]} | "
                            f"{added[1]} | {med(r, 'rps'):,.0f} | {cpu} | {ratio} |")
            change = med(results["gateway over 3 replicas"], "cpu_per_req") / med(results["gateway"], "cpu_per_req") - 1
            rows.append(f"| {conns} | 3 replicas vs 1 (least outstanding) | | | | | | {change:+.1%} CPU/req | |")
            change = (med(results["gateway + 50 tenants, 1,000 keys, budgets"], "cpu_per_req")
                      / med(results["gateway + API key"], "cpu_per_req") - 1)
            rows.append(f"| {conns} | tenants vs one key (tenant series, budget) | | | | | | {change:+.1%} CPU/req | |")
            if "gateway + limits, shared in Redis" in results:
                text = urllib.request.urlopen(f"http://127.0.0.1:{ports['shared']}/metrics").read().decode()
                if metric_sum(text, "inferwatch_gateway_shared_state_up") != 1 \
                        or metric_sum(text, "inferwatch_gateway_shared_state_errors_total") != 0:
                    raise RuntimeError("the Redis row ran without Redis (shared_state_up 0 or errors counted)")
                change = (med(results["gateway + limits, shared in Redis"], "cpu_per_req")
                          / med(results["gateway + limits, in process"], "cpu_per_req") - 1)
                rows.append(f"| {conns} | Redis vs in process (limits, feedback memory) | | | | | | "
                            f"{change:+.1%} CPU/req | |")
            if BASELINE is not None:
                for name, base in (("gateway", "gateway (baseline)"),
                                   ("gateway (production)", "gateway (production, baseline)")):
                    change = med(results[name], "cpu_per_req") / med(results[base], "cpu_per_req") - 1
                    rows.append(f"| {conns} | {name} vs baseline | | | | | | {change:+.1%} CPU/req | |")
    return rows


def open_loop(url: str, body: str, rate: float, seconds: float, auth: bool = False) -> dict:
    """bench/open_loop.py on the load's core: a constant rate, so a stall delays every request
    due during it (wrk, closed-loop, would wait it out and count one slow request)."""
    argv = ["taskset", "-c", LOAD_CPU, sys.executable, str(ROOT / "bench" / "open_loop.py"), "--url", url,
            "--body", body, "--rate", str(rate), "--seconds", str(seconds)]
    if auth:
        argv += ["--header", f"Authorization: Bearer {API_KEY}"]
    result = json.loads(subprocess.run(argv, capture_output=True, text=True, check=True).stdout)
    if result["errors"]:
        raise RuntimeError(f"open-loop load saw {result['errors']} failed requests at {url}")
    return result


def open_loop_table(runs: int, seconds: float, rate: float = 1000.0) -> list[str]:
    """Latency at a constant 1,000 requests/s: nginx, the gateway and its production
    configuration in front of the same mock, interleaved; added = the proxy's minus nginx's."""
    ports = {name: free_port() for name in ("mock", "mock-2", "nginx", "gateway", "production", "baseline")}
    sink = OTLPSink()
    rows = ["| path | p50 | p99 | p99.9 | max | added p50 | added p99 | added p99.9 | generator lag p99 |",
            "|---|---|---|---|---|---|---|---|---|"]
    with ExitStack() as stack:
        for name in ("mock", "mock-2"):
            stack.enter_context(mock(ports[name], 100, 2.0))
        redis_url = stack.enter_context(redis_server()).url if shutil.which("redis-server") else None
        two = (ports["mock"], ports["mock-2"])
        stack.enter_context(nginx(ports["nginx"], ports["mock"]))
        stack.enter_context(gateway(ports["gateway"], ports["mock"]))
        stack.enter_context(production(ports["production"], two, sink, redis_url))
        targets = [("nginx", "nginx", False), ("gateway", "gateway", False),
                   ("gateway (production)", "production", True)]
        if BASELINE is not None:
            stack.enter_context(production(ports["baseline"], two, sink, redis_url, tree=BASELINE))
            targets.append(("gateway (production, baseline)", "baseline", True))
        for _, port, auth in targets:  # warm up
            wrk(f"http://127.0.0.1:{ports[port]}/v1/chat/completions", CHAT_BODY, 4, 1, auth)
        results: dict[str, list[dict]] = {name: [] for name, *_ in targets}
        for _ in range(runs):
            for name, port, auth in targets:
                results[name].append(open_loop(f"http://127.0.0.1:{ports[port]}/v1/chat/completions", CHAT_BODY,
                                               rate, seconds, auth))
        floor = {key: med(results["nginx"], key) for key in ("p50", "p99", "p999")}
        for name, *_ in targets:
            r = results[name]
            cells = [f"{med(r, key) * 1e3:.3f} ms" for key in ("p50", "p99", "p999", "max")]
            added = ["—"] * 3 if name == "nginx" else [f"{(med(r, key) - floor[key]) * 1e3:.3f} ms"
                                                        for key in ("p50", "p99", "p999")]
            rows.append(f"| {name} | {' | '.join(cells)} | {' | '.join(added)} | "
                        f"{med(r, 'send_lag_p99') * 1e3:.3f} ms |")
    return rows


def stream_table(runs: int, seconds: float, tokens: int = 200) -> list[str]:
    """Proxy CPU per relayed chunk (one token per chunk, flushed one by one): streams of
    ``tokens`` tokens minus 1-token streams (same request count basis), so per-request costs
    (routing, spans, metrics) cancel out. nginx relays the same streams as the floor."""
    long_mock, short_mock = free_port(), free_port()
    rows = ["| proxy | streams | CPU/stream | net CPU/chunk | net user | net sys | vs nginx | chunks/s relayed |",
            "|---|---|---|---|---|---|---|---|"]
    with ExitStack() as stack:
        stack.enter_context(mock(long_mock, tokens, 2.0))
        stack.enter_context(mock(short_mock, 1, 0.0))
        proxies = {}
        factories = [("nginx", nginx), ("python byte relay", byte_relay), ("gateway", gateway)]
        if BASELINE is not None:
            factories.append(("gateway (baseline)", baseline_gateway))
        for name, factory in factories:
            pl, ps = free_port(), free_port()
            proxies[name] = {tokens: (pl, stack.enter_context(factory(pl, long_mock)).pid),
                             1: (ps, stack.enter_context(factory(ps, short_mock)).pid)}
        per_stream = {name: {tokens: [], 1: []} for name in proxies}
        user = {name: {tokens: [], 1: []} for name in proxies}
        rps = {name: [] for name in proxies}
        for _ in range(runs):
            for name, by_n in proxies.items():
                for n, (port, pid) in by_n.items():
                    url = f"http://127.0.0.1:{port}"
                    before = _relayed(url) if name.startswith("gateway") else 0
                    r = measure(f"{url}/v1/chat/completions", STREAM_BODY, 32, seconds, pid)
                    if name.startswith("gateway") and _relayed(url) - before < r["requests"] * n * 0.99:
                        raise RuntimeError(f"gateway relayed {_relayed(url) - before} tokens for {r['requests']} x {n}")
                    per_stream[name][n].append(r["cpu_per_req"])
                    user[name][n].append(r["user_per_req"])
                    if n == tokens:
                        rps[name].append(r["requests"] * n / seconds)
        net = {name: (statistics.median(per_stream[name][tokens]) - statistics.median(per_stream[name][1]))
               / (tokens - 1) for name in proxies}
        for name in proxies:
            net_user = (statistics.median(user[name][tokens]) - statistics.median(user[name][1])) / (tokens - 1)
            rows.append(f"| {name} | 32 × {tokens} tokens | {statistics.median(per_stream[name][tokens]) * 1e6:.0f} µs | "
                        f"{net[name] * 1e6:.2f} µs | {net_user * 1e6:.2f} µs | {(net[name] - net_user) * 1e6:.2f} µs | "
                        f"{net[name] / net['nginx']:.2f}× | {statistics.median(rps[name]):,.0f} |")
        if BASELINE is not None:
            rows.append(f"| gateway vs baseline | | | {net['gateway'] / net['gateway (baseline)'] - 1:+.1%} | | | | |")
    return rows


def _relayed(url: str) -> float:
    return metric_sum(urllib.request.urlopen(f"{url}/metrics").read().decode(), "inferwatch_gateway_output_tokens_total")


def render_table(repeats: int = 50) -> list[str]:
    """prometheus_client's encoder (what choose_encoder picks) against serving.exposition.render,
    alternated in the same run on the same registry; ratio: prometheus_client's median over ours."""
    from prometheus_client.exposition import choose_encoder

    from inferwatch.serving.exposition import render

    rows = ["| label set | format | series | bytes | prometheus_client median | ours median | ours p99 | ratio |",
            "|---|---|---|---|---|---|---|---|"]
    for models, variants, tenants in ((1, 1, 0), (1, 2, 0), (4, 2, 0), (4, 2, 50)):
        registry = populated_registry(models, variants, tenants)
        for name, accept in (("Prometheus text", ""), ("OpenMetrics", "application/openmetrics-text")):
            encoder = choose_encoder(accept)[0]
            theirs, ours = [], []
            for _ in range(repeats):
                t0 = time.perf_counter()
                out = encoder(registry)
                t1 = time.perf_counter()
                body = render(registry, accept)[0]
                ours.append(time.perf_counter() - t1)
                theirs.append(t1 - t0)
            assert body == out, "serving.exposition differs from prometheus_client"
            ours.sort()
            series = sum(1 for line in out.splitlines() if line and not line.startswith(b"#"))
            label = f"{models} model x {variants} variant" + (f" x {tenants} tenants (+2)" if tenants else "")
            rows.append(f"| {label} | {name} | {series:,} | {len(out):,} | "
                        f"{statistics.median(theirs) * 1e3:.2f} ms | {statistics.median(ours) * 1e3:.2f} ms | "
                        f"{ours[int(len(ours) * 0.99) - 1] * 1e3:.2f} ms | "
                        f"{statistics.median(theirs) / statistics.median(ours):.1f}x |")
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--seconds", type=int, default=4)
    parser.add_argument("--baseline", type=Path, help="a checkout of an earlier commit whose gateway runs beside")
    parser.add_argument("--latency-only", action="store_true", help="only the non-streaming table")
    parser.add_argument("--stream-only", action="store_true", help="only the streaming table")
    parser.add_argument("--open-loop-only", action="store_true", help="only the constant-rate table")
    parser.add_argument("--rate", type=float, default=1000.0, help="the constant-rate table's requests/s")
    args = parser.parse_args()
    global BASELINE
    if args.baseline is not None:
        BASELINE = args.baseline.resolve()
    if not shutil.which("wrk"):
        sys.exit("wrk is needed: apt-get install wrk (make bench does this)")
    if os.cpu_count() < 2:
        sys.exit("needs 2 cores: one for the gateway, one for wrk and the mock upstream")
    os.sched_setaffinity(0, {int(LOAD_CPU)})  # this driver (and its OTLP sink) stays off the gateway's core
    if not (args.stream_only or args.open_loop_only):
        print(f"## Non-streaming chat completions (median of {args.runs} runs x {args.seconds:g}s)\n")
        print("\n".join(latency_table(args.runs, args.seconds)))
    if not (args.stream_only or args.latency_only):
        print(f"\n## Non-streaming at a constant {args.rate:,.0f} requests/s, open loop "
              f"(median of {args.runs} runs x {args.seconds:g}s)\n")
        print("\n".join(open_loop_table(args.runs, args.seconds, args.rate)))
    if args.latency_only or args.open_loop_only:
        return
    print(f"\n## Streaming: CPU per relayed chunk (median of {args.runs} runs)\n")
    print("\n".join(stream_table(args.runs, args.seconds)))
    if not args.stream_only:
        print("\n## /metrics render\n")
        print("\n".join(render_table()))


if __name__ == "__main__":
    main()
