"""Rule evaluation at fleet scale: M models x V variants x R gateway replicas x C clusters.

The committed rules over a central store's view of C clusters (each series with its target's
``cluster`` label), on a real Prometheus: by default 100 models x 2 variants x 10 gateway
replicas x 5 clusters, 10,000 label sets of the series the SLOs and alerts read (requests by
status, the TTFT and end-to-end histograms' counts and threshold buckets, a tenant's requests
and goodput: 8 per set, 80,000 series), a vLLM per model and cluster (its own target, 4
gauges and a counter), and 2 GPU hosts of 8 per cluster. Counters are computed at scrape time
(a constant rate, no thread to keep up). The SLO recording rules' output is backfilled per
cluster and model with ``promtool tsdb create-blocks-from openmetrics``, as 30 days of
production would leave it (``bench/rule_eval.py``'s ``backfill``), and Prometheus merges the
blocks before anything is measured.

Reported per rule group: Prometheus's own ``evaluationTime`` (median over the evaluations
seen) and the sum of its rules' instant query times (for the 5-minute and hourly groups, which a
short run may not see evaluate), against the target of 1 s, and the baseline of the same run: 1 model x 1 variant x 1
replica x 1 cluster.

    python bench/rule_eval_fleet.py [--models 100] [--variants 2] [--replicas 10] [--clusters 5] [--seconds 120]
"""

from __future__ import annotations

import argparse
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

from bench.procs import running  # noqa: E402
from bench.rule_eval import backfill, query_ms, rule_groups, settle_compaction  # noqa: E402
from inferwatch.alerts import spec  # noqa: E402
from inferwatch.alerts.generate import RULES_DIR  # noqa: E402
from tests.support.sockets import free_ports  # noqa: E402

CHAT = "/v1/chat/completions"
GPUS_PER_HOST = 8
HOSTS_PER_CLUSTER = 2
STARTED = time.time()


def _thresholds() -> tuple[str, str]:
    ttft = next(s for s in spec.DEFAULT.slos if s.name == "ttft").good
    e2e = next(s for s in spec.DEFAULT.slos if s.name == "e2e_latency").good
    assert ttft is not None and e2e is not None
    return ttft.split('le="')[1].split('"')[0], e2e.split('le="')[1].split('"')[0]


