"""Small factories for the Kubernetes objects every component needs: metadata, a hardened
container, probes, secret files, a Service. Pure functions returning plain dicts."""

from __future__ import annotations

from inferwatch.deploy.kube.settings import APP, COMPONENT, SECRETS_DIR, UID, UserSecret


def labels(component: str) -> dict[str, str]:
    return {"app.kubernetes.io/name": APP, "app.kubernetes.io/part-of": APP, COMPONENT: component}


def selector(component: str) -> dict[str, str]:
    """What a workload's pods are selected by: immutable, so never a label that may change."""
    return {"app.kubernetes.io/name": APP, COMPONENT: component}


def metadata(name: str, component: str, **extra_labels: str) -> dict:
    return {"name": name, "labels": {**labels(component), **extra_labels}}


def http_probe(path: str, port: str, period_s: int = 10, failures: int = 3, timeout_s: int = 3) -> dict:
    return {"httpGet": {"path": path, "port": port}, "periodSeconds": period_s, "timeoutSeconds": timeout_s,
            "failureThreshold": failures}


def restricted(read_only: bool = True) -> dict:
    """The container securityContext of Kubernetes' `restricted` Pod Security Standard."""
    return {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": read_only,
            "capabilities": {"drop": ["ALL"]}}


def pod_security(uid: int = UID) -> dict:
    return {"runAsNonRoot": True, "runAsUser": uid, "runAsGroup": uid, "fsGroup": uid,
            "seccompProfile": {"type": "RuntimeDefault"}}


def container(name: str, image: str, args: list[str], ports: dict[str, int], *, env: list[dict] | None = None,
              resources: dict, probes: dict | None = None, mounts: list[dict] | None = None,
              read_only: bool = True) -> dict:
    """``probes``: liveness/readiness/startup probe dicts by kind (``http_probe``)."""
    c: dict = {"name": name, "image": image, "args": args}
    if ports:
        c["ports"] = [{"name": pname, "containerPort": port, "protocol": "TCP"} for pname, port in ports.items()]
    if env:
        c["env"] = env
    c["resources"] = resources
    for kind, probe in (probes or {}).items():
        c[f"{kind}Probe"] = probe
    if mounts:
        c["volumeMounts"] = mounts
    c["securityContext"] = restricted(read_only)
    return c


def env(name: str, value: str) -> dict:
    return {"name": name, "value": value}


def secret_volume(secret: UserSecret, optional: bool = False) -> dict:
    """The Secret as files, readable by the image's user only (through fsGroup). Optional:
    the pod starts without it, and the file is missing (a setting naming it fails)."""
    return {"name": secret.name, "secret": {"secretName": secret.name, "defaultMode": 0o440,
                                            **({"optional": True} if optional else {})}}


def secret_mount(secret: UserSecret) -> dict:
    return {"name": secret.name, "mountPath": f"{SECRETS_DIR}/{secret.name}", "readOnly": True}


def secret_file(secret: UserSecret, key: str) -> str:
    return f"{SECRETS_DIR}/{secret.name}/{key}"


def scratch(name: str, path: str, limit: str = "256Mi") -> tuple[dict, dict]:
    """An emptyDir and its mount: where a read-only container may write."""
    return {"name": name, "emptyDir": {"sizeLimit": limit}}, {"name": name, "mountPath": path}


def service(name: str, component: str, ports: dict[str, int], *, headless: bool = False, job: str | None = None,
            job_label: str = "") -> dict:
    """A Service on the named container ports; ``job`` labels it for its ServiceMonitor."""
    spec: dict = {"selector": selector(component),
                  "ports": [{"name": pname, "port": port, "targetPort": pname, "protocol": "TCP"}
                            for pname, port in ports.items()]}
    if headless:
        spec |= {"clusterIP": "None", "publishNotReadyAddresses": False}
    extra = {job_label: job} if job else {}
    return {"apiVersion": "v1", "kind": "Service", "metadata": metadata(name, component, **extra), "spec": spec}


def pod_disruption_budget(name: str, component: str, max_unavailable: int = 1) -> dict:
    return {"apiVersion": "policy/v1", "kind": "PodDisruptionBudget", "metadata": metadata(name, component),
            "spec": {"maxUnavailable": max_unavailable, "selector": {"matchLabels": selector(component)}}}


def service_account(name: str, component: str) -> dict:
    """One per component, with no API token: none of them talks to the Kubernetes API."""
    return {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": metadata(name, component),
            "automountServiceAccountToken": False}
