"""Rule evaluation cost of alerts/rules with many models, on a real Prometheus.

A synthetic stack exposes the gateway's real metric families (built with its own
declarations) for M models x V variants, vLLM's per-model gauges, 100 drift segments and a
node of 8 GPUs; counters move every second. The SLO recording rules' own output is
backfilled with ``promtool tsdb create-blocks-from openmetrics`` as production would have
it (the 5m rates at a 10s step for 6h, their 5m samples for 3d, hourly means for 30d), so
every window reads as much history as in production; Prometheus merges the backfilled 2h
blocks as it would over those 30 days before anything is measured. It then evaluates the
committed rules every 10s.

Reported per rule group: Prometheus's own ``evaluationTime`` (median of the evaluations
seen) and, for every group including the 5-minute ones, the sum of its rules' instant
query times (median of 5). Baseline in the same run: 1 model x 1 variant.

    python bench/rule_eval.py [--models 50] [--variants 2] [--seconds 60]
"""

from __future__ import annotations

import argparse
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import requests  # noqa: E402
import yaml  # noqa: E402
from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest  # noqa: E402

from bench.procs import running  # noqa: E402
from inferwatch.alerts import spec  # noqa: E402
from inferwatch.alerts.generate import (  # noqa: E402
    ERRORS_1H_SAMPLED,
    ERRORS_5M,
    ERRORS_5M_SAMPLED,
    EVENTS_1H_SAMPLED,
    EVENTS_5M,
    EVENTS_5M_SAMPLED,
    RULES_DIR,
)
from inferwatch.serving.metrics import create_metrics  # noqa: E402
from tests.support.sockets import free_ports  # noqa: E402

ROUTES = ("/v1/chat/completions", "/v1/completions")
FEATURES = ("prompt_tokens", "completion_tokens", "ttft_s", "tpot_s", "e2e_s", "mean_logprob", "finish_reason",
            "status_class")
METHODS = ("kl", "js", "psi", "wasserstein", "ks", "chi2")


class SyntheticStack:
    """Registries per scrape job, moved forward by a thread once a second."""

    def __init__(self, models: int, variants: int) -> None:
        self.models = [f"model-{i:02d}" for i in range(models)]
        self.variants = [f"v{j}" for j in range(variants)]
        self.gateway = CollectorRegistry()
        self.gw = create_metrics(self.gateway)
        self.vllm = CollectorRegistry()
        labels = ("model", "model_name", "engine")
        self.kv = Gauge("vllm:kv_cache_usage_perc", "", labels, registry=self.vllm)
        self.waiting = Gauge("vllm:num_requests_waiting", "", labels, registry=self.vllm)
        self.running = Gauge("vllm:num_requests_running", "", labels, registry=self.vllm)
        self.preempt = Counter("vllm:num_preemptions", "", labels, registry=self.vllm)
        self.drift = CollectorRegistry()
        seg = ("model", "variant", "feature", "method")
        self.detected = Gauge("inferwatch_drift_detected", "", seg, registry=self.drift)
        self.window = Gauge("inferwatch_drift_window_records", "", ("model", "variant"), registry=self.drift)
        self.ingested = Counter("inferwatch_drift_ingested_records", "", registry=self.drift)
        self.exporter = CollectorRegistry()
        gpu = ("gpu", "uuid", "name", "pci_bus_id")
        self.throttle = Gauge("inferwatch_gpu_throttle_active", "", (*gpu, "reason"), registry=self.exporter)
        self.ecc = Counter("inferwatch_gpu_ecc_errors", "", (*gpu, "type", "scope"), registry=self.exporter)
        self.xid = Counter("inferwatch_gpu_xid_errors", "", (*gpu, "xid"), registry=self.exporter)
        self.failed = Gauge("inferwatch_gpu_device_failed", "", gpu, registry=self.exporter)
        self.remap = Gauge("inferwatch_gpu_row_remap_failure", "", gpu, registry=self.exporter)
        for name in ("inferwatch_nvml_up", "inferwatch_nvml_devices", "inferwatch_nvml_snapshot_timestamp_seconds"):
            setattr(self, name, Gauge(name, "", registry=self.exporter))
        self.rng = random.Random(1)
        self._stop = threading.Event()
        self._setup()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _setup(self) -> None:
        for model in self.models:
            self.kv.labels(model, model, "0").set(0.5)
            self.waiting.labels(model, model, "0").set(0)
            self.running.labels(model, model, "0").set(4)
            self.preempt.labels(model, model, "0")
            for variant in self.variants:
                self.window.labels(model, variant).set(500)
                for feature in FEATURES:
                    for method in METHODS:
                        self.detected.labels(model, variant, feature, method).set(0)
        for g in range(8):
            labels = (str(g), f"GPU-{g:04d}", "NVIDIA H100", f"0000:{g:02x}:00.0")
            self.failed.labels(*labels).set(0)
            self.remap.labels(*labels).set(0)
            for reason in ("gpu_idle", "sw_power_cap", "hw_slowdown", "hw_thermal_slowdown", "sw_thermal_slowdown",
                           "hw_power_brake_slowdown"):
                self.throttle.labels(*labels, reason).set(0)
            for etype in ("corrected", "uncorrected"):
                for scope in ("volatile", "aggregate"):
                    self.ecc.labels(*labels, etype, scope)
        self.inferwatch_nvml_up.set(1)
        self.inferwatch_nvml_devices.set(8)

    def _tick(self) -> None:
        m, r = self.gw, self.rng
        for model in self.models:
            for variant in self.variants:
                for route in ROUTES:
                    for status in ("2xx", "4xx", "5xx"):
                        n = {"2xx": 5, "4xx": 1, "5xx": 0 if r.random() > 0.01 else 1}[status]
                        if n:
                            m.requests.labels(model, variant, route, status).inc(n)
                            m.request_duration.labels(model, variant, route, status).observe(r.uniform(0.2, 8))
                    tok = (model, variant, route)
                    m.signals["ttft"].labels(*tok).observe(r.uniform(0.02, 1.5))
                    m.signals["itl"].labels(*tok).observe(r.uniform(0.005, 0.05))
                    m.signals["tpot"].labels(*tok).observe(r.uniform(0.005, 0.05))
                    m.signals["prompt_tokens"].labels(*tok).observe(r.randint(10, 3000))
                    m.signals["completion_tokens"].labels(*tok).observe(r.randint(10, 1000))
                    m.input_tokens.labels(*tok).inc(500)
                    m.output_tokens.labels(*tok).inc(200)
        m.feature_records.labels("sent").inc(len(self.models) * len(self.variants) * 12)
        m.upstream_up.labels("http://vllm:8000").set(1)
        self.ingested.inc(len(self.models) * len(self.variants) * 12)
        self.inferwatch_nvml_snapshot_timestamp_seconds.set(time.time())

    def _run(self) -> None:
        while not self._stop.wait(1.0):
            self._tick()

    def __enter__(self) -> SyntheticStack:
        self._tick()
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()

    def serve(self, port: int) -> ThreadingHTTPServer:
        registries = {"/gateway": self.gateway, "/vllm": self.vllm, "/drift": self.drift, "/exporter": self.exporter}

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                body = generate_latest(registries[self.path])
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args) -> None:
                pass

        server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        return server


