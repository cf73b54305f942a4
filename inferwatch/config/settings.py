"""What a team changes, declared once: ``inferwatch.yaml`` is validated by these models and
its JSON Schema (``inferwatch.schema.json``) is generated from them.

Every field has today's value as its default, so an empty file generates exactly the files
committed in the repository. The models hold values and their own checks only; the rules,
configs, dashboards and manifests are made from them by ``inferwatch.generate``.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, field_validator, model_validator

from inferwatch.common.durations import seconds
from inferwatch.common.latency_buckets import INTER_TOKEN_BUCKETS, REQUEST_DURATION_BUCKETS, TTFT_BUCKETS
from inferwatch.config.errors import ConfigError

# A single-unit Prometheus duration: what the rules and Alertmanager's routes are written with.
Duration = Annotated[str, StringConstraints(pattern=r"^[1-9][0-9]*[smhdw]$")]
Wait = Annotated[str, StringConstraints(pattern=r"^(0|[1-9][0-9]*)[smhdw]$")]
# A label value and a file name in one: a name that needs no quoting in PromQL or a path.
Name = Annotated[str, StringConstraints(pattern=r"^[a-z0-9]([a-z0-9_.-]{0,61}[a-z0-9])?$")]
ModelName = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9][A-Za-z0-9._:/@+-]{0,127}$")]
HttpUrl = Annotated[str, StringConstraints(pattern=r"^https?://[^\s/\"'`]+(/[^\s\"'`]*)?$")]
Path = Annotated[str, StringConstraints(pattern=r"^/[^\s\"'`]*$")]
# a Kubernetes quantity, as resources and storage requests take it
Quantity = Annotated[str, StringConstraints(pattern=r"^[0-9]+(\.[0-9]+)?(m|Ki|Mi|Gi|Ti|k|M|G|T)?$")]
# an Alertmanager label matcher: name, operator, quoted value
Matcher = Annotated[str, StringConstraints(pattern=r'^[a-zA-Z_][a-zA-Z0-9_]*(=|!=|=~|!~)"[^"\\]*"$')]
LabelName = Annotated[str, StringConstraints(pattern=r"^[a-zA-Z_][a-zA-Z0-9_]*$")]

# What each pattern means, for the message a person reads instead of the regex.
PATTERN_HELP = {
    r"^[1-9][0-9]*[smhdw]$": "a duration of one unit, e.g. 30s, 5m, 1h, 28d",
    r"^(0|[1-9][0-9]*)[smhdw]$": "a duration of one unit, e.g. 0s, 30s, 5m",
    r"^[a-z0-9]([a-z0-9_.-]{0,61}[a-z0-9])?$": "lower-case letters, digits, '-', '_' and '.', at most 63",
    r"^[A-Za-z0-9][A-Za-z0-9._:/@+-]{0,127}$": "a served model name: letters, digits and . _ : / @ + -",
    r"^https?://[^\s/\"'`]+(/[^\s\"'`]*)?$": "an http:// or https:// URL",
    r"^/[^\s\"'`]*$": "an absolute path",
    r"^[0-9]+(\.[0-9]+)?(m|Ki|Mi|Gi|Ti|k|M|G|T)?$": "a Kubernetes quantity, e.g. 500m, 2, 4Gi",
    r'^[a-zA-Z_][a-zA-Z0-9_]*(=|!=|=~|!~)"[^"\\]*"$': 'a matcher, e.g. severity="critical" or alertname=~"GPU.+"',
    r"^[a-zA-Z_][a-zA-Z0-9_]*$": "a Prometheus label name",
    r"^[#@][a-z0-9_.-]{1,80}$": "a Slack channel (#name) or user (@name)",
    r"^([a-z0-9.-]+(:[0-9]+)?(/[a-z0-9._-]+)*)?$": "a registry and path without a scheme, e.g. ghcr.io/acme",
    r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$": "an image tag: letters, digits, '_', '.', '-'",
}

SLI_BUCKETS = {"ttft": TTFT_BUCKETS, "e2e_latency": REQUEST_DURATION_BUCKETS, "itl": INTER_TOKEN_BUCKETS}


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, populate_by_name=True)


class Links(Section):
    """Where an alert's links point: every rule's ``dashboard_url`` and ``runbook_url``."""

    grafana_url: HttpUrl = Field("http://localhost:3000", description="Grafana's address, as people open it")
    runbook_url: HttpUrl = Field("https://github.com/inferwatch/inferwatch/blob/main/alerts/runbooks",
                                 description="Folder of the runbooks: each alert links <this>/<alert>.md")

    @field_validator("runbook_url")
    @classmethod
    def _no_trailing_slash(cls, url: str) -> str:
        return url.rstrip("/")


class SLO(Section):
    """One objective, held per model. ``threshold_s`` is the latency a good event stays
    within: one of the SLI's histogram bucket boundaries (the rules count a bucket)."""

    name: Name = Field(description="The `slo` label and the rules' group name")
    sli: Literal["availability", "ttft", "e2e_latency", "itl"] = Field(
        description="availability: no 5xx; ttft: first token; e2e_latency: whole request (2xx); itl: gaps "
                    "between streamed tokens")
    objective: float = Field(gt=0, lt=1, description="Share of good events, e.g. 0.999")
    period: Duration = Field("30d", description="The error budget's period")
    threshold_s: float | None = Field(None, gt=0, description="Latency SLIs only: a histogram bucket boundary")

    @model_validator(mode="after")
    def _threshold(self) -> SLO:
        if self.sli == "availability":
            if self.threshold_s is not None:
                raise ValueError("an availability SLO has no threshold_s")
            return self
        buckets = SLI_BUCKETS[self.sli]
        if self.threshold_s is None:
            raise ValueError(f"a {self.sli} SLO needs threshold_s, one of {list(buckets)}")
        if self.threshold_s not in buckets:
            raise ValueError(f"threshold_s {self.threshold_s:g} is not a bucket boundary of the {self.sli} "
                             f"histogram: one of {list(buckets)}")
        return self

    @field_validator("period")
    @classmethod
    def _period(cls, period: str) -> str:
        if seconds(period) < 86400:
            raise ValueError("period must be at least 1d: the budget is spent over days")
        return period


