"""What the demo talks to: the local stack's URLs, the one guard against aiming it elsewhere,
and the few reads it checks its effects with (Prometheus, the local pager, the drift service,
the gateway's admin endpoint)."""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, fields
from typing import Any
from urllib.parse import urlsplit

import requests

TIMEOUT_S = 10.0


class DemoError(RuntimeError):
    """The stack is not what the demo needs; the message says what to do."""


def is_loopback(url: str) -> bool:
    host = urlsplit(url).hostname or ""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


@dataclass(frozen=True)
class Stack:
    """The parts of `inferwatch up` the demo drives or reads, by base URL."""

    gateway: str
    vllm: str
    prometheus: str
    pager: str
    drift: str
    model: str  # the model steady traffic, the burst and the drift ask for
    ab_model: str  # the public model whose experiment has the slow canary
    admin_token: str | None = None
    api_key: str | None = None

    def urls(self) -> dict[str, str]:
        return {f.name: getattr(self, f.name) for f in fields(self)
                if f.name in ("gateway", "vllm", "prometheus", "pager", "drift")}

    def remote(self) -> list[str]:
        """The URLs not on this machine's loopback, as `name=url`."""
        return [f"{name}={url}" for name, url in self.urls().items() if not is_loopback(url)]

    # -- reads -------------------------------------------------------------------------------

    def query(self, expr: str) -> list[dict[str, Any]]:
        """A Prometheus instant query's result vector."""
        r = requests.get(f"{self.prometheus}/api/v1/query", params={"query": expr}, timeout=TIMEOUT_S)
        r.raise_for_status()
        result: list[dict[str, Any]] = r.json()["data"]["result"]
        return result

    def scalar(self, expr: str) -> float | None:
        """The first sample's value of an instant query, None when it returns nothing."""
        result = self.query(expr)
        return float(result[0]["value"][1]) if result else None

    def firing(self, alertname: str) -> list[dict[str, Any]]:
        r = requests.get(f"{self.prometheus}/api/v1/alerts", timeout=TIMEOUT_S)
        r.raise_for_status()
        return [a for a in r.json()["data"]["alerts"]
                if a["labels"].get("alertname") == alertname and a["state"] == "firing"]

    def pages(self, alertname: str | None, since: float, status: str = "firing") -> list[dict[str, Any]]:
        """What the local pager received since a time (its clock is this host's), for one alert
        or any."""
        params = {"receiver": "pager", "status": status, **({"alertname": alertname} if alertname else {})}
        r = requests.get(f"{self.pager}/events", params=params, timeout=TIMEOUT_S)
        r.raise_for_status()
        return [e for e in r.json()["events"] if e["received_at"] >= since]

    def admin(self, method: str, path: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
        if not self.admin_token:
            raise DemoError("the gateway's admin token is needed (--admin-token, INFERWATCH_GATEWAY_ADMIN_TOKEN, "
                            "or the file `inferwatch up` writes: <run-dir>/gateway_admin_token)")
        r = requests.request(method, f"{self.gateway}{path}", json=body, timeout=TIMEOUT_S,
                             headers={"authorization": f"Bearer {self.admin_token}"})
        if r.status_code != 200:
            raise DemoError(f"{method} {path}: {r.status_code} {r.text[:300]}")
        doc: dict[str, Any] = r.json()
        return doc

    def experiment(self) -> dict[str, Any]:
        """The experiment of ``ab_model`` with its variants, as the gateway's admin endpoint shows it."""
        for exp in self.admin("GET", "/admin/experiments")["experiments"]:
            if exp["model"] == self.ab_model:
                return dict(exp)
        raise DemoError(f"the gateway has no experiment for {self.ab_model!r}: `inferwatch up` configures one "
                        "unless started with --canary-port 0")

    def adapters(self) -> list[str]:
        """The LoRA adapters of ``model`` the gateway serves (`inferwatch up` loads one on the tiny
        model): vLLM's model list names an adapter's base as its ``parent``."""
        r = requests.get(f"{self.gateway}/v1/models", timeout=TIMEOUT_S,
                         headers={"authorization": f"Bearer {self.api_key}"} if self.api_key else None)
        r.raise_for_status()
        return sorted(m["id"] for m in r.json().get("data", []) if m.get("parent") == self.model)

    def set_weights(self, weights: dict[str, float]) -> dict[str, Any]:
        return self.admin("PUT", f"/admin/experiments/{self.ab_model}/weights", {"weights": weights})

    def drift_get(self, path: str, **params: str | float) -> requests.Response:
        return requests.get(f"{self.drift}{path}", params=params, timeout=60)