def backfill(keys: list[dict[str, str]], out: Path, now: float) -> float:
    """OpenMetrics history of the SLO recording rules' output, one series per SLO and label
    set of ``keys`` (a model; a cluster and a model); returns seconds taken."""
    started = time.perf_counter()
    end = int(now) - 120
    with out.open("w") as f:
        for name, step, span, value in ((ERRORS_5M, 10, 6 * 3600, 0.002), (EVENTS_5M, 10, 6 * 3600, 20.0),
                                        (ERRORS_5M_SAMPLED, 300, 3 * 86400, 0.002),
                                        (EVENTS_5M_SAMPLED, 300, 3 * 86400, 20.0),
                                        (ERRORS_1H_SAMPLED, 3600, 30 * 86400, 0.002),
                                        (EVENTS_1H_SAMPLED, 3600, 30 * 86400, 20.0)):
            f.write(f"# TYPE {name} gauge\n")
            stamps = range(end - span, end, step)
            for key in keys:
                labels = ",".join(f'{k}="{v}"' for k, v in key.items())
                for slo in spec.DEFAULT.slos:
                    prefix = f'{name}{{{labels},slo="{slo.name}"}} {value} '
                    f.writelines(f"{prefix}{t}\n" for t in stamps)
        f.write("# EOF\n")
    return time.perf_counter() - started


def rule_groups() -> list[dict]:
    return [g for f in sorted(RULES_DIR.glob("*.yml")) for g in yaml.safe_load(f.read_text())["groups"]]


def settle_compaction(prom: str, timeout_s: float = 900) -> int:
    """Wait until Prometheus has merged the backfilled 2h blocks as it would have over 30
    days (production queries do not span hundreds of 2h blocks); return the block count."""
    def loaded() -> int:
        text = requests.get(f"{prom}/metrics", timeout=10).text
        return int(float(next(line.split()[1] for line in text.splitlines()
                              if line.startswith("prometheus_tsdb_blocks_loaded "))))

    deadline, last, stable_since = time.monotonic() + timeout_s, -1, time.monotonic()
    while time.monotonic() < deadline:
        now_loaded = loaded()
        if now_loaded != last:
            last, stable_since = now_loaded, time.monotonic()
        elif time.monotonic() - stable_since > 90:
            break
        time.sleep(5)
    return last


