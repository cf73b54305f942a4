"""Remote-write traffic of one cluster's Prometheus agent, per model and per GPU.

One cluster as inferwatch runs it: a real vLLM (the tiny model, CPU) behind a real gateway,
two NVML exporters over fake GPUs (1 and 8), and a Prometheus agent (``agent_config``)
scraping them at the shipped 10 s and remote-writing to a central Prometheus
(``central_config``). Traffic first gives the gateway its usual label sets (both routes,
streamed and not, a 4xx). Then, over a measured window, the agent's own counters give the
samples and the compressed bytes it sent; the series each target exports (as the central store
holds them) split that per model (vLLM's and the gateway's series of the model) and per GPU
(8 GPUs less 1 GPU, over 7: the baseline of the same run). Bytes per sample are the agent's
average over everything it sent.

    python bench/remote_write.py [--seconds 60]
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import requests  # noqa: E402
import yaml  # noqa: E402

from bench.procs import running  # noqa: E402
from inferwatch.deploy.monitoring import (  # noqa: E402
    Intervals,
    Targets,
    agent_config,
    agent_process,
    central_config,
    prometheus_process,
    write_targets,
)
from inferwatch.serving.tiny_model import build_tiny_model, default_cache_dir  # noqa: E402
from inferwatch.serving.vllm_launcher import vllm_process  # noqa: E402
from tests.conftest import TINY_MODEL_NAME, VLLM_TEST_ENV, suite_vllm  # noqa: E402
from tests.support.sockets import free_ports  # noqa: E402

SCRAPE = "10s"
EXPORTER = """
import sys; sys.path.insert(0, {root!r})
from inferwatch.exporters.server import ExporterSettings, serve
from tests.support.fleet import fleet
serve(ExporterSettings(port={port}, interval_s=1.0), nvml=fleet({gpus}))
"""


def query(prom: str, expr: str) -> list[dict]:
    return requests.get(f"{prom}/api/v1/query", params={"query": expr}, timeout=30).json()["data"]["result"]


def value(prom: str, expr: str) -> float:
    result = query(prom, expr)
    return float(result[0]["value"][1]) if result else 0.0


def agent_counter(agent: str, name: str) -> float:
    text = requests.get(f"{agent}/metrics", timeout=10).text
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(name))


def traffic(gateway: str) -> None:
    """The label sets a served model has: both routes, streamed and not, an error."""
    for route, body in (("chat/completions", {"messages": [{"role": "user", "content": "hi"}]}),
                        ("completions", {"prompt": "hi"})):
        for stream in (False, True):
            requests.post(f"{gateway}/v1/{route}", timeout=60,
                          json={"model": TINY_MODEL_NAME, "max_tokens": 4, "stream": stream, **body}).raise_for_status()
    requests.post(f"{gateway}/v1/chat/completions", timeout=60, json={"model": TINY_MODEL_NAME, "max_tokens": 0,
                                                                      "messages": []})


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=60)
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="inferwatch-remote-write-"))
    vllm_port, gw_port, one_port, eight_port, central_port, agent_port = free_ports(6)
    central, agent = f"http://127.0.0.1:{central_port}", f"http://127.0.0.1:{agent_port}"
    intervals = Intervals(scrape=SCRAPE)
    cfg = suite_vllm(build_tiny_model(default_cache_dir()), port=vllm_port)
    targets = Targets(prometheus=(f"127.0.0.1:{agent_port}",), alertmanager=(), gateway=(f"127.0.0.1:{gw_port}",),
                      vllm=((f"127.0.0.1:{vllm_port}", TINY_MODEL_NAME),),
                      exporter=(f"127.0.0.1:{one_port}", f"127.0.0.1:{eight_port}"))
    (work / "central.yml").write_text(yaml.safe_dump(central_config([], (), f"127.0.0.1:{central_port}", intervals)))
    (work / "agent.yml").write_text(yaml.safe_dump(agent_config(
        targets, "bench", str(write_targets(targets, work / "targets")), f"{central}/api/v1/write", intervals)))
    with contextlib.ExitStack() as stack:
        vllm = vllm_process(cfg, work / "vllm.log", {**VLLM_TEST_ENV})
        vllm.start()
        stack.callback(vllm.stop)
        vllm.wait_healthy(300)
        stack.enter_context(running("gateway", [sys.executable, "-m", "inferwatch", "gateway", "--host", "127.0.0.1",
                                                "--port", str(gw_port), "--upstream-url", cfg.base_url],
                                    f"http://127.0.0.1:{gw_port}/health"))
        for port, gpus in ((one_port, 1), (eight_port, 8)):
            stack.enter_context(running(f"exporter-{gpus}", [sys.executable, "-c", EXPORTER.format(
                root=str(ROOT), port=port, gpus=gpus)], f"http://127.0.0.1:{port}/metrics"))
        for proc in (prometheus_process(work / "central.yml", work / "central", "127.0.0.1", central_port,
                                        work / "central.log", intervals, receive=True),
                     agent_process(work / "agent.yml", work / "wal", "127.0.0.1", agent_port, work / "agent.log")):
            proc.start()
            stack.callback(proc.stop)
            proc.wait_healthy(60)
        traffic(f"http://127.0.0.1:{gw_port}")
        time.sleep(25)  # two scrapes with every label set
        samples0, bytes0, t0 = (agent_counter(agent, "prometheus_remote_storage_samples_total"),
                                agent_counter(agent, "prometheus_remote_storage_bytes_total"), time.monotonic())
        time.sleep(args.seconds)
        samples = agent_counter(agent, "prometheus_remote_storage_samples_total") - samples0
        sent = agent_counter(agent, "prometheus_remote_storage_bytes_total") - bytes0
        wall = time.monotonic() - t0

        def series(selector: str) -> float:
            return value(central, f'count({{cluster="bench", {selector}}})')

        per_sample = sent / samples
        every = series('__name__!=""')
        rows = [
            ("vLLM, one model (every series of its target)", series('job="vllm"')),
            ("gateway, the model's series", series('job="inferwatch-gateway", model="' + TINY_MODEL_NAME + '"')),
            ("gateway, the rest (per replica, any model count)",
             series('job="inferwatch-gateway", model!="' + TINY_MODEL_NAME + '"')),
            ("exporter, per GPU (8 GPUs less 1, over 7)",
             (series(f'instance="127.0.0.1:{eight_port}"') - series(f'instance="127.0.0.1:{one_port}"')) / 7),
            ("exporter, per host (1 GPU less the per-GPU share)",
             series(f'instance="127.0.0.1:{one_port}"') - (series(f'instance="127.0.0.1:{eight_port}"')
                                                            - series(f'instance="127.0.0.1:{one_port}"')) / 7),
            ("everything this agent sent", every),
        ]
    scrape_s = float(SCRAPE.removesuffix("s"))
    print(f"\n#### Remote-write from one cluster's agent, {SCRAPE} scrapes, measured over {wall:.0f} s\n")
    print(f"The agent sent {samples / wall:,.0f} samples/s ({every:,.0f} series / {SCRAPE}: {every / scrape_s:,.0f}) "
          f"in {sent / wall / 1024:,.1f} KiB/s after compression: {per_sample:.2f} bytes per sample.\n")
    print("| what | series | samples/s | KiB/s sent | MiB/day sent |")
    print("|---|---|---|---|---|")
    for what, n in rows:
        rate = n / scrape_s
        print(f"| {what} | {n:,.0f} | {rate:,.1f} | {rate * per_sample / 1024:,.2f} | "
              f"{rate * per_sample * 86400 / 2**20:,.1f} |")


if __name__ == "__main__":
    main()