# The windows the SLO rules record (alerts/generate.py): a tier's windows are chosen from them.
Window = Literal["5m", "30m", "1h", "2h", "6h", "1d", "3d"]


class BurnWindow(Section):
    """Alert when ``budget_share`` of the period's budget burns within ``long``, confirmed
    by ``short`` (the SRE workbook's multiwindow, multi-burn-rate alerts)."""

    long: Window
    short: Window
    budget_share: float = Field(gt=0, le=1, description="Share of the period's budget spent within `long`")

    @model_validator(mode="after")
    def _short_is_shorter(self) -> BurnWindow:
        if seconds(self.short) >= seconds(self.long):
            raise ValueError(f"short ({self.short}) must be shorter than long ({self.long})")
        return self


class BurnTier(Section):
    name: Name
    severity: Literal["critical", "warning"] = Field(description="critical pages, warning opens a ticket")
    windows: list[BurnWindow] = Field(min_length=1)
    keep_firing_for: Duration = "5m"


class BurnRate(Section):
    """Tiers and the floors every burn needs in its long window before anyone is told."""

    tiers: list[BurnTier] = Field(default_factory=lambda: [
        BurnTier(name="fast", severity="critical", windows=[BurnWindow(long="1h", short="5m", budget_share=0.02),
                                                            BurnWindow(long="6h", short="30m", budget_share=0.05)]),
        BurnTier(name="slow", severity="warning", windows=[BurnWindow(long="1d", short="2h", budget_share=0.10),
                                                           BurnWindow(long="3d", short="6h", budget_share=0.10)]),
    ], min_length=1)
    min_events: int = Field(20, ge=1, description="Events the long window must hold")
    min_bad_events: int = Field(5, ge=1, description="Bad events the long window must hold")

    @model_validator(mode="after")
    def _floors(self) -> BurnRate:
        if self.min_bad_events > self.min_events:
            raise ValueError("min_bad_events must not exceed min_events")
        names = [t.name for t in self.tiers]
        if len(set(names)) != len(names):
            raise ValueError(f"tier names repeat: {names}")
        if not any(t.severity == "critical" for t in self.tiers):
            raise ValueError("no tier pages: give one tier severity critical")
        return self


