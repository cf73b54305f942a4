"""What the Kubernetes manifests are made of: names, ports, images, the secrets a user
creates, and the tunables of each overlay. One place, read by every module of this package.

The ports are the components' own defaults (a test checks them against each settings
class); the job names are the alert rules' (``alerts.spec``), so what the ServiceMonitors
produce is what the rules and their absent() guards expect.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from inferwatch.alerts import spec

APP = "inferwatch"
NAMESPACE = "inferwatch"
VERSION = "0.1.0"
IMAGE = f"inferwatch:{VERSION}"  # build it from the Dockerfile and push; `kustomize edit set image` renames
UID = 10001  # the image's user (Dockerfile); fsGroup gives it the volumes
# The label each scrape object copies into `job` (its jobLabel): job names come from the rules.
JOB_LABEL = "inferwatch.dev/job"
COMPONENT = "app.kubernetes.io/component"

GATEWAY_PORT = 8080
DRIFT_PORT = 8090
EXPORTER_PORT = 9400
PAGER_PORT = 9097
VLLM_PORT = 8000
REDIS_PORT = 6379
OTLP_HTTP_PORT = 4318
OTLP_GRPC_PORT = 4317
COLLECTOR_HEALTH_PORT = 13133
JAEGER_UI_PORT = 16686

SECRETS_DIR = "/run/secrets"


@dataclass(frozen=True)
class UserSecret:
    """A Secret the user creates (never in a manifest): its name, its keys, and whether the
    components run without it."""

    name: str
    keys: tuple[str, ...]
    optional: bool = False
    what: str = ""


GATEWAY_SECRET = UserSecret("inferwatch-gateway", ("api_keys", "admin_token"),
                            what="the gateway's API keys (one per line) and its admin token")
DRIFT_SECRET = UserSecret("inferwatch-drift", ("token",), what="the drift pair's write token, which the gateways send")
UPSTREAM_SECRET = UserSecret("inferwatch-upstream", ("api_key",), optional=True,
                             what="vLLM's --api-key, when it has one")
PAGERDUTY_SECRET = UserSecret("inferwatch-pagerduty", ("routing_key",), optional=True,
                              what="the PagerDuty Events v2 routing key (pages also go to the webhook)")
HF_SECRET = UserSecret("hf-token", ("token",), optional=True, what="a Hugging Face token, for gated models")
USER_SECRETS = (GATEWAY_SECRET, DRIFT_SECRET, UPSTREAM_SECRET, PAGERDUTY_SECRET, HF_SECRET)


@dataclass(frozen=True)
class Model:
    """One vLLM Deployment: what it serves and how it runs and scales."""

    name: str  # served model name: what clients ask for, and the `model` label
    image: str
    args: tuple[str, ...]  # the container's arguments, to the image's entrypoint
    resources: dict
    gpu: bool = False
    as_root: bool = False  # vLLM's own image runs as root; ours as UID
    min_replicas: int = 1
    max_replicas: int = 4
    waiting_per_replica: int = 4  # vllm:num_requests_waiting per replica that adds one
    startup_s: int = 900  # model download and load: what the startup probe allows
    tracing_flag: str = "--otlp-traces-endpoint"  # vLLM's; `inferwatch vllm` spells it --otlp-endpoint
    downloads: bool = True  # from the Hugging Face Hub: the optional hf-token Secret is mounted

    @property
    def service(self) -> str:
        """The Deployment's and Service's name: a Service name is a DNS label (no dots)."""
        return "vllm-" + re.sub(r"[^a-z0-9-]", "-", self.name.lower())


@dataclass(frozen=True)
class Autoscaling:
    """KEDA's ScaledObject for each model (and the HPA alternative's behaviour)."""

    polling_s: int = 15
    cooldown_s: int = 300  # the HPA's scale-down window (KEDA's cooldownPeriod acts only at zero)


@dataclass(frozen=True)
class Paging:
    """Where the AlertmanagerConfig sends each tier: webhooks in the cluster by default (the
    development pager), your own in a real install; the heartbeat is the dead man's switch."""

    pager_webhook: str = f"http://inferwatch-pager.{NAMESPACE}.svc:{PAGER_PORT}/hooks/pager"
    ticket_webhook: str = f"http://inferwatch-pager.{NAMESPACE}.svc:{PAGER_PORT}/hooks/ticket"
    heartbeat_url: str = f"http://inferwatch-pager.{NAMESPACE}.svc:{PAGER_PORT}/hooks/deadman"


@dataclass(frozen=True)
class Cluster:
    """What differs between kube-prometheus-stack installs."""

    release: str = "kube-prometheus-stack"  # the chart's release: its selectors want `release: <this>`
    monitoring_namespace: str = "monitoring"  # where Prometheus runs: NetworkPolicies let it in
    gpu_node_label: tuple[str, str] = ("nvidia.com/gpu.present", "true")  # GPU Operator's node label

    @property
    def selector_labels(self) -> dict[str, str]:
        return {"release": self.release}

    @property
    def prometheus_url(self) -> str:
        """The chart's Prometheus Service, where KEDA's queries and the drift service's (its SLO
        context) go: ``<fullname>-prometheus``, with the chart's fullname rule (the release when
        it contains the chart's name, else ``<release>-kube-prometheus-stack``, cut to 26)."""
        chart = "kube-prometheus-stack"
        fullname = self.release if chart in self.release else f"{self.release}-{chart}"
        return f"http://{fullname[:26].rstrip('-')}-prometheus.{self.monitoring_namespace}.svc:9090"


@dataclass(frozen=True)
class Settings:
    cluster: Cluster = Cluster()
    paging: Paging = Paging()
    autoscaling: Autoscaling = Autoscaling()
    gateway_replicas: int = 2
    gateway_max_replicas: int = 6
    drift_replicas: int = 2  # the pair: every record goes to both
    drift_storage: str = "5Gi"
    redis_storage: str = "1Gi"
    jobs: dict[str, str] = field(default_factory=lambda: {
        "gateway": spec.JOB_GATEWAY, "drift": spec.JOB_DRIFT, "exporter": spec.JOB_EXPORTER, "vllm": spec.JOB_VLLM})


TINY = Model(
    "tiny-llama", image=f"inferwatch-vllm-cpu:{VERSION}",  # the Dockerfile's vllm-cpu target
    args=("vllm", "--model", "tiny", "--name", "tiny-llama", "--host", "0.0.0.0", "--port", str(VLLM_PORT),
          "--dtype", "bfloat16", "--log-file", "-"),
    resources={"requests": {"cpu": "2", "memory": "4Gi"}, "limits": {"memory": "6Gi"}},
    max_replicas=2, startup_s=300, tracing_flag="--otlp-endpoint", downloads=False)
LLAMA = Model(
    "llama-3.1-8b", image="vllm/vllm-openai:v0.32.0",
    args=("meta-llama/Llama-3.1-8B-Instruct", "--served-model-name", "llama-3.1-8b",  # to `vllm serve`
          "--port", str(VLLM_PORT), "--gpu-memory-utilization", "0.90", "--max-model-len", "8192",
          "--enable-prefix-caching"),
    resources={"requests": {"cpu": "4", "memory": "24Gi", "nvidia.com/gpu": "1", "ephemeral-storage": "40Gi"},
               "limits": {"memory": "32Gi", "nvidia.com/gpu": "1"}},
    gpu=True, as_root=True)
