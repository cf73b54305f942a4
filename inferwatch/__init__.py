"""inferwatch: observability and drift monitoring for LLM inference served by vLLM.

The one import root of the distribution. The repository's top-level folders map into it
(pyproject.toml's package-dir): ``inferwatch.serving`` (the gateway), ``.exporters`` (the
NVML exporter), ``.drift`` (drift and A/B), ``.alerts``, ``.dashboards`` and ``.deploy``
(generated configs); this folder holds the CLI, local process supervision, the metric
catalog and the one generate step. This module imports nothing, so any part may read the
version from it.
"""

__version__ = "0.1.0"
