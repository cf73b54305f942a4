"""Requests/s with 1, 2, ... gateway workers (``--workers N``) against nginx with as many
worker processes, in the same run: does a pod's second core serve a second core's worth?

Set-up: every process may use every core (a pod, not the pinned proxy-on-its-own-core
measurement of bench/gateway_overhead.py). The upstream is nginx answering from memory (the
mock's model list and completion), so the upstream's cost is as small as it can be; wrk
(2 threads, 64 connections, keep-alive) shares the cores. On a machine whose cores are all
busy with the load generator and the upstream too, N workers cannot reach N×: the table
says how far they get and what nginx gets on the same cores. The gateway runs with Redis
(workers above 1 need it) and, in the production rows, as gateway_overhead.py's
``production`` (API keys, feature records, 10 % of traces, two upstreams, Redis).

    python bench/gateway_workers.py [--runs 3] [--seconds 4] [--workers 1,2]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
from contextlib import ExitStack
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.gateway_overhead import API_KEY, CHAT_BODY, OTLPSink, redis_server, wrk  # noqa: E402
from bench.mock_upstream import COMPLETION, MODELS  # noqa: E402
from bench.procs import running  # noqa: E402
from tests.support import nginx as nginx_conf  # noqa: E402
from tests.support.sockets import free_port  # noqa: E402

CONNECTIONS = 64

STATIC = """
master_process {master}; daemon off; worker_processes {workers};
error_log {dir}/error.log warn; pid {dir}/nginx.pid;
events {{ worker_connections 4096; }}
http {{
  access_log off;
  client_body_temp_path {dir}/body; proxy_temp_path {dir}/proxy; fastcgi_temp_path {dir}/fcgi;
  uwsgi_temp_path {dir}/uwsgi; scgi_temp_path {dir}/scgi;
  default_type application/json;
  server {{
    listen 127.0.0.1:{port} reuseport;
    {locations}
  }}
}}
"""


def _nginx(port: int, workers: int, locations: str):
    workdir = Path(tempfile.mkdtemp(prefix="inferwatch-bench-nginx-"))
    (workdir / "nginx.conf").write_text(STATIC.format(master="on" if workers > 1 else "off", workers=workers,
                                                      dir=workdir, port=port, locations=locations))
    argv = [nginx_conf.executable(), "-e", str(workdir / "error.log"), "-c", str(workdir / "nginx.conf"),
            "-p", str(workdir)]
    return running("nginx", argv, f"http://127.0.0.1:{port}/health")


def static_upstream(port: int):
    """One nginx process answering vLLM's routes the mock answers, from memory."""
    def answer(body: bytes) -> str:
        return "return 200 '" + body.decode().replace("'", "\\'") + "';"
    return _nginx(port, 1, f"location = /health {{ return 200 ''; }} location = /v1/models {{ {answer(MODELS)} }} "
                           f"location / {{ {answer(COMPLETION)} }}")


def nginx_proxy(port: int, upstream: int, workers: int):
    return _nginx(port, workers, "location = /health { return 200 'ok'; } location / { "
                                 f"proxy_pass http://127.0.0.1:{upstream}; proxy_http_version 1.1; "
                                 "proxy_set_header Connection \"\"; proxy_buffering off; }")


def gateway_workers(port: int, upstreams: list[int], workers: int, redis_url: str, sink: OTLPSink | None = None):
    env = {"INFERWATCH_GATEWAY_UPSTREAM_URL": ",".join(f"http://127.0.0.1:{p}" for p in upstreams),
           "INFERWATCH_GATEWAY_REDIS_URL": redis_url, "INFERWATCH_GATEWAY_WORKERS": str(workers)}
    if sink is not None:
        env |= {"INFERWATCH_GATEWAY_API_KEYS": API_KEY, "INFERWATCH_GATEWAY_DRIFT_URL": sink.base,
                "INFERWATCH_GATEWAY_OTLP_ENDPOINT": sink.endpoint, "INFERWATCH_GATEWAY_TRACE_SAMPLE_RATIO": "0.1"}
    return running("gateway", [sys.executable, "-m", "inferwatch", "gateway", "--port", str(port)],
                   f"http://127.0.0.1:{port}/health", env=env)


def rate(port: int, seconds: float, auth: bool) -> float:
    out = wrk(f"http://127.0.0.1:{port}/v1/chat/completions", CHAT_BODY, CONNECTIONS, seconds, auth, cpus=None, threads=2)
    return out["rps"]


def workers_table(runs: int, seconds: float, counts: list[int]) -> list[str]:
    sink = OTLPSink()
    rows = ["| workers | nginx req/s | gateway req/s | gateway (production) req/s | gateway vs nginx | "
            "gateway vs 1 worker | production vs 1 worker |", "|---|---|---|---|---|---|---|"]
    results: dict[tuple[str, int], list[float]] = {}
    with ExitStack() as stack:
        upstreams = [free_port(), free_port()]
        for port in upstreams:
            stack.enter_context(static_upstream(port))
        redis_url = stack.enter_context(redis_server()).url
        targets = []
        for n in counts:
            ports = {name: free_port() for name in ("nginx", "gateway", "production")}
            stack.enter_context(nginx_proxy(ports["nginx"], upstreams[0], n))
            stack.enter_context(gateway_workers(ports["gateway"], upstreams[:1], n, redis_url))
            stack.enter_context(gateway_workers(ports["production"], upstreams, n, redis_url, sink))
            targets += [(name, n, ports[name], name == "production") for name in ports]
        for _, _, port, auth in targets:  # warm up every worker's connections and caches
            rate(port, 1, auth)
        for _ in range(runs):  # interleaved: drift in machine load hits every row alike
            for name, n, port, auth in targets:
                results.setdefault((name, n), []).append(rate(port, seconds, auth))
    med = {key: statistics.median(values) for key, values in results.items()}
    for n in counts:
        rows.append(f"| {n} | {med['nginx', n]:,.0f} | {med['gateway', n]:,.0f} | {med['production', n]:,.0f} | "
                    f"{med['gateway', n] / med['nginx', n]:.2f}× | {med['gateway', n] / med['gateway', counts[0]]:.2f}× "
                    f"| {med['production', n] / med['production', counts[0]]:.2f}× |")
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--seconds", type=int, default=4)
    parser.add_argument("--workers", default="1,2", help="worker counts, comma-separated (the first is the base)")
    args = parser.parse_args()
    counts = [int(n) for n in args.workers.split(",")]
    for tool in ("wrk", "redis-server"):
        if not shutil.which(tool):
            sys.exit(f"{tool} is needed (make bench installs it)")
    print(f"## Requests/s by worker processes, {os.cpu_count()} cores shared with wrk and the upstream "
          f"(c={CONNECTIONS}, median of {args.runs} runs x {args.seconds:g}s)\n")
    print("\n".join(workers_table(args.runs, args.seconds, counts)))


if __name__ == "__main__":
    main()
