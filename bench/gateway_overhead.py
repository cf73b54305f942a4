"""What the gateway costs: added latency, throughput on one core, CPU per streamed token,
and /metrics render time. Prints markdown tables; medians of several runs.

Set-up (2-core box): the gateway runs pinned to core 0; the mock upstream
(bench/mock_upstream.py) and the load generator (wrk, C) share core 1, so the gateway's
core is its own. "direct" is wrk against the mock; "gateway" is wrk against the gateway in
front of the same mock, in the same run.

    python bench/gateway_overhead.py [--runs 3] [--seconds 4]
"""

from __future__ import annotations

import argparse
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
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.procs import running  # noqa: E402
from tests.support.servers import free_port, metric_sum  # noqa: E402

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


def gateway(port: int, upstream_port: int, otlp: str | None = None):
    env = {"INFERWATCH_GATEWAY_UPSTREAM_URL": f"http://127.0.0.1:{upstream_port}",
           "INFERWATCH_GATEWAY_MAX_TOKENS_LIMIT": "32768"}
    if otlp:
        env["INFERWATCH_GATEWAY_OTLP_ENDPOINT"] = otlp
    return running("gateway", [sys.executable, "-m", "inferwatch", "gateway", "--port", str(port)],
                   f"http://127.0.0.1:{port}/health", cpus=GATEWAY_CPU, env=env)


class OTLPSink:
    """Accepts OTLP/HTTP exports and drops them: tracing cost without a collector's."""

    def __init__(self) -> None:
        class H(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802
                self.rfile.read(int(self.headers.get("content-length", 0)))
                self.send_response(200)
                self.send_header("content-length", "0")
                self.end_headers()

            def log_message(self, *a):
                return None

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), H)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.endpoint = f"http://127.0.0.1:{self.server.server_address[1]}/v1/traces"


UNITS = {"us": 1e-6, "ms": 1e-3, "s": 1.0}


def wrk(url: str, body: str, connections: int, seconds: float) -> dict:
    with tempfile.NamedTemporaryFile("w", suffix=".lua", delete=False) as f:
        f.write(f'wrk.method = "POST"\nwrk.body = \'{body}\'\nwrk.headers["Content-Type"] = "application/json"\n')
        script = f.name
    out = subprocess.run(["taskset", "-c", LOAD_CPU, "wrk", "-t1", f"-c{connections}", f"-d{int(seconds)}s", "--latency",
                          "-s", script, url], capture_output=True, text=True, check=True).stdout
    os.unlink(script)
    pct = {m[0]: float(m[1]) * UNITS[m[2]] for m in re.findall(r"^\s+(\d+)%\s+([\d.]+)(us|ms|s)\s*$", out, re.M)}
    requests = int(re.search(r"(\d+) requests in", out).group(1))
    errors = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    if errors:
        raise RuntimeError(f"wrk saw {errors.group(1)} failed responses:\n{out}")
    return {"p50": pct["50"], "p99": pct["99"], "rps": float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1)),
            "requests": requests}


def measure(url: str, body: str, conns: int, seconds: float, pid: int | None) -> dict:
    c0 = cpu_seconds(pid) if pid else (0.0, 0.0)
    r = wrk(url, body, conns, seconds)
    if pid:
        c1 = cpu_seconds(pid)
        r["user_per_req"] = (c1[0] - c0[0]) / r["requests"]
        r["sys_per_req"] = (c1[1] - c0[1]) / r["requests"]
        r["cpu_per_req"] = r["user_per_req"] + r["sys_per_req"]
    return r


def med(runs: list[dict], key: str) -> float:
    return statistics.median(r[key] for r in runs)


