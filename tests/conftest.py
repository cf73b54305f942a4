"""Session fixtures: the tiny model, an OTLP receiver and one real vLLM server.

vLLM (CPU build) takes ~50 s to start on two cores, so one server is shared by every test
that needs it; tests compare deltas of counters, never absolute values.

Every vLLM of the suite starts with ``VLLM_TEST_ARGS`` and ``VLLM_TEST_ENV``: eager (no
torch.compile, which costs a start ~50 s more with the cold compile cache of a CI machine,
for a model too small to gain from it), its worker in the engine's process (one process
fewer to import torch into), and compute threads not bound to a core (vLLM's CPU build pins
every engine to core 0 of a 2-core box, where the rest of the suite runs too; see
tests/integration/test_ab_split.py). The OpenAI API, the metrics and the spans the tests
look at are the same.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

from inferwatch.common.supervise import ManagedProcess
from inferwatch.serving.tiny_model import ADAPTER_NAME, build_tiny_adapter, build_tiny_model
from inferwatch.serving.vllm_launcher import VLLMConfig, vllm_process
from tests.support.otlp import OTLPReceiver
from tests.support.sockets import free_port

TINY_MODEL_NAME = "tiny-llama"
VLLM_STARTUP_TIMEOUT_S = 300
VLLM_TEST_ARGS = ("--enforce-eager", "--distributed-executor-backend", "uni")
VLLM_TEST_ENV = {"OMP_NUM_THREADS": "1", "VLLM_CPU_OMP_THREADS_BIND": "nobind"}


@dataclass
class RunningVLLM:
    config: VLLMConfig
    process: ManagedProcess

    @property
    def url(self) -> str:
        return self.config.base_url


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model(model_cache())


def model_cache() -> Path:
    return Path(os.environ.get("INFERWATCH_CACHE_DIR", Path.home() / ".cache" / "inferwatch"))


@pytest.fixture(scope="session")
def tiny_adapter(tiny_model: Path) -> Path:
    return build_tiny_adapter(tiny_model)


@pytest.fixture(scope="session")
def otlp_receiver():
    receiver = OTLPReceiver()
    yield receiver
    receiver.close()


def suite_vllm(model: Path, name: str = TINY_MODEL_NAME, *, port: int, max_model_len: int = 512,
               extra_args: tuple[str, ...] = (), **fields) -> VLLMConfig:
    """A vLLM as the suite starts every one: ``VLLM_TEST_ARGS`` first, then ``extra_args``."""
    return VLLMConfig(str(model), name, port=port, dtype="bfloat16", max_model_len=max_model_len,
                      extra_args=VLLM_TEST_ARGS + extra_args, **fields)


@contextmanager
def running_vllms(configs: Sequence[VLLMConfig], log_dir: Path) -> Iterator[list[RunningVLLM]]:
    """Start them all before waiting for any (a start is ~50 s of CPU, and they overlap), and
    stop them all at the end, whether or not they came up."""
    env = dict(os.environ, OTEL_BSP_SCHEDULE_DELAY="200", **VLLM_TEST_ENV)
    started: list[RunningVLLM] = []
    try:
        for cfg in configs:
            proc = vllm_process(cfg, log_dir / f"vllm-{cfg.served_model_name}-{cfg.port}.log", env)
            proc.start()
            started.append(RunningVLLM(cfg, proc))
        for s in started:
            s.process.wait_healthy(VLLM_STARTUP_TIMEOUT_S)
        yield started
    finally:
        for s in started:
            s.process.stop()


@pytest.fixture(scope="session")
def vllm_server(tiny_model: Path, tiny_adapter: Path, otlp_receiver: OTLPReceiver,
                tmp_path_factory: pytest.TempPathFactory):
    """The shared real vLLM server, exporting its spans to ``otlp_receiver``, serving the tiny
    model and its LoRA adapter (``ADAPTER_NAME``)."""
    # a tool parser (vLLM takes one only with auto tool choice), or vLLM refuses tool_choice naming a
    # function; pythonic needs no special tokens
    cfg = suite_vllm(tiny_model, port=free_port(), otlp_traces_endpoint=otlp_receiver.endpoint,
                     extra_args=("--enable-auto-tool-choice", "--tool-call-parser", "pythonic"),
                     lora_modules=((ADAPTER_NAME, str(tiny_adapter)),))
    with running_vllms([cfg], tmp_path_factory.mktemp("vllm")) as (server,):
        yield server


@pytest.fixture(scope="session")
def second_vllm(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory):
    """Another replica of ``vllm_server`` (same model, same name), for the tests of several."""
    with running_vllms([suite_vllm(tiny_model, port=free_port())], tmp_path_factory.mktemp("vllm-2")) as (server,):
        yield server
