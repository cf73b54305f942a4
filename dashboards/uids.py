"""Stable dashboard uids: alert ``dashboard_url`` annotations and links between dashboards
point at these, so they must not change when a dashboard is rebuilt."""

SERVING = "inferwatch-serving"
GPUS = "inferwatch-gpus"
DRIFT = "inferwatch-drift"
SLOS = "inferwatch-slos"
TENANTS = "inferwatch-tenants"