def latency_table(runs: int, seconds: float) -> list[str]:
    mock_port, gw_port, gw_traced_port = free_port(), free_port(), free_port()
    sink = OTLPSink()
    rows = ["| concurrency | path | p50 | p99 | added p50 | added p99 | req/s | gateway CPU/req (user + sys) |",
            "|---|---|---|---|---|---|---|---|"]
    with mock(mock_port, 100, 2.0), gateway(gw_port, mock_port) as gw, \
            gateway(gw_traced_port, mock_port, otlp=sink.endpoint) as gwt:
        targets = [("direct", f"http://127.0.0.1:{mock_port}", None),
                   ("gateway", f"http://127.0.0.1:{gw_port}", gw.pid),
                   ("gateway + tracing", f"http://127.0.0.1:{gw_traced_port}", gwt.pid)]
        for _, base, _pid in targets:  # warm up connections, caches, the JIT-free-but-lazy imports
            wrk(f"{base}/v1/chat/completions", CHAT_BODY, 4, 1)
        for conns in (1, 32):
            results = {name: [] for name, _, _ in targets}
            for _ in range(runs):  # interleaved, so drift in machine load hits every path alike
                for name, base, pid in targets:
                    results[name].append(measure(f"{base}/v1/chat/completions", CHAT_BODY, conns, seconds, pid))
            d50, d99 = med(results["direct"], "p50"), med(results["direct"], "p99")
            for name, _, pid in targets:
                r = results[name]
                p50, p99 = med(r, "p50"), med(r, "p99")
                added = (f"{(p50 - d50) * 1e3:.3f} ms", f"{(p99 - d99) * 1e3:.3f} ms") if pid else ("—", "—")
                cpu = (f"{med(r, 'cpu_per_req') * 1e6:.0f} µs ({med(r, 'user_per_req') * 1e6:.0f} + "
                       f"{med(r, 'sys_per_req') * 1e6:.0f})" if pid else "—")
                rows.append(f"| {conns} | {name} | {p50 * 1e3:.3f} ms | {p99 * 1e3:.3f} ms | {added[0]} | "
                            f"{added[1]} | {med(r, 'rps'):,.0f} | {cpu} |")
    return rows


def stream_table(runs: int, seconds: float, tokens: int = 200) -> list[str]:
    """Gateway CPU per relayed token: streams of ``tokens`` tokens minus 1-token streams
    (same request count basis), so per-request costs (routing, spans, metrics) cancel out."""
    long_mock, short_mock, gw_long, gw_short = free_port(), free_port(), free_port(), free_port()
    rows = ["| streams | tokens/stream | gateway CPU/stream | CPU/token (raw) | net CPU/token | net user | net sys "
            "| tokens/s relayed |", "|---|---|---|---|---|---|---|---|"]
    with mock(long_mock, tokens, 2.0), mock(short_mock, 1, 0.0), gateway(gw_long, long_mock) as gl, \
            gateway(gw_short, short_mock) as gs:
        per_stream: dict[int, list[float]] = {tokens: [], 1: []}
        user: dict[int, list[float]] = {tokens: [], 1: []}
        relayed: dict[int, list[float]] = {tokens: [], 1: []}
        for _ in range(runs):
            for n, port, proc in ((tokens, gw_long, gl), (1, gw_short, gs)):
                url = f"http://127.0.0.1:{port}"
                before = metric_sum(urllib.request.urlopen(f"{url}/metrics").read().decode(),
                                    "inferwatch_gateway_output_tokens_total")
                r = measure(f"{url}/v1/chat/completions", STREAM_BODY, 32, seconds, proc.pid)
                after = metric_sum(urllib.request.urlopen(f"{url}/metrics").read().decode(),
                                   "inferwatch_gateway_output_tokens_total")
                if after - before < r["requests"] * n * 0.99:
                    raise RuntimeError(f"gateway relayed {after - before} tokens for {r['requests']} x {n}")
                per_stream[n].append(r["cpu_per_req"])
                user[n].append(r["user_per_req"])
                relayed[n].append((after - before) / seconds)
        long_cpu, short_cpu = statistics.median(per_stream[tokens]), statistics.median(per_stream[1])
        net = (long_cpu - short_cpu) / (tokens - 1)
        net_user = (statistics.median(user[tokens]) - statistics.median(user[1])) / (tokens - 1)
        rows.append(f"| 32 | {tokens} | {long_cpu * 1e6:.0f} µs | {long_cpu / tokens * 1e6:.2f} µs | "
                    f"{net * 1e6:.2f} µs | {net_user * 1e6:.2f} µs | {(net - net_user) * 1e6:.2f} µs | "
                    f"{statistics.median(relayed[tokens]):,.0f} |")
        rows.append(f"| 32 | 1 | {short_cpu * 1e6:.0f} µs | — | — | — | — | {statistics.median(relayed[1]):,.0f} |")
    return rows


