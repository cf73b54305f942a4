"""An A/B report sample: a canary with a slower first token and more truncated answers,
through the real service (ingest, GET /v1/ab, /report). Writes the HTML docs/ab.md's
screenshot is taken from: ``python -m tests.drift.ab_report_sample out.html``."""

from __future__ import annotations

import sys
import time

import orjson
from fastapi.testclient import TestClient
from prometheus_client import CollectorRegistry

from inferwatch.drift.service import DriftSettings, create_app
from tests.support.feature_records import records

SPLIT = {"control": "v1", "treatment": "v2", "control_weight": 0.5, "treatment_weight": 0.5}


def render() -> str:
    now = time.time()
    app = create_app(DriftSettings(db_path=":memory:"), CollectorRegistry())
    with TestClient(app) as client:
        batches = (records(1500, now - 900, now - 1, seed=1, model="llama", variant="v1"),
                   records(1500, now - 900, now - 1, seed=2, model="llama", variant="v2", ttft_scale=0.12,
                           length_share=0.26))
        for batch in batches:
            for i in range(0, len(batch), 1000):
                client.post("/v1/ingest", content=orjson.dumps({"records": batch[i:i + 1000]})).raise_for_status()
        client.get("/v1/ab/llama", params=SPLIT).raise_for_status()
        return client.get("/report", params={"model": "llama"}).text


if __name__ == "__main__":
    with open(sys.argv[1], "w") as f:
        f.write(render())