class Fleet:
    """Every target's exposition, computed from the time since the start at each scrape."""

    def __init__(self, models: int, variants: int, replicas: int, clusters: int) -> None:
        self.models = [f"model-{i:03d}" for i in range(models)]
        self.variants = [f"v{j}" for j in range(variants)]
        self.replicas = replicas
        self.clusters = [f"c{k}" for k in range(clusters)]
        self.ttft_le, self.e2e_le = _thresholds()

    def gateway(self) -> str:
        t = time.time() - STARTED
        lines = []
        for model in self.models:
            for variant in self.variants:
                chat = f'model="{model}",variant="{variant}",route="{CHAT}"'
                lines += [
                    f'inferwatch_gateway_requests_total{{{chat},status_class="2xx"}} {5 * t:.1f}',
                    f'inferwatch_gateway_requests_total{{{chat},status_class="5xx"}} {0.005 * t:.3f}',
                    f"inferwatch_gateway_time_to_first_token_seconds_count{{{chat}}} {5 * t:.1f}",
                    f'inferwatch_gateway_time_to_first_token_seconds_bucket{{{chat},le="{self.ttft_le}"}} '
                    f"{4.97 * t:.2f}",
                    f'inferwatch_gateway_request_duration_seconds_count{{{chat},status_class="2xx"}} {5 * t:.1f}',
                    f'inferwatch_gateway_request_duration_seconds_bucket{{{chat},status_class="2xx",'
                    f'le="{self.e2e_le}"}} {4.98 * t:.2f}',
                    f'inferwatch_gateway_tenant_requests_total{{tenant="t0",model="{model}",variant="{variant}",'
                    f'status_class="2xx"}} {5 * t:.1f}',
                    f'inferwatch_gateway_goodput_requests_total{{tenant="t0",model="{model}",variant="{variant}"}} '
                    f"{4.9 * t:.2f}",
                ]
        lines.append('inferwatch_gateway_upstream_up{upstream="http://vllm:8000"} 1')
        lines.append('inferwatch_gateway_feature_records_total{outcome="sent"} ' + f"{50 * t:.0f}")
        return "\n".join(lines) + "\n"

    def vllm(self, model: str) -> str:
        t = time.time() - STARTED
        labels = f'model_name="{model}",engine="0"'
        return (f"vllm:kv_cache_usage_perc{{{labels}}} 0.4\nvllm:num_requests_waiting{{{labels}}} 0\n"
                f"vllm:num_requests_running{{{labels}}} 4\nvllm:num_preemptions_total{{{labels}}} 0\n"
                f"vllm:generation_tokens_total{{{labels}}} {200 * t:.0f}\n")

    def exporter(self) -> str:
        lines = ["inferwatch_nvml_up 1", f"inferwatch_nvml_devices {GPUS_PER_HOST}",
                 f"inferwatch_nvml_snapshot_timestamp_seconds {time.time():.3f}"]
        for g in range(GPUS_PER_HOST):
            gpu = f'gpu="{g}",uuid="GPU-{g:04d}",name="NVIDIA H100",pci_bus_id="0000:{g:02x}:00.0"'
            lines += [f"inferwatch_gpu_info{{{gpu}}} 1", f"inferwatch_gpu_device_failed{{{gpu}}} 0",
                      f"inferwatch_gpu_row_remap_failure{{{gpu}}} 0", f"inferwatch_gpu_utilization_ratio{{{gpu}}} 0.9",
                      f"inferwatch_gpu_sm_active_ratio{{{gpu}}} 0.8", f"inferwatch_gpu_sm_clock_hertz{{{gpu}}} 1.98e9",
                      f"inferwatch_gpu_power_watts{{{gpu}}} 650"]
            lines += [f'inferwatch_gpu_throttle_active{{{gpu},reason="{r}"}} 0'
                      for r in ("gpu_idle", "sw_power_cap", "hw_slowdown", "hw_thermal_slowdown")]
            lines += [f'inferwatch_gpu_ecc_errors_total{{{gpu},type="{e}",scope="volatile"}} 0'
                      for e in ("corrected", "uncorrected")]
            lines += [f'inferwatch_gpu_nvlink_errors_total{{{gpu},link="{link}",type="{kind}"}} 0'
                      for link in range(18) for kind in ("crc_flit", "crc_data", "replay", "recovery")]
        return "\n".join(lines) + "\n"

    def serve(self, port: int) -> ThreadingHTTPServer:
        fleet = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                kind, _, rest = self.path.strip("/").partition("/")
                body = (fleet.gateway() if kind == "gateway" else fleet.exporter() if kind == "exporter"
                        else fleet.vllm(rest.rsplit("/", 1)[-1])).encode()
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

    def scrape_configs(self, address: str) -> list[dict]:
        """One target per gateway replica, vLLM and GPU host of each cluster, the cluster a target label."""
        def target(cluster: str, path: str, instance: str, **more: str) -> dict:
            return {"targets": [address], "labels": {"cluster": cluster, "__metrics_path__": path,
                                                      "instance": instance, **more}}

        gateways = [target(c, "/gateway", f"gw-{r}:8080") for c in self.clusters for r in range(self.replicas)]
        vllms = [target(c, f"/vllm/{c}/{m}", f"vllm-{m}:8000", model=m) for c in self.clusters for m in self.models]
        exporters = [target(c, "/exporter", f"node-{h}:9400") for c in self.clusters for h in range(HOSTS_PER_CLUSTER)]
        relabel = [{"source_labels": ["model_name"], "regex": "(.+)", "target_label": "model"}]
        return [{"job_name": spec.JOB_GATEWAY, "static_configs": gateways},
                {"job_name": spec.JOB_VLLM, "static_configs": vllms, "metric_relabel_configs": relabel},
                {"job_name": spec.JOB_EXPORTER, "static_configs": exporters}]