def populated_registry(models: int, variants: int):
    """Metrics as a busy gateway has them: every route and status class seen per model/variant."""
    from prometheus_client import CollectorRegistry

    from serving.metrics import create_metrics

    registry = CollectorRegistry()
    m = create_metrics(registry)
    for model in (f"model-{i}" for i in range(models)):
        for variant in (f"v{i}" for i in range(variants)):
            for route in ("/v1/chat/completions", "/v1/completions"):
                tok = (model, variant, route)
                for sc in ("2xx", "4xx", "5xx"):
                    m.requests.labels(*tok, sc).inc(100)
                    for i in range(50):
                        m.request_duration.labels(*tok, sc).observe(0.01 * i, {"trace_id": f"{i:032x}"})
                for i in range(200):
                    m.time_to_first_token.labels(*tok).observe(0.005 * i, {"trace_id": f"{i:032x}"})
                    m.inter_token_latency.labels(*tok).observe(0.001 * i)
                    m.time_per_output_token.labels(*tok).observe(0.001 * i)
                    m.prompt_tokens_per_request.labels(*tok).observe(i * 10)
                    m.completion_tokens_per_request.labels(*tok).observe(i * 3)
                m.input_tokens.labels(*tok).inc(1e6)
                m.output_tokens.labels(*tok).inc(1e6)
            m.in_flight.labels(model, variant).set(3)
            for reason in ("connect", "timeout", "stream_interrupted"):
                m.upstream_errors.labels(model, variant, reason).inc()
    return registry


def render_table(repeats: int = 50) -> list[str]:
    from prometheus_client import generate_latest
    from prometheus_client.openmetrics.exposition import generate_latest as generate_openmetrics

    rows = ["| label set | format | series | bytes | median | p99 |", "|---|---|---|---|---|---|"]
    for models, variants in ((1, 1), (1, 2), (4, 2)):
        registry = populated_registry(models, variants)
        for name, render in (("Prometheus text", generate_latest), ("OpenMetrics", generate_openmetrics)):
            times = []
            for _ in range(repeats):
                t0 = time.perf_counter()
                out = render(registry)
                times.append(time.perf_counter() - t0)
            times.sort()
            series = sum(1 for line in out.splitlines() if line and not line.startswith(b"#"))
            rows.append(f"| {models} model x {variants} variant | {name} | {series:,} | {len(out):,} | "
                        f"{statistics.median(times) * 1e3:.2f} ms | {times[int(len(times) * 0.99) - 1] * 1e3:.2f} ms |")
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--seconds", type=int, default=4)
    args = parser.parse_args()
    if not shutil.which("wrk"):
        sys.exit("wrk is needed: apt-get install wrk (make bench does this)")
    if os.cpu_count() < 2:
        sys.exit("needs 2 cores: one for the gateway, one for wrk and the mock upstream")
    os.sched_setaffinity(0, {int(LOAD_CPU)})  # this driver (and its OTLP sink) stays off the gateway's core
    print(f"## Non-streaming chat completions (median of {args.runs} runs x {args.seconds:g}s)\n")
    print("\n".join(latency_table(args.runs, args.seconds)))
    print(f"\n## Streaming: gateway CPU per relayed token (median of {args.runs} runs)\n")
    print("\n".join(stream_table(args.runs, args.seconds)))
    print("\n## /metrics render\n")
    print("\n".join(render_table()))


if __name__ == "__main__":
    main()
