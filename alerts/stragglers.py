"""A GPU slower than the GPUs serving the same model with it: recording rules and the ticket.

One slow GPU in a tensor-parallel group holds back every request of the model, while each
GPU on its own looks healthy: nothing fails, clocks are merely lower. Training stacks
flag a rank more than 1σ and 10 % off the group's mean (NVIDIA/Megatron-LM#4662); this
does the same for serving, per signal where lower is slower:

- each GPU's 5-minute mean of a signal, labelled with the model it serves: the model its host
  serves alone (the attribution of ``alerts/cost.py``), or on Kubernetes the model of the vLLM
  pod that holds it alone (``inferwatch_gpu_pod_info``), on a node of any number of models. A
  GPU of neither (a host of several models off Kubernetes, a shared GPU) has no peers;
- the mean and standard deviation of its *peers*: the other GPUs of the same model and the
  same GPU model (an A100 is not an H100's straggler). Leaving the GPU out of its own
  reference matters: with it in, one GPU among 8 can never be more than 2.5σ off;
- the ticket (``GPUStraggler``), when a GPU is more than ``straggler_stddevs`` deviations
  *and* ``straggler_deficit`` below its peers for 10 minutes while the model's GPUs are
  busy (``straggler_min_utilization``): idle GPUs drop their clocks unevenly, and that is
  no fault. The share below is what the ticket's value says.
"""

from __future__ import annotations

from dataclasses import dataclass

from inferwatch.alerts import cost
from inferwatch.alerts.catalog import metric as m
from inferwatch.alerts.model import Alert, Record
from inferwatch.config.settings import Thresholds
from inferwatch.dashboards import uids


@dataclass(frozen=True)
class Signal:
    name: str  # the `signal` label
    metric: str


SIGNALS = (
    Signal("sm_active", m("inferwatch_gpu_sm_active_ratio")),  # GPM, Hopper and later
    Signal("utilization", m("inferwatch_gpu_utilization_ratio")),
    Signal("sm_clock", m("inferwatch_gpu_sm_clock_hertz")),
    Signal("power", m("inferwatch_gpu_power_watts")),
)
WINDOW = "5m"
PEERS = "model, name, signal"  # a GPU's peers: same served model, same GPU model, same signal

GPU_MODEL_BY_POD = "inferwatch_gpu:model_by_pod:info"  # {uuid, model}: GPUs a vLLM pod holds alone (Kubernetes)
GPU_SIGNAL = f"inferwatch_gpu:peer_signal:avg{WINDOW}"  # {host, uuid, gpu, name, model, signal}
PEERS_MEAN = f"inferwatch_gpu:peer_signal:peers_mean_avg{WINDOW}"  # the GPU's labels
PEERS_STDDEV = f"inferwatch_gpu:peer_signal:peers_stddev_avg{WINDOW}"  # the GPU's labels
DEFICIT = f"inferwatch_gpu:peer_signal:deficit_ratio_avg{WINDOW}"  # share below the peers' mean
MODEL_UTILIZATION = f"inferwatch_model:gpu_utilization:avg{WINDOW}"  # {model}


def _gpu_signal(signal: Signal) -> Record:
    per_gpu = "max by (host, uuid, gpu, name) (\n" + cost.hosted(
        lambda sel: f"avg_over_time({signal.metric}{{{sel}}}[{WINDOW}])") + "\n)"
    modelled = (f"{per_gpu}\n* on (host) group_left (model) group by (host, model) ({cost.ATTRIBUTED_GPUS})\n"
                f"or\n{per_gpu}\n* on (uuid) group_left (model) {GPU_MODEL_BY_POD}")
    return Record(GPU_SIGNAL, modelled, {"signal": signal.name})


def _over_peers(of_each: str) -> str:
    """``of_each`` (per GPU) summed over the GPU's peers, divided by how many they are: none
    for a GPU without peers."""
    return (f"(sum by ({PEERS}) ({of_each}) - on ({PEERS}) group_right {of_each})\n"
            f"/ on ({PEERS}) group_left () (count by ({PEERS}) ({GPU_SIGNAL}) - 1 > 0)")


def records() -> tuple[Record, ...]:
    return (
        # on Kubernetes, the model of each GPU a vLLM pod holds alone, whatever else its node serves
        Record(GPU_MODEL_BY_POD,
               f'group by (uuid, model) (\n  {m("inferwatch_gpu_pod_info")}{{shared="false"}}\n'
               f'  * on (namespace, pod) group_left (model) group by (namespace, pod, model) '
               f'({m("vllm:num_requests_running")}{{pod!="",model!=""}})\n)'),
        *(_gpu_signal(s) for s in SIGNALS),
        Record(PEERS_MEAN, _over_peers(GPU_SIGNAL)),
        # E[x²] - E[x]² over the peers; clamped, as rounding can take a zero spread below 0
        Record(PEERS_STDDEV, f"sqrt(clamp_min(\n{_over_peers(f'{GPU_SIGNAL} ^ 2')}\n- {PEERS_MEAN} ^ 2,\n0))"),
        Record(DEFICIT, f"({PEERS_MEAN} - {GPU_SIGNAL}) / {PEERS_MEAN}"),
        Record(MODEL_UTILIZATION, f'avg by (model) ({GPU_SIGNAL}{{signal="utilization"}})'),
    )


def alert(t: Thresholds) -> Alert:
    gpu = "GPU {{ $labels.gpu }} ({{ $labels.uuid }}) on {{ $labels.host }}"
    return Alert(
        "GPUStraggler",
        f"{DEFICIT} > {t.straggler_deficit!r}\n"
        f"and {PEERS_MEAN} - {GPU_SIGNAL} > {t.straggler_stddevs!r} * {PEERS_STDDEV}\n"
        f"and on (model) {MODEL_UTILIZATION} >= {t.straggler_min_utilization!r}",
        "warning", for_="10m", dashboard=uids.GPUS,
        summary=f"{gpu} lags the other GPUs of {{{{ $labels.model }}}} in {{{{ $labels.signal }}}}",
        description=f"{gpu}'s {{{{ $labels.signal }}}} has been {{{{ $value | humanizePercentage }}}} below "
                    "the mean of the other {{ $labels.name }} GPUs serving {{ $labels.model }} for 10m, more than "
                    f"{t.straggler_stddevs:g} standard deviations of theirs, while they are busy: every request "
                    "the model's tensor-parallel group serves waits for the slowest GPU.")
