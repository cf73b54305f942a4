"""The workloads: the gateway (Deployment, with Redis for its shared state), the drift pair
(a StatefulSet of two, a volume each), the NVML exporter (a DaemonSet on GPU nodes), vLLM
(a Deployment per model behind a headless Service the gateway resolves) and the
development pager. Prometheus, Alertmanager and Grafana are kube-prometheus-stack's."""

from __future__ import annotations

from typing import Any

from inferwatch.deploy.kube import objects as o
from inferwatch.deploy.kube.settings import (
    DRIFT_PORT,
    DRIFT_SECRET,
    EXPORTER_PORT,
    GATEWAY_PORT,
    GATEWAY_SECRET,
    HF_SECRET,
    JOB_LABEL,
    PAGER_PORT,
    REDIS_PORT,
    UID,
    UPSTREAM_SECRET,
    VLLM_PORT,
    Model,
    Settings,
)
from inferwatch.serving.settings import GatewaySettings

GATEWAY, DRIFT, EXPORTER, REDIS, PAGER, VLLM = "gateway", "drift", "exporter", "redis", "pager", "vllm"
REDIS_IMAGE = "redis:7.4.6"
# What a pod gets to finish after SIGTERM: the longest request the gateway waits for upstream,
# and the preStop pause first. The pause covers the time callers keep sending after the pod
# began terminating: a vLLM pod stays in the gateways' lists until their next re-resolve of
# the headless Service; a gateway pod until kube-proxy and load balancers drop its endpoint.
_GATEWAY_DEFAULTS = GatewaySettings()
VLLM_DRAIN_S = round(_GATEWAY_DEFAULTS.upstream_resolve_s) + 5
GATEWAY_DRAIN_S = 10
GRACE_S = round(_GATEWAY_DEFAULTS.upstream_timeout_s) + 30
# Redis keeps each answer for the ratings' window; at the cap it drops the soonest to
# expire, never the weights and limits (no TTL). Under the container's memory limit.
REDIS_MAXMEMORY = "400mb"


def name(component: str) -> str:
    return f"inferwatch-{component}"


def _health(port: str, *, startup_failures: int = 30) -> dict:
    return {"startup": o.http_probe("/health", port, period_s=2, failures=startup_failures),
            "liveness": o.http_probe("/health", port, period_s=10, failures=3),
            "readiness": o.http_probe("/health", port, period_s=5, failures=2)}


def _pod(component: str, containers: list[dict], *, volumes: list[dict] | None = None, **extra) -> dict:
    spec: dict = {"serviceAccountName": name(component), "automountServiceAccountToken": False,
                  "securityContext": o.pod_security(), "containers": containers}
    if volumes:
        spec["volumes"] = volumes
    return {"metadata": {"labels": o.labels(component)}, "spec": spec | extra}


def drift_urls(settings: Settings) -> str:
    """Each replica of the pair by its own name (the headless Service's records)."""
    return ",".join(f"http://{name(DRIFT)}-{i}.{name(DRIFT)}:{DRIFT_PORT}" for i in range(settings.drift_replicas))


def upstream_url(model: Model) -> str:
    """The model's headless Service: the gateway re-resolves it to every ready vLLM pod."""
    return f"http://{model.service}:{VLLM_PORT}"