class Thresholds(Section):
    """The alerts that are not SLOs: their thresholds and windows."""

    vllm_startup_grace: Duration = Field("15m", description="Model load time that pages nobody (VLLMDown)")
    kv_cache_high: float = Field(0.9, gt=0, lt=1, description="KV cache usage (0..1) of VLLMKVCacheSaturated")
    queue_window: Duration = Field("10m", description="How long a queue must stay for VLLMQueueBuildingUp")
    correctable_ecc_per_hour: int = Field(100, ge=1, description="GPUCorrectableECCRising")
    snapshot_stale_s: int = Field(60, ge=10, description="Age of the exporter's snapshot (GPUExporterSnapshotStale)")
    drift_min_window_records: int = Field(100, ge=1, description="Records a segment needs for DriftDetected")
    drift_for: Duration = Field("15m", description="How long drift must last for DriftDetected")
    tenant_budget_ticket: float = Field(0.8, gt=0, lt=1, description="Share of a tenant's budget spent that opens "
                                        "a ticket (TenantBudgetSpent); all of it pages for a critical tenant")
    straggler_stddevs: float = Field(2.0, gt=0, allow_inf_nan=False,
                                     description="Standard deviations of its peers a GPU must lag by (GPUStraggler)")
    straggler_deficit: float = Field(0.1, gt=0, lt=1, description="Share below its peers' mean a GPU must lag by "
                                     "(GPUStraggler)")
    straggler_min_utilization: float = Field(0.5, ge=0, le=1, description="Mean utilization of a model's GPUs "
                                             "below which none is a straggler (GPUStraggler)")
    nvlink_errors_per_hour: int = Field(10, ge=1, description="NVLink errors of one type in an hour that can open "
                                        "GPUNVLinkErrorsRising")
    nvlink_error_rise: float = Field(2.0, gt=1, allow_inf_nan=False, description="How many times its last day's "
                                     "rate the last hour's NVLink errors must reach (GPUNVLinkErrorsRising)")
    nvml_slow_s: float = Field(1.0, gt=0, allow_inf_nan=False, description="Seconds a GPU's NVML queries of one "
                               "cycle, or one call in progress, may take (GPUNVMLSlow)")
    pcie_busy_utilization: float = Field(0.5, gt=0, le=1, description="Utilization at which a GPU's PCIe link "
                                         "must run at its maximum generation (GPUPCIeLinkDegraded)")


class Alerts(Section):
    thresholds: Thresholds = Thresholds()
    disabled: list[str] = Field(default_factory=list, description="Alert names left out of the rules")
    for_: dict[str, Duration] = Field(default_factory=dict, alias="for",
                                      description="Alert name -> its `for` duration, over the default")


class Timing(Section):
    group_wait: Wait
    group_interval: Duration
    repeat_interval: Duration


class PagerDuty(Section):
    routing_key_file: Path = Field(description="File holding the Events v2 routing key (read by Alertmanager)")


class Slack(Section):
    api_url_file: Path = Field(description="File holding the incoming webhook URL (read by Alertmanager)")
    channel: Annotated[str, StringConstraints(pattern=r"^[#@][a-z0-9_.-]{1,80}$")]
    tickets: bool = Field(False, description="Also post tickets, not only pages")


class Webhook(Section):
    url: HttpUrl
    tickets: bool = Field(True, description="Also send tickets, not only pages")


class Receivers(Section):
    """Where pages and tickets go, besides the local pager's webhooks (which stay: they are
    what ``inferwatch up`` and the compose stack show)."""

    pagerduty: PagerDuty | None = None
    slack: Slack | None = None
    webhook: Webhook | None = None


class Inhibition(Section):
    source_matchers: list[Matcher] = Field(min_length=1)
    target_matchers: list[Matcher] = Field(min_length=1)
    equal: list[LabelName] = Field(default_factory=list)


