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
from inferwatch.config import settings as config

APP = "inferwatch"
NAMESPACE = "inferwatch"  # the settings' default (deployment.namespace)
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
SLACK_SECRET = UserSecret("inferwatch-slack", ("api_url",), optional=True,
                          what="the Slack incoming webhook URL, when inferwatch.yaml routes to Slack")
HF_SECRET = UserSecret("hf-token", ("token",), optional=True, what="a Hugging Face token, for gated models")
USER_SECRETS = (GATEWAY_SECRET, DRIFT_SECRET, UPSTREAM_SECRET, PAGERDUTY_SECRET, SLACK_SECRET, HF_SECRET)


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
    def folder(self) -> str:
        """Its folder under models/: a served name may hold a slash."""
        return re.sub(r"[^A-Za-z0-9._-]", "-", self.name)

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

    pager_webhook: str
    ticket_webhook: str
    heartbeat_url: str


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
    """Made from ``inferwatch.yaml`` by ``from_config``; the defaults live in the declaration."""

    cluster: Cluster
    paging: Paging
    gateway_replicas: int
    gateway_max_replicas: int
    drift_replicas: int  # 2, the pair: every record goes to both
    drift_storage: str
    redis_storage: str
    namespace: str
    image: str  # the project's image: every component but vLLM runs it
    gateway_resources: dict
    models: tuple[Model, ...]  # a tree under models/ each
    overlays: dict[str, Model]  # overlays/<name>, each the gateways in front of one model
    routing: config.Routing
    drift_client_namespaces: tuple[str, ...] = ()  # rollout controllers that ask the drift pair for verdicts
    autoscaling: Autoscaling = Autoscaling()
    jobs: dict[str, str] = field(default_factory=lambda: {
        "gateway": spec.JOB_GATEWAY, "drift": spec.JOB_DRIFT, "exporter": spec.JOB_EXPORTER, "vllm": spec.JOB_VLLM})



def _pager_hook(namespace: str, hook: str) -> str:
    return f"http://inferwatch-pager.{namespace}.svc:{PAGER_PORT}/hooks/{hook}"


def _image(template: str, declared: config.Deployment) -> str:
    """An image reference of the settings: ``{registry}`` and ``{tag}`` filled in (an empty
    registry leaves a local name, as ``docker build -t`` gives)."""
    return template.format(registry=declared.registry, tag=declared.tag).removeprefix("/")


def model(declared: config.Model, deployment: config.Deployment) -> Model:
    vllm = declared.kubernetes
    assert vllm is not None  # the settings refuse an overlay of a model without one
    resources = {"requests": dict(vllm.resources.requests), **({"limits": dict(vllm.resources.limits)}
                                                               if vllm.resources.limits else {})}
    return Model(declared.name, image=_image(vllm.image, deployment), args=tuple(vllm.args), resources=resources,
                 gpu=vllm.gpu, as_root=vllm.as_root, min_replicas=vllm.min_replicas, max_replicas=vllm.max_replicas,
                 startup_s=vllm.startup_s, tracing_flag=vllm.tracing_flag, downloads=vllm.downloads)


def from_config(declared: config.Settings = config.Settings()) -> Settings:
    """The tree's settings from ``inferwatch.yaml``'s (its ``deployment``, ``models``, ``routing``)."""
    d = declared.deployment
    models = {m.name: model(m, d) for m in declared.models if m.kubernetes is not None}
    hooks = {hook: _pager_hook(d.namespace, hook) for hook in ("pager", "ticket", "deadman")}
    return Settings(
        cluster=Cluster(release=d.release, monitoring_namespace=d.monitoring_namespace),
        paging=Paging(hooks["pager"], hooks["ticket"], declared.routing.heartbeat_url or hooks["deadman"]),
        gateway_replicas=d.gateway_replicas, gateway_max_replicas=d.gateway_max_replicas,
        drift_replicas=d.drift_replicas, drift_storage=d.drift_storage, redis_storage=d.redis_storage,
        namespace=d.namespace, image=_image("{registry}/inferwatch:{tag}", d),
        gateway_resources={"requests": dict(d.gateway_resources.requests),
                           **({"limits": dict(d.gateway_resources.limits)} if d.gateway_resources.limits else {})},
        models=tuple(models.values()), overlays={name: models[served] for name, served in declared.overlays().items()},
        routing=declared.routing, drift_client_namespaces=tuple(d.drift_client_namespaces))


DEFAULT = from_config()  # the repository's: what deploy/kubernetes is made of