def measure(models: int, variants: int, replicas: int, clusters: int, seconds: float) -> dict[str, dict]:
    work = Path(tempfile.mkdtemp(prefix="inferwatch-fleet-bench-"))
    fleet = Fleet(models, variants, replicas, clusters)
    label = f"{models}x{variants}x{replicas}x{clusters}"
    synth_port, prom_port = free_ports(2)
    server = fleet.serve(synth_port)
    om = work / "history.om"
    keys = [{"cluster": c, "model": m} for c in fleet.clusters for m in fleet.models]
    gen_s = backfill(keys, om, time.time())
    t0 = time.perf_counter()
    subprocess.run(["promtool", "tsdb", "create-blocks-from", "openmetrics", str(om), str(work / "data")],
                   check=True, capture_output=True)
    print(f"  {label}: backfill {om.stat().st_size / 1e6:.0f} MB written in {gen_s:.0f}s, "
          f"blocks in {time.perf_counter() - t0:.0f}s", file=sys.stderr)
    om.unlink()
    config = {"global": {"scrape_interval": "10s", "evaluation_interval": "10s"},
              "rule_files": [str(f) for f in sorted(RULES_DIR.glob("*.yml"))],
              "scrape_configs": fleet.scrape_configs(f"127.0.0.1:{synth_port}")}
    (work / "prometheus.yml").write_text(yaml.safe_dump(config))
    argv = ["prometheus", f"--config.file={work / 'prometheus.yml'}", f"--storage.tsdb.path={work / 'data'}",
            f"--web.listen-address=127.0.0.1:{prom_port}", "--storage.tsdb.retention.time=60d"]
    prom = f"http://127.0.0.1:{prom_port}"
    out: dict[str, dict] = {}
    with running("prometheus", argv, f"{prom}/-/ready"):
        blocks = settle_compaction(prom)
        print(f"  {label}: compaction settled at {blocks} blocks", file=sys.stderr)
        evals: dict[str, list[float]] = {}
        seen: dict[str, str] = {}
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            time.sleep(5)
            for g in requests.get(f"{prom}/api/v1/rules", timeout=30).json()["data"]["groups"]:
                if g["lastEvaluation"] != seen.get(g["name"]) and not g["lastEvaluation"].startswith("0001"):
                    seen[g["name"]] = g["lastEvaluation"]
                    evals.setdefault(g["name"], []).append(g["evaluationTime"] * 1000)
        head = requests.get(f"{prom}/api/v1/status/tsdb", timeout=30).json()["data"]["headStats"]
        out["_series"] = {"value": int(head["numSeries"])}
        for g in rule_groups():
            runs = evals.get(g["name"], [])
            out[g["name"]] = {"rules": len(g["rules"]), "eval_ms": statistics.median(runs) if runs else None,
                              "worst_ms": max(runs) if runs else None, "evals": len(runs),
                              "query_ms": sum(query_ms(prom, r["expr"], reps=3) for r in g["rules"])}
    server.shutdown()
    shutil.rmtree(work, ignore_errors=True)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", type=int, default=100)
    ap.add_argument("--variants", type=int, default=2)
    ap.add_argument("--replicas", type=int, default=10)
    ap.add_argument("--clusters", type=int, default=5)
    ap.add_argument("--seconds", type=float, default=120)
    args = ap.parse_args()
    base = measure(1, 1, 1, 1, args.seconds)
    big = measure(args.models, args.variants, args.replicas, args.clusters, args.seconds)
    label = f"{args.models}x{args.variants}x{args.replicas}x{args.clusters}"
    version = subprocess.run(["prometheus", "--version"], capture_output=True, text=True).stdout.split()[2]
    print(f"\n#### Rule evaluation at fleet scale, Prometheus {version}, 10s evaluation, 30d of SLO history\n")
    print(f"Series in the head: 1x1x1x1 {base['_series']['value']:,}, {label} {big['_series']['value']:,}\n")
    print(f"| group | rules | eval 1x1x1x1 (ms) | eval {label} (ms) | worst {label} (ms) | evals seen | "
          f"rule queries {label} (ms) | under 1 s |")
    print("|---|---|---|---|---|---|---|---|")
    fmt = lambda v: "—" if v is None else f"{v:.1f}"  # noqa: E731
    for name, row in big.items():
        if name.startswith("_"):
            continue
        worst = row["worst_ms"] if row["worst_ms"] is not None else row["query_ms"]
        ok = "yes" if worst < 1000 else "**no**"
        print(f"| {name} | {row['rules']} | {fmt(base[name]['eval_ms'])} | {fmt(row['eval_ms'])} | "
              f"{fmt(row['worst_ms'])} | {row['evals']} | {row['query_ms']:.1f} | {ok} |")


if __name__ == "__main__":
    main()