class Routing(Section):
    receivers: Receivers = Receivers()
    group_by: list[LabelName] = Field(default_factory=lambda: ["alertname", "model", "slo", "cluster"], min_length=1)
    page: Timing = Timing(group_wait="30s", group_interval="1m", repeat_interval="1h")
    ticket: Timing = Timing(group_wait="1m", group_interval="5m", repeat_interval="24h")
    inhibitions: list[Inhibition] = Field(default_factory=list, description="Added to inferwatch's own")
    heartbeat_url: HttpUrl | None = Field(None, description="The Watchdog's dead man's switch (default: the local "
                                                            "pager's, which only shows it)")


class Cost(Section):
    gpu_hour_price: float = Field(2.0, gt=0, allow_inf_nan=False, description="Dollars per GPU-hour")
    gpu_hour_prices: dict[Annotated[str, StringConstraints(pattern=r'^[^"\\\n|]+$')],
                          Annotated[float, Field(gt=0, allow_inf_nan=False)]] = Field(
        default_factory=dict, description="GPU model name (NVML's, as inferwatch_gpu_info's `name`) -> dollars per "
                                          "GPU-hour, over gpu_hour_price")


class Resources(Section):
    requests: dict[str, Quantity]
    limits: dict[str, Quantity] = Field(default_factory=dict)


class VLLMDeployment(Section):
    """A model's vLLM Deployment on Kubernetes."""

    image: str = Field(pattern=r"^[a-z0-9{][a-zA-Z0-9._/:@{}-]*$", description="{registry} and {tag} are filled in")
    args: list[str] = Field(description="The container's arguments")
    resources: Resources
    gpu: bool = False
    as_root: bool = Field(False, description="vLLM's own image runs as root")
    min_replicas: int = Field(1, ge=1)
    max_replicas: int = Field(4, ge=1)
    startup_s: int = Field(900, ge=30, description="Model download and load time the startup probe allows")
    downloads: bool = Field(True, description="Pulls weights from the Hugging Face Hub (mounts hf-token)")
    tracing_flag: str = "--otlp-traces-endpoint"

    @field_validator("image")
    @classmethod
    def _placeholders(cls, image: str) -> str:
        try:
            image.format(registry="r", tag="t")
        except (KeyError, IndexError, ValueError) as exc:
            raise ValueError(f"only {{registry}} and {{tag}} may be filled in, not {exc}") from None
        return image

    @model_validator(mode="after")
    def _replicas(self) -> VLLMDeployment:
        if self.min_replicas > self.max_replicas:
            raise ValueError("min_replicas must not exceed max_replicas")
        return self


class Model(Section):
    name: ModelName = Field(description="vLLM's served model name: the `model` label")
    slos: list[Name] | None = Field(None, description="The SLOs this model is held to; default all")
    kubernetes: VLLMDeployment | None = None


class Deployment(Section):
    """The Kubernetes tree: where it runs and what it pulls."""

    namespace: Name = "inferwatch"
    registry: Annotated[str, StringConstraints(pattern=r"^([a-z0-9.-]+(:[0-9]+)?(/[a-z0-9._-]+)*)?$")] = Field(
        "ghcr.io/inferwatch", description="Where the project's images are pushed (empty: local names)")
    tag: Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$")] = "0.1.0"
    release: Name = Field("kube-prometheus-stack", description="kube-prometheus-stack's release: its selectors")
    monitoring_namespace: Name = "monitoring"
    gateway_replicas: int = Field(2, ge=1)
    gateway_max_replicas: int = Field(6, ge=1)
    gateway_resources: Resources = Resources(requests={"cpu": "500m", "memory": "512Mi"}, limits={"memory": "1Gi"})
    drift_replicas: int = Field(2, ge=1, le=2, description="1, or the pair (every record goes to both)")
    drift_storage: Quantity = "5Gi"
    redis_storage: Quantity = "1Gi"
    drift_client_namespaces: list[Name] = Field(
        default_factory=list, description="Namespaces whose pods may ask the drift pair for A/B verdicts (Argo "
                                          "Rollouts' analysis runs, Flagger's webhooks): the NetworkPolicy lets them in")
    overlays: dict[Name, ModelName] = Field(default_factory=lambda: {"cpu-demo": "tiny-llama", "gpu": "llama-3.1-8b"},
                                       description="Overlay name -> the model it serves")

    @model_validator(mode="after")
    def _replicas(self) -> Deployment:
        if self.gateway_replicas > self.gateway_max_replicas:
            raise ValueError("gateway_replicas must not exceed gateway_max_replicas")
        return self