def gateway(settings: Settings) -> list[dict]:
    """The gateways, without their upstream: each overlay names its model's (``upstream_patch``)."""
    tmp, tmp_mount = o.scratch("tmp", "/tmp")
    container = o.container(
        "gateway", settings.image, ["gateway", "--host", "0.0.0.0", "--port", str(GATEWAY_PORT)], {"http": GATEWAY_PORT},
        env=[o.env("INFERWATCH_GATEWAY_DRIFT_URLS", drift_urls(settings)),
             o.env("INFERWATCH_GATEWAY_REDIS_URL", f"redis://{name(REDIS)}:{REDIS_PORT}/0"),
             o.env("INFERWATCH_GATEWAY_API_KEYS_FILE", o.secret_file(GATEWAY_SECRET, "api_keys")),
             o.env("INFERWATCH_GATEWAY_ADMIN_TOKEN_FILE", o.secret_file(GATEWAY_SECRET, "admin_token")),
             o.env("INFERWATCH_GATEWAY_DRIFT_TOKEN_FILE", o.secret_file(DRIFT_SECRET, "token"))],
        resources=settings.gateway_resources,
        probes=_health("http"), mounts=[o.secret_mount(GATEWAY_SECRET), o.secret_mount(DRIFT_SECRET), tmp_mount])
    container["lifecycle"] = _drain(GATEWAY_DRAIN_S)
    check = _check_secrets(settings.image, [("INFERWATCH_GATEWAY_API_KEYS_FILE", o.secret_file(GATEWAY_SECRET, "api_keys")),
                            ("INFERWATCH_GATEWAY_ADMIN_TOKEN_FILE", o.secret_file(GATEWAY_SECRET, "admin_token")),
                            ("INFERWATCH_GATEWAY_DRIFT_TOKEN_FILE", o.secret_file(DRIFT_SECRET, "token"))],
                           [o.secret_mount(GATEWAY_SECRET), o.secret_mount(DRIFT_SECRET)])
    pod = _pod(GATEWAY, [container], volumes=[o.secret_volume(GATEWAY_SECRET), o.secret_volume(DRIFT_SECRET), tmp],
               initContainers=[check], terminationGracePeriodSeconds=GRACE_S,
               topologySpreadConstraints=[_spread(GATEWAY)])
    deployment = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": o.metadata(name(GATEWAY), GATEWAY),
                  # no replicas: the HPA owns them, and an apply would reset them to the file's
                  "spec": {"selector": {"matchLabels": o.selector(GATEWAY)},
                           "strategy": {"type": "RollingUpdate",
                                        "rollingUpdate": {"maxUnavailable": 0, "maxSurge": 1}},
                           "template": pod}}
    hpa = {"apiVersion": "autoscaling/v2", "kind": "HorizontalPodAutoscaler",
           "metadata": o.metadata(name(GATEWAY), GATEWAY),
           "spec": {"scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": name(GATEWAY)},
                    "minReplicas": settings.gateway_replicas, "maxReplicas": settings.gateway_max_replicas,
                    "metrics": [{"type": "Resource", "resource": {
                        "name": "cpu", "target": {"type": "Utilization", "averageUtilization": 70}}}]}}
    return [o.service_account(name(GATEWAY), GATEWAY), deployment,
            o.service(name(GATEWAY), GATEWAY, {"http": GATEWAY_PORT}, job=settings.jobs["gateway"],
                      job_label=JOB_LABEL),
            o.pod_disruption_budget(name(GATEWAY), GATEWAY), hpa]


def _drain(seconds: int) -> dict:
    """A pause before SIGTERM (the kubelet's own sleep: no shell in the image needed)."""
    return {"preStop": {"sleep": {"seconds": seconds}}}


def _check_secrets(image: str, required: list[tuple[str, str]], mounts: list[dict]) -> dict:
    """The compose stack's pre-flight as an init container: a missing or empty secret stops
    the pod with a message naming it, before the service starts on half a configuration."""
    return o.container("check-secrets", image, ["check-secrets", *(f"{var}={path}" for var, path in required)], {},
                       resources={"requests": {"cpu": "50m", "memory": "64Mi"}, "limits": {"memory": "128Mi"}},
                       mounts=mounts)


def _spread(component: str) -> dict:
    return {"maxSkew": 1, "topologyKey": "kubernetes.io/hostname", "whenUnsatisfiable": "ScheduleAnyway",
            "labelSelector": {"matchLabels": o.selector(component)}}


def redis(settings: Settings) -> list[dict]:
    """One Redis with an append-only file: the weights set at run time outlive a restart.
    The gateways keep serving without it (their shared state degrades, visibly)."""
    container = o.container(
        "redis", REDIS_IMAGE, ["redis-server", "--appendonly", "yes", "--dir", "/data", "--protected-mode", "no",
                               "--maxmemory", REDIS_MAXMEMORY, "--maxmemory-policy", "volatile-ttl"],
        {"redis": REDIS_PORT},
        resources={"requests": {"cpu": "100m", "memory": "128Mi"}, "limits": {"memory": "512Mi"}},
        probes={"liveness": {"exec": {"command": ["redis-cli", "ping"]}, "periodSeconds": 10, "timeoutSeconds": 3},
                "readiness": {"exec": {"command": ["redis-cli", "ping"]}, "periodSeconds": 5, "timeoutSeconds": 3}},
        mounts=[{"name": "data", "mountPath": "/data"}])
    pod = _pod(REDIS, [container])
    pod["spec"]["securityContext"] = o.pod_security(999)  # the redis image's user
    return [o.service_account(name(REDIS), REDIS),
            _stateful_set(REDIS, 1, pod, settings.redis_storage),
            o.service(name(REDIS), REDIS, {"redis": REDIS_PORT}, headless=True)]  # the StatefulSet's


