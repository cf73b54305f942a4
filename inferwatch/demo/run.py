"""The demo's loop: announce each scenario, run it, report what was seen, sum up."""

from __future__ import annotations

import time
from collections.abc import Sequence

from inferwatch.demo.scenarios import Demo, Scenario, Seen


def run(demo: Demo, scenarios: Sequence[Scenario]) -> list[tuple[Scenario, list[Seen]]]:
    started = time.time()
    done = []
    for i, sc in enumerate(scenarios, 1):
        demo.say(f"\n[{i}/{len(scenarios)}] {sc.title} ({time.strftime('%H:%M:%S')}, traffic for about "
                 f"{demo.seconds(sc.nominal_s):.0f} s)")
        for line in sc.announce:
            demo.say(f"  - {line}")
        # an empty budget: nothing to show, so nothing is broken (no kill, no ramp) for it
        seen = sc.run(demo) if demo.load.budget.left > 0 else [
            Seen("the scenario ran", False, "the request budget ran out before it (raise --max-requests)")]
        for s in seen:
            demo.say(f"  {'seen' if s.seen else 'NOT SEEN'}: {s.effect}{' (' + s.detail + ')' if s.detail else ''}")
        done.append((sc, seen))
    minutes = (time.time() - started) / 60
    missed = [f"{sc.name}: {s.effect}" for sc, seen in done for s in seen if not s.seen]
    demo.say(f"\nDemo over after {minutes:.1f} min, {demo.load.budget.left} requests of its budget left"
             + (" (it ran out: scenarios after that sent less than announced; raise --max-requests)."
                if demo.load.budget.left == 0 else "."))
    demo.say("Missed: " + "; ".join(missed) if missed else "Every announced effect was seen.")
    demo.say(f"The dashboards over the demo: inferwatch dashboards preview --minutes {max(1, round(minutes + 1))}")
    return done