def _default_models() -> list[Model]:
    return [
        Model(name="tiny-llama", kubernetes=VLLMDeployment(
            image="{registry}/inferwatch-vllm-cpu:{tag}",
            args=["vllm", "--model", "tiny", "--name", "tiny-llama", "--host", "0.0.0.0", "--port", "8000",
                  "--dtype", "bfloat16", "--log-file", "-"],
            resources=Resources(requests={"cpu": "2", "memory": "4Gi"}, limits={"memory": "6Gi"}),
            max_replicas=2, startup_s=300, tracing_flag="--otlp-endpoint", downloads=False)),
        Model(name="llama-3.1-8b", kubernetes=VLLMDeployment(
            image="vllm/vllm-openai:v0.32.0",
            args=["meta-llama/Llama-3.1-8B-Instruct", "--served-model-name", "llama-3.1-8b", "--port", "8000",
                  "--gpu-memory-utilization", "0.90", "--max-model-len", "8192", "--enable-prefix-caching",
                  "--enable-prompt-tokens-details"],
            resources=Resources(requests={"cpu": "4", "memory": "24Gi", "nvidia.com/gpu": "1",
                                          "ephemeral-storage": "40Gi"},
                                limits={"memory": "32Gi", "nvidia.com/gpu": "1"}),
            gpu=True, as_root=True)),
    ]


def _default_slos() -> list[SLO]:
    return [SLO(name="availability", sli="availability", objective=0.999),
            SLO(name="ttft", sli="ttft", objective=0.99, threshold_s=1.0),
            SLO(name="e2e_latency", sli="e2e_latency", objective=0.99, threshold_s=30.0)]


class Settings(Section):
    """``inferwatch.yaml``: everything optional; what is left out keeps its default."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, title="inferwatch.yaml",
                              json_schema_extra={"$id": "https://inferwatch.dev/schema/inferwatch.schema.json"})

    models: list[Model] = Field(default_factory=_default_models)
    slos: list[SLO] = Field(default_factory=_default_slos, min_length=1)
    burn_rate: BurnRate = BurnRate()
    alerts: Alerts = Alerts()
    routing: Routing = Routing()
    cost: Cost = Cost()
    links: Links = Links()
    deployment: Deployment = Deployment()

    def cross_check(self) -> None:
        """What no single field can tell, located at the field that names the missing or
        repeated thing (raises ConfigError)."""
        slos = [s.name for s in self.slos]
        for i, name in enumerate(slos):
            if name in slos[:i]:
                raise ConfigError(("slos", i, "name"), f"SLO {name!r} is declared twice")
        models = [m.name for m in self.models]
        for i, model in enumerate(self.models):
            if model.name in models[:i]:
                raise ConfigError(("models", i, "name"), f"model {model.name!r} is declared twice")
            for j, slo in enumerate(model.slos or ()):
                if slo not in slos:
                    raise ConfigError(("models", i, "slos", j), f"no SLO is named {slo!r}: one of {slos}")
        if "overlays" in self.deployment.model_fields_set:
            deployable = {m.name for m in self.models if m.kubernetes is not None}
            for overlay, model_name in self.deployment.overlays.items():
                if model_name not in deployable:
                    raise ConfigError(("deployment", "overlays", overlay),
                                      f"{model_name!r} is no model with a kubernetes section: one of "
                                      f"{sorted(deployable)}")

    def overlays(self) -> dict[str, str]:
        """Overlay -> model: as set, or the default overlays whose model the file deploys."""
        deployable = {m.name for m in self.models if m.kubernetes is not None}
        return {name: model for name, model in self.deployment.overlays.items() if model in deployable}

    def models_of(self, slo: str) -> tuple[str, ...] | None:
        """The models held to ``slo``; None when every declared model is (the SLO then also
        covers models the file does not name, as an SLO without models always has)."""
        held = tuple(m.name for m in self.models if m.slos is None or slo in m.slos)
        return None if len(held) == len(self.models) else held