def _stateful_set(component: str, replicas: int, pod: dict, storage: str) -> dict:
    return {"apiVersion": "apps/v1", "kind": "StatefulSet", "metadata": o.metadata(name(component), component),
            "spec": {"serviceName": name(component), "replicas": replicas,
                     "selector": {"matchLabels": o.selector(component)}, "template": pod,
                     "volumeClaimTemplates": [{"metadata": {"name": "data"}, "spec": {
                         "accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": storage}}}}]}}


def drift(settings: Settings) -> list[dict]:
    """The pair: two replicas with a volume each (SQLite), both fed every record; a headless
    Service names each for the gateways, and ServiceMonitor scrapes both."""
    tmp, tmp_mount = o.scratch("tmp", "/tmp")
    container = o.container(
        "drift", settings.image, ["drift", "serve", "--host", "0.0.0.0", "--port", str(DRIFT_PORT),
                         "--db-path", "/data/drift.sqlite3",
                         "--prometheus-url", settings.cluster.prometheus_url],
        {"http": DRIFT_PORT}, env=[o.env("INFERWATCH_DRIFT_TOKEN_FILE", o.secret_file(DRIFT_SECRET, "token"))],
        resources={"requests": {"cpu": "250m", "memory": "512Mi"}, "limits": {"memory": "2Gi"}},
        probes=_health("http"), mounts=[o.secret_mount(DRIFT_SECRET), {"name": "data", "mountPath": "/data"},
                                        tmp_mount])
    check = _check_secrets(settings.image, [("INFERWATCH_DRIFT_TOKEN_FILE", o.secret_file(DRIFT_SECRET, "token"))],
                           [o.secret_mount(DRIFT_SECRET)])
    pod = _pod(DRIFT, [container], volumes=[o.secret_volume(DRIFT_SECRET), tmp], initContainers=[check],
               topologySpreadConstraints=[_spread(DRIFT)])
    return [o.service_account(name(DRIFT), DRIFT),
            _stateful_set(DRIFT, settings.drift_replicas, pod, settings.drift_storage),
            o.service(name(DRIFT), DRIFT, {"http": DRIFT_PORT}, headless=True, job=settings.jobs["drift"],
                      job_label=JOB_LABEL),
            o.pod_disruption_budget(name(DRIFT), DRIFT)]


def exporter(settings: Settings) -> list[dict]:
    """On every GPU node, without requesting a GPU (that would take one from vLLM): the
    NVIDIA runtime gives it every device through NVIDIA_VISIBLE_DEVICES=all. No hostPID: it
    would only name the processes on each GPU (``--processes``, off by default), and would
    put the whole namespace at Pod Security `privileged` (docs/kubernetes.md says how)."""
    key, value = settings.cluster.gpu_node_label
    container = o.container(
        "exporter", settings.image, ["exporter", "--host", "0.0.0.0", "--port", str(EXPORTER_PORT)], {"metrics": EXPORTER_PORT},
        env=[o.env("NVIDIA_VISIBLE_DEVICES", "all"), o.env("NVIDIA_DRIVER_CAPABILITIES", "utility")],
        resources={"requests": {"cpu": "50m", "memory": "64Mi"}, "limits": {"memory": "256Mi"}},
        probes=_health("metrics"))
    pod = _pod(EXPORTER, [container], nodeSelector={key: value},
               tolerations=[{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}])
    daemon_set: dict[str, Any] = {"apiVersion": "apps/v1", "kind": "DaemonSet", "metadata": o.metadata(name(EXPORTER), EXPORTER),
                  "spec": {"selector": {"matchLabels": o.selector(EXPORTER)},
                           "updateStrategy": {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 1}},
                           "template": pod}}
    daemon_set["spec"]["template"]["metadata"]["labels"][JOB_LABEL] = settings.jobs["exporter"]
    return [o.service_account(name(EXPORTER), EXPORTER), daemon_set]


