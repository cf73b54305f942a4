"""One loop timer for a deadline that keeps moving (serving/lazy_timer.py), on a real loop."""

import asyncio
import time

from inferwatch.serving.lazy_timer import LazyTimer, reached


def test_the_deadline_in_force_is_kept_whether_it_moves_later_or_earlier():
    async def scenario():
        fired, deadline = [], [time.monotonic() + 0.05]

        def check():
            if not reached(deadline[0]):
                return deadline[0]
            fired.append(time.monotonic())
            return None

        timer = LazyTimer(check)
        start = time.monotonic()
        timer.fire_by(deadline[0])
        for _ in range(5):  # moved later four times while it runs: the timer is not restarted
            await asyncio.sleep(0.02)
            deadline[0] = time.monotonic() + 0.05
            timer.fire_by(deadline[0])
        await asyncio.sleep(0.2)
        later = fired[0] - start
        deadline[0] = time.monotonic() + 0.02  # earlier than an armed 0.5 s timer: re-armed sooner
        timer.fire_by(time.monotonic() + 0.5)
        timer.fire_by(deadline[0])
        start = time.monotonic()
        await asyncio.sleep(0.2)
        timer.cancel()
        return later, fired[1] - start, len(fired)

    later, earlier, count = asyncio.run(scenario())
    assert 0.14 <= later < 0.3  # the last deadline set, 0.1 s + 0.05 s after the start
    assert earlier < 0.1 and count == 2


def test_a_cancelled_timer_does_not_fire():
    async def scenario():
        fired = []
        timer = LazyTimer(lambda: fired.append(1))
        timer.fire_by(time.monotonic() + 0.01)
        timer.cancel()
        await asyncio.sleep(0.05)
        return fired

    assert asyncio.run(scenario()) == []