def query_ms(prom: str, expr: str, reps: int = 5) -> float:
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        r = requests.get(f"{prom}/api/v1/query", params={"query": expr}, timeout=60)
        times.append((time.perf_counter() - t0) * 1000)
        assert r.status_code == 200, r.text
    return statistics.median(times)


def measure(models: int, variants: int, seconds: float) -> dict[str, dict]:
    work = Path(tempfile.mkdtemp(prefix="inferwatch-rule-bench-"))
    with SyntheticStack(models, variants) as stack:
        synth_port, prom_port = free_ports(2)
        server = stack.serve(synth_port)
        om = work / "history.om"
        gen_s = backfill([{"model": m} for m in stack.models], om, time.time())
        t0 = time.perf_counter()
        subprocess.run(["promtool", "tsdb", "create-blocks-from", "openmetrics", str(om), str(work / "data")],
                       check=True, capture_output=True)
        print(f"  {models}x{variants}: backfill {om.stat().st_size / 1e6:.0f} MB written in {gen_s:.0f}s, "
              f"blocks in {time.perf_counter() - t0:.0f}s", file=sys.stderr)
        om.unlink()
        target = f"127.0.0.1:{synth_port}"
        jobs = [{"job_name": job, "metrics_path": path, "static_configs": [{"targets": [target]}]}
                for job, path in ((spec.JOB_GATEWAY, "/gateway"), (spec.JOB_VLLM, "/vllm"),
                                  (spec.JOB_DRIFT, "/drift"), (spec.JOB_EXPORTER, "/exporter"))]
        config = {"global": {"scrape_interval": "10s", "evaluation_interval": "10s"},
                  "rule_files": [str(f) for f in sorted(RULES_DIR.glob("*.yml"))], "scrape_configs": jobs}
        (work / "prometheus.yml").write_text(yaml.safe_dump(config))
        argv = ["prometheus", f"--config.file={work / 'prometheus.yml'}", f"--storage.tsdb.path={work / 'data'}",
                f"--web.listen-address=127.0.0.1:{prom_port}", "--storage.tsdb.retention.time=60d"]
        prom = f"http://127.0.0.1:{prom_port}"
        with running("prometheus", argv, f"{prom}/-/ready"):
            blocks = settle_compaction(prom)
            print(f"  {models}x{variants}: compaction settled at {blocks} blocks", file=sys.stderr)
            evals: dict[str, list[float]] = {}
            seen: dict[str, str] = {}
            deadline = time.monotonic() + seconds
            while time.monotonic() < deadline:
                time.sleep(5)
                for g in requests.get(f"{prom}/api/v1/rules", timeout=10).json()["data"]["groups"]:
                    if g["lastEvaluation"] != seen.get(g["name"]) and not g["lastEvaluation"].startswith("0001"):
                        seen[g["name"]] = g["lastEvaluation"]
                        evals.setdefault(g["name"], []).append(g["evaluationTime"] * 1000)
            series = requests.get(f"{prom}/api/v1/query", params={"query": "count({__name__=~'.+'})"},
                                  timeout=30).json()["data"]["result"][0]["value"][1]
            out = {"_series": {"value": int(series)}}
            for g in rule_groups():
                out[g["name"]] = {
                    "rules": len(g["rules"]),
                    "eval_ms": statistics.median(evals[g["name"]]) if g["name"] in evals else None,
                    "evals": len(evals.get(g["name"], [])),
                    "query_ms": sum(query_ms(prom, r["expr"]) for r in g["rules"]),
                }
        server.shutdown()
    shutil.rmtree(work, ignore_errors=True)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", type=int, default=50)
    ap.add_argument("--variants", type=int, default=2)
    ap.add_argument("--seconds", type=float, default=60)
    args = ap.parse_args()
    base = measure(1, 1, args.seconds)
    big = measure(args.models, args.variants, args.seconds)
    label = f"{args.models}x{args.variants}"
    version = subprocess.run(["prometheus", "--version"], capture_output=True, text=True).stdout.split()[2]
    print(f"\n#### Rule evaluation, Prometheus {version}, 10s evaluation, 30d of SLO history backfilled\n")
    print(f"Series in the TSDB head: 1x1 {base['_series']['value']:,}, {label} {big['_series']['value']:,}\n")
    print(f"| group | rules | eval 1x1 (ms) | eval {label} (ms) | evals seen | rule queries 1x1 (ms) | "
          f"rule queries {label} (ms) | ratio |")
    print("|---|---|---|---|---|---|---|---|")
    fmt = lambda v: "—" if v is None else f"{v:.1f}"  # noqa: E731
    for name, row in big.items():
        if name.startswith("_"):
            continue
        b = base[name]
        print(f"| {name} | {row['rules']} | {fmt(b['eval_ms'])} | {fmt(row['eval_ms'])} | {row['evals']} | "
              f"{b['query_ms']:.1f} | {row['query_ms']:.1f} | {row['query_ms'] / b['query_ms']:.1f}x |")


if __name__ == "__main__":
    main()