POD_RESOURCES_DIR = "/var/lib/kubelet/pod-resources"


def pod_resources_patch() -> dict:
    """The exporter reading the kubelet's pod-resources socket (which pod uses which GPU):
    the socket's folder mounted read-only from the host, and the container run as root, since
    the kubelet's socket is root's (its capabilities stay dropped: root owns the file, no
    override is needed). A hostPath is beyond Pod Security `baseline`: the component says so
    to the namespace (``pod_resources_namespace_patch``)."""
    return {"apiVersion": "apps/v1", "kind": "DaemonSet", "metadata": {"name": name(EXPORTER)},
            "spec": {"template": {"spec": {
                "containers": [{"name": "exporter",
                                "volumeMounts": [{"name": "pod-resources", "mountPath": POD_RESOURCES_DIR,
                                                  "readOnly": True}],
                                "securityContext": {"runAsNonRoot": False, "runAsUser": 0, "runAsGroup": 0}}],
                "volumes": [{"name": "pod-resources",
                             "hostPath": {"path": POD_RESOURCES_DIR, "type": "Directory"}}]}}}}


def pod_resources_namespace_patch(namespace: str) -> dict:
    """`privileged` enforced (a hostPath volume), `baseline` still warned and audited: every
    other pod keeps meeting it, and one that stops is reported."""
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace, "labels": {
        "pod-security.kubernetes.io/enforce": "privileged", "pod-security.kubernetes.io/warn": "baseline",
        "pod-security.kubernetes.io/audit": "baseline"}}}


def pager(settings: Settings) -> list[dict]:
    """The development pager (Alertmanager's webhook receiver, as in compose): pages,
    tickets and heartbeats land in its log. Point Paging's URLs at your own for production."""
    container = o.container("pager", settings.image, ["pager", "--host", "0.0.0.0", "--port", str(PAGER_PORT)],
                            {"http": PAGER_PORT},
                            resources={"requests": {"cpu": "20m", "memory": "64Mi"}, "limits": {"memory": "128Mi"}},
                            probes=_health("http"))
    deployment = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": o.metadata(name(PAGER), PAGER),
                  "spec": {"replicas": 1, "selector": {"matchLabels": o.selector(PAGER)},
                           "template": _pod(PAGER, [container])}}
    return [o.service_account(name(PAGER), PAGER), deployment, o.service(name(PAGER), PAGER, {"http": PAGER_PORT})]


LIVENESS_S = 180  # how long vLLM may fail /health before it is restarted (readiness acts in 10 s)


