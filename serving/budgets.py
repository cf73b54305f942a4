"""Budgets: what each tenant may spend per UTC day or calendar month, in tokens or dollars.

A request is charged when it ends, with what vLLM reports it used (as tokens per minute
are, serving/access.py), and a tenant whose period's spend has reached its budget is
refused with a 429 until the period resets. The gateway cannot know what a request will
use before vLLM answers, so a tenant may overshoot by what its requests in flight use.

One gateway keeps the spend in its process (a restart starts the period's count again,
as its rate limits do). Replicas sharing Redis (``SharedBudgets``) add their spend into one
counter per tenant and period every ``SYNC_S`` and learn the fleet's total in return: the
fleet may overshoot by what it admits within one sync as well. While Redis does not answer
(or a replica's last total is older than ``STALE_S``), a replica counts what it spends as if
every replica it last saw spent as much, so the fleet stays near the budget; what it spent
meanwhile is added when Redis answers again. A Redis
that restarts empty is given back each replica's last known total (a floor the counter
never goes under), so a restart does not hand a tenant its budget again.

A budget belongs to the tenant's name and unit: renaming a tenant, or moving a budget from
tokens to dollars, starts a count of its own.
"""

from __future__ import annotations

import math
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from functools import partial

from prometheus_client.core import GaugeMetricFamily, Metric
from redis.asyncio import Redis

from inferwatch.serving.admission import Policy
from inferwatch.serving.shared_state import BACKGROUND_TIMEOUT_S, SharedState, SharedStateUnavailable
from inferwatch.serving.tenants import Budget, Period

SYNC_S = 0.1
STALE_S = 1.0  # a total learned longer ago than this may be missing the other replicas' spend
KEEP_AFTER_RESET_S = 86400  # a period's counter outlives its end by a day (late charges, a slow replica)

# Add ARGV[1] to the counter KEYS[1], never letting it sink under ARGV[2] (this replica's last
# known total: a Redis that restarted empty gets it back); expire it at ARGV[3] (unix
# seconds). Returns the total (as a string: Lua numbers lose their fraction).
CHARGE = """
local total = tonumber(redis.call('GET', KEYS[1]) or '0')
local floor = tonumber(ARGV[2])
if total < floor then total = floor end
total = total + tonumber(ARGV[1])
redis.call('SET', KEYS[1], tostring(total))
redis.call('EXPIREAT', KEYS[1], ARGV[3])
return tostring(total)
"""


def period_of(period: Period, now: float) -> tuple[str, float]:
    """(the period's id, when it resets as unix seconds) for the UTC day or month holding ``now``."""
    t = datetime.fromtimestamp(now, UTC)
    if period == "day":
        start = t.replace(hour=0, minute=0, second=0, microsecond=0)
        return start.strftime("%Y-%m-%d"), (start + timedelta(days=1)).timestamp()
    start = t.replace(day=1, hour=0, minute=0, second=0, microsecond=0)
    end = (start + timedelta(days=32)).replace(day=1)
    return start.strftime("%Y-%m"), end.timestamp()


@dataclass(frozen=True)
class BudgetRefusal:
    tenant: str
    retry_after_s: float
    message: str


@dataclass
class Spend:
    """One tenant's spend in its current period, as this replica knows it."""

    unit: str
    kind: Period
    period: str  # its id: the day or month
    resets_at: float
    known: float = 0.0  # the fleet's total when last learned (one gateway: everything)
    learned_at: float = -math.inf  # time.monotonic() of that
    unsent: float = 0.0  # spent here since, not yet added to the shared counter


def describe(amount: float, unit: str) -> str:
    return f"${amount:,.2f}" if unit == "dollars" else f"{amount:,.0f} tokens"


