"""An A/B report sample: an hour's lead-in (the canary at weight 0, so the rank tests are
adjusted by CUPED), then a ramp from 5 % to 50 % (two weight epochs) of a canary 25 % slower
to its first token, for 3,000 unequal users, through the real service (ingest, GET /v1/ab,
/report). Writes the HTML docs/ab.md's screenshot is taken from:
``python -m tests.drift.ab_report_sample out.html``."""

from __future__ import annotations

import sys
import time

import numpy as np
from fastapi.testclient import TestClient
from prometheus_client import CollectorRegistry

from inferwatch.drift.service.app import DriftSettings, create_app
from tests.support import ab_simulation as sim


def render() -> str:
    now = time.time()
    rng = np.random.default_rng(1)
    users = sim.users(3000, 4, 1.0, rng)
    app = create_app(DriftSettings(db_path=":memory:"), CollectorRegistry())
    with TestClient(app) as client:
        for epoch, weights, t0 in ((0, (1.0, 0.0), now - 4500), (1, (0.95, 0.05), now - 3000),
                                   (2, (0.5, 0.5), now - 1500)):
            r = sim.requests(users, sim.split(weights, epoch), t0, t0 + 1400, rng, effect=0.25)
            for body in sim.bodies(sim.feature_records(r)):
                client.post("/v1/ingest", content=body).raise_for_status()
        client.get(f"/v1/ab/{sim.MODEL}", params={"control": "control", "treatment": "treatment",
                                                  "scope": "experiment"}).raise_for_status()
        return client.get("/report", params={"model": sim.MODEL}).text


if __name__ == "__main__":
    with open(sys.argv[1], "w") as f:
        f.write(render())