def vllm(model: Model, settings: Settings) -> list[dict]:
    """A model's Deployment and the headless Service the gateways resolve. Replicas are
    KEDA's (autoscaling.py); the startup probe allows for the model's download and load."""
    component = VLLM
    labels = {**o.labels(component), "inferwatch.dev/model": model.name}
    match = {**o.selector(component), "inferwatch.dev/model": model.name}
    cache, cache_mount = o.scratch("cache", "/root/.cache" if model.as_root else "/home/inferwatch/.cache", "64Gi")
    shm = {"name": "shm", "emptyDir": {"medium": "Memory", "sizeLimit": "8Gi"}}
    env = [o.env("VLLM_NO_USAGE_STATS", "1")]
    volumes = [cache, shm]
    mounts = [cache_mount, {"name": "shm", "mountPath": "/dev/shm"}]
    if model.downloads:  # a file, so the token is in no env value (huggingface_hub reads HF_TOKEN_PATH)
        env.append(o.env("HF_TOKEN_PATH", o.secret_file(HF_SECRET, "token")))
        volumes.append(o.secret_volume(HF_SECRET, optional=True))
        mounts.append(o.secret_mount(HF_SECRET))
    container = o.container(
        "vllm", model.image, list(model.args), {"http": VLLM_PORT}, env=env, resources=model.resources,
        # Readiness takes a replica that does not answer /health within 5 s out of the Service at
        # once; liveness restarts it only after LIVENESS_S of no answer at all: a vLLM busy with a
        # large batch answers /health late, and restarting it would lose every request it holds
        # (an engine that died answers 500 at once, and is restarted after the same time).
        probes={"startup": o.http_probe("/health", "http", period_s=10, failures=model.startup_s // 10),
                "liveness": o.http_probe("/health", "http", period_s=30, failures=LIVENESS_S // 30, timeout_s=20),
                "readiness": o.http_probe("/health", "http", period_s=5, failures=2, timeout_s=5)},
        mounts=mounts, read_only=False)
    container["lifecycle"] = _drain(VLLM_DRAIN_S)
    pod: dict = {"metadata": {"labels": labels}, "spec": {
        "serviceAccountName": name(component), "automountServiceAccountToken": False,
        "containers": [container], "volumes": volumes, "terminationGracePeriodSeconds": GRACE_S}}
    if not model.as_root:
        pod["spec"]["securityContext"] = o.pod_security(UID)
    else:
        pod["spec"]["securityContext"] = {"seccompProfile": {"type": "RuntimeDefault"}}
        container["securityContext"] = {"allowPrivilegeEscalation": False}
    if model.gpu:
        pod["spec"]["tolerations"] = [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
    deployment = {"apiVersion": "apps/v1", "kind": "Deployment",
                  "metadata": {"name": model.service, "labels": labels},
                  "spec": {"selector": {"matchLabels": match}, "template": pod,
                           "strategy": {"type": "RollingUpdate", "rollingUpdate": _rollout(model)}}}
    service = {"apiVersion": "v1", "kind": "Service",
               "metadata": {"name": model.service, "labels": {**labels, JOB_LABEL: settings.jobs["vllm"]}},
               "spec": {"clusterIP": "None", "selector": match,
                        "ports": [{"name": "http", "port": VLLM_PORT, "targetPort": "http", "protocol": "TCP"}]}}
    return [deployment, service]


def _rollout(model: Model) -> dict:
    """A surge pod needs a spare GPU, which a full pool lacks (the rollout would hang in
    Pending): a GPU model replaces one pod at a time instead; a CPU model surges."""
    if model.gpu:
        return {"maxUnavailable": 1, "maxSurge": 0}
    return {"maxUnavailable": 0, "maxSurge": 1}


def vllm_service_account() -> dict:
    return o.service_account(name(VLLM), VLLM)


def upstream_key_patch() -> dict:
    """The gateway with vLLM's API key (the optional secret, required once you opt in)."""
    return gateway_env_patch([o.env("INFERWATCH_GATEWAY_UPSTREAM_API_KEY_FILE",
                                    o.secret_file(UPSTREAM_SECRET, "api_key"))],
                          volumes=[o.secret_volume(UPSTREAM_SECRET)], mounts=[o.secret_mount(UPSTREAM_SECRET)])


# vLLM takes its key from `--api-key` or this variable only, not from a file: the one secret
# here that is an environment value, by reference to the Secret (never in a manifest).
VLLM_API_KEY = "VLLM_API_KEY"


def vllm_key_patch() -> list[dict]:
    """vLLM requiring the key the gateway sends (a JSON patch for every model's Deployment)."""
    return [{"op": "add", "path": "/spec/template/spec/containers/0/env/-",
             "value": {"name": VLLM_API_KEY, "valueFrom": {"secretKeyRef": {
                 "name": UPSTREAM_SECRET.name, "key": "api_key"}}}}]


def upstream_patch(model: Model) -> dict:
    """The gateways in front of the model's replicas (strategic merge: env by name)."""
    return gateway_env_patch([o.env("INFERWATCH_GATEWAY_UPSTREAM_URL", upstream_url(model))])


def gateway_env_patch(env: list[dict], *, volumes: list[dict] | None = None, mounts: list[dict] | None = None) -> dict:
    container: dict = {"name": "gateway", "env": env}
    if mounts:
        container["volumeMounts"] = mounts
    spec: dict = {"containers": [container]}
    if volumes:
        spec["volumes"] = volumes
    return {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name(GATEWAY)},
            "spec": {"template": {"spec": spec}}}