class Budgets:
    """Spend per tenant in this process."""

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self.clock = clock
        self.spends: dict[str, Spend] = {}

    def spend(self, tenant: str, budget: Budget) -> Spend:
        """The tenant's spend in the period holding now: a new one when the period, the unit
        or the tenant is new. (The calendar is read only when the period may have ended.)"""
        spend = self.spends.get(tenant)
        now = self.clock()
        if spend is not None and now < spend.resets_at and spend.kind == budget.period and spend.unit == budget.unit:
            return spend
        period, resets_at = period_of(budget.period, now)
        if spend is None or spend.period != period or spend.unit != budget.unit or spend.kind != budget.period:
            spend = self.spends[tenant] = Spend(budget.unit, budget.period, period, resets_at)
        return spend

    def used(self, spend: Spend) -> float:
        """What the tenant has spent, as far as this replica can tell."""
        return spend.known + spend.unsent

    def used_now(self, tenant: str, budget: Budget) -> float:
        """``used`` of the tenant's current period, changing nothing (read from /metrics' thread)."""
        spend = self.spends.get(tenant)
        if spend is None or spend.unit != budget.unit or spend.kind != budget.period or self.clock() >= spend.resets_at:
            return 0.0
        return self.used(spend)

    def refusal(self, tenant: str, budget: Budget | None) -> BudgetRefusal | None:
        if budget is None:
            return None
        spend = self.spend(tenant, budget)
        if self.used(spend) < budget.amount:
            return None
        wait = max(1.0, spend.resets_at - self.clock())
        reset = datetime.fromtimestamp(spend.resets_at, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        return BudgetRefusal(tenant, wait, f"Budget exhausted for tenant {tenant!r}: {describe(budget.amount, budget.unit)}"
                             f" per {budget.period} (UTC), {describe(self.used(spend), budget.unit)} used. It resets "
                             f"at {reset}, in {math.ceil(wait)}s.")

    def charge(self, tenant: str, budget: Budget | None, amount: float) -> None:
        if budget is not None and amount > 0:
            self.spend(tenant, budget).unsent += amount

    def forget(self, tenants: Iterable[str]) -> None:
        """Drop the spend of tenants the limits file no longer gives a budget."""
        for tenant in list(self.spends):
            if tenant not in tenants:
                del self.spends[tenant]


class SharedBudgets(Budgets):
    """Spend per tenant added up across the replicas in Redis, with the degraded mode above."""

    def __init__(self, shared: SharedState, clock: Callable[[], float] = time.time) -> None:
        super().__init__(clock)
        self.shared = shared
        self._charge = shared.client.register_script(CHARGE)

    def used(self, spend: Spend) -> float:
        # without a recent total, each replica last seen is assumed to spend as this one does
        fresh = self.shared.up and time.monotonic() - spend.learned_at <= STALE_S
        return spend.known + spend.unsent * (1 if fresh else self.shared.replicas)

    async def sync(self) -> None:
        """Add what was spent here to each tenant's counter and learn the fleet's totals."""
        for tenant, spend in list(self.spends.items()):
            unsent, floor = spend.unsent, spend.known
            key = self.shared.key("budget", tenant, spend.unit, spend.period)
            expire_at = int(spend.resets_at) + KEEP_AFTER_RESET_S
            try:
                total = await self.shared.run("budgets_sync", partial(self._add, key, unsent, floor, expire_at),
                                              BACKGROUND_TIMEOUT_S)
            except SharedStateUnavailable:
                if not self.shared.up:
                    return  # the next pass, after Redis answers
                continue
            spend.known, spend.learned_at = float(total), time.monotonic()
            spend.unsent -= unsent

    def _add(self, key: str, amount: float, floor: float, expire_at: int, client: Redis) -> Awaitable[bytes]:
        return self._charge(keys=[key], args=[repr(amount), repr(floor), expire_at], client=client)


class BudgetCollector:
    """``inferwatch_gateway_tenant_budget_{limit,used}`` from the policy in force and the spends
    known now: a tenant renamed or given no budget leaves the scrape with the file's change."""

    def __init__(self, budgets: Budgets, policy: Callable[[], Policy]) -> None:
        self.budgets, self.policy = budgets, policy

    def collect(self) -> Iterable[Metric]:
        limit = GaugeMetricFamily("inferwatch_gateway_tenant_budget_limit",
                                  "What the tenant may spend in its period (tokens or dollars, by unit); critical: "
                                  "running out pages.", labels=("tenant", "unit", "period", "critical"))
        used = GaugeMetricFamily("inferwatch_gateway_tenant_budget_used",
                                 "What the tenant has spent in its current period, across the replicas that share "
                                 "Redis, as this replica last learned it.", labels=("tenant", "unit", "period"))
        for tenant, declared in sorted(self.policy().tenants.items()):
            budget = declared.budget
            if budget is None:
                continue
            limit.add_metric((tenant, budget.unit, budget.period, str(declared.critical).lower()), budget.amount)
            used.add_metric((tenant, budget.unit, budget.period), self.budgets.used_now(tenant, budget))
        yield limit
        yield used

    def describe(self) -> Iterable[Metric]:
        return ()
