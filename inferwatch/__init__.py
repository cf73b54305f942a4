"""inferwatch: observability and drift monitoring for LLM inference served by vLLM.

The one import root of the distribution. The repository's top-level folders map into it
(pyproject.toml's package-dir): ``inferwatch.serving`` (the gateway), ``.exporters`` (the
NVML exporter), ``.drift`` (drift and A/B), ``.alerts``, ``.dashboards`` and ``.deploy``
(generated configs); this folder holds the CLI, the local stack (``inferwatch up``), the
demo and the one generate step above them, and ``common`` and ``config`` below them. This
module imports nothing, so any part may read the version from it.
"""

__version__ = "0.1.0"
