"""Who may do what: API keys on the OpenAI routes, the admin token on ``/admin/*`` and on
forcing a variant, the tenant a key belongs to, and admission (tenants' budgets; rate, token
and in-flight limits per key and model).

A presented key is found by its id (a SHA-256 prefix, ``key_id``) and then compared with
``hmac.compare_digest``: the lookup's timing can only tell how a hash begins, which says
nothing about any key, and a thousand keys cost what one does.
"""

from __future__ import annotations

import hmac
import logging
import math
from collections.abc import Awaitable, Mapping

from prometheus_client import CollectorRegistry

from inferwatch.serving import errors
from inferwatch.serving.admission import Admission, Policy, PolicyFile, Rejection, Ticket, key_id, key_id_of
from inferwatch.serving.budgets import BudgetCollector, Budgets, SharedBudgets
from inferwatch.serving.errors import CLIENT_CLOSED, GatewayError
from inferwatch.serving.metrics import GatewayMetrics
from inferwatch.serving.request import RequestState
from inferwatch.serving.settings import GatewaySettings
from inferwatch.serving.shared_limits import SharedAdmission
from inferwatch.serving.shared_state import SharedState
from inferwatch.serving.split import FORCE_TOKEN_HEADER
from inferwatch.serving.sse import StreamAccount
from inferwatch.serving.tenants import ANONYMOUS, OTHER

log = logging.getLogger(__name__)


class Access:
    def __init__(self, settings: GatewaySettings, metrics: GatewayMetrics, shared: SharedState | None = None,
                 registry: CollectorRegistry | None = None) -> None:
        self.metrics = metrics
        self._keys = {key_id(k.get_secret_value()): k.get_secret_value().encode() for k in settings.api_keys}
        self._allow_anonymous = settings.allow_anonymous
        self._admin_token = settings.admin_token.get_secret_value().encode() if settings.admin_token else None
        self.limits: PolicyFile | None = None
        self.admission: Admission | SharedAdmission | None = None
        self.budgets: Budgets | None = None
        self._policy: Policy | None = None  # the policy the budgets last followed
        self._owners: tuple[Policy | None, dict[str, str]] = (None, {})  # key id -> tenant, of that policy
        if settings.limits_file is not None:
            self.limits = PolicyFile(settings.limits_file, self._limits_error)
            self.admission = (Admission(self.limits.policy) if shared is None
                              else SharedAdmission(shared, self.limits.policy))
            self.budgets = Budgets() if shared is None else SharedBudgets(shared)
            if registry is not None:
                limits = self.limits
                registry.register(BudgetCollector(self.budgets, lambda: limits.policy))

    def _limits_error(self, message: str) -> None:
        log.error("limits file: %s", message)
        self.metrics.limits_reload_errors.inc()

    def authorize(self, headers: Mapping[str, str]) -> str:
        """The id of the API key presented (``ANONYMOUS`` when the gateway has none)."""
        if not self._keys:
            return ANONYMOUS
        scheme, _, token = headers.get("authorization", "").partition(" ")
        presented = token.strip().encode()
        # found by its SHA-256 id, so a thousand keys cost one hash; the key itself is then
        # compared in constant time (the lookup's timing tells only about a hash's prefix)
        kid = key_id_of(presented)
        key = self._keys.get(kid)
        if key is None or not hmac.compare_digest(key, presented) or scheme.lower() != "bearer":
            if self._allow_anonymous:  # keys name tenants here; they do not guard the gateway
                return ANONYMOUS
            raise GatewayError(401, "invalid_api_key",
                               "Missing or invalid API key: send 'Authorization: Bearer <key>'.",
                               error_type=errors.AUTHENTICATION)
        return kid

    def tenant_of(self, kid: str) -> str:
        """The tenant of a key id (serving/tenants.py): declared in the limits file, else ``other``."""
        if kid == ANONYMOUS:
            return ANONYMOUS
        if self.limits is None:
            return OTHER
        policy = self.limits.current()
        if policy is not self._owners[0]:  # a pydantic private attribute costs microseconds a read
            self._owners = (policy, policy.owners)
        return self._owners[1].get(kid, OTHER)

    def authorize_admin(self, headers: Mapping[str, str]) -> None:
        if self._admin_token is None:
            raise GatewayError(403, "admin_disabled", "The admin endpoints are off: start the gateway with "
                               "INFERWATCH_GATEWAY_ADMIN_TOKEN.", error_type=errors.AUTHENTICATION)
        scheme, _, token = headers.get("authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(token.strip().encode(), self._admin_token):
            raise GatewayError(401, "invalid_admin_token", "Missing or invalid admin token: send "
                               "'Authorization: Bearer <INFERWATCH_GATEWAY_ADMIN_TOKEN>'.",
                               error_type=errors.AUTHENTICATION)

    def may_force(self, headers: Mapping[str, str]) -> bool:
        """Whether the request carries the admin token that forcing a variant takes."""
        presented = headers.get(FORCE_TOKEN_HEADER, "").strip().encode()
        return self._admin_token is not None and hmac.compare_digest(presented, self._admin_token)

    # -- admission -------------------------------------------------------------------

    def admit(self, state: RequestState) -> Awaitable[None] | None:
        """Take an admission ticket for the request, or refuse it with a 429 and when to retry.
        With shared limits, an awaitable when the replica must first take a lease (bounded by
        the Redis timeout); otherwise done on return."""
        if self.admission is None or self.limits is None:
            return None
        policy = self.admission.policy = self.limits.current()
        self._budget(state, policy)
        verdict = self.admission.admit(state.key, state.model)
        if isinstance(verdict, (Ticket, Rejection)):
            self._settle(state, verdict)
            return None
        return self._settle_later(state, verdict)

    def _budget(self, state: RequestState, policy: Policy) -> None:
        """Refuse a request of a tenant whose budget is spent (429 until the period resets)."""
        if self.budgets is None:
            return
        if policy is not self._policy:  # reloaded: tenants renamed or left without a budget are forgotten
            self._policy = policy
            self.budgets.forget([name for name, t in policy.tenants.items() if t.budget is not None])
        declared = policy.tenants.get(state.tenant)
        refusal = self.budgets.refusal(state.tenant, declared.budget if declared else None)
        if refusal is not None:
            self.metrics.admission_rejected.labels(state.model, "tenant", "budget").inc()
            raise GatewayError(429, "insufficient_quota", refusal.message, error_type=errors.INSUFFICIENT_QUOTA,
                               headers={"retry-after": str(max(1, math.ceil(refusal.retry_after_s)))})

    async def _settle_later(self, state: RequestState, verdict: Awaitable[Ticket | Rejection]) -> None:
        self._settle(state, await verdict)

    def _settle(self, state: RequestState, verdict: Ticket | Rejection) -> None:
        if isinstance(verdict, Rejection):
            self.metrics.admission_rejected.labels(state.model, verdict.scope, verdict.limit).inc()
            raise GatewayError(429, "rate_limit_exceeded", verdict.message, error_type=errors.RATE_LIMIT,
                               headers={"retry-after": str(max(1, math.ceil(verdict.retry_after_s)))})
        state.ticket = verdict

    def release(self, state: RequestState, status: int, account: StreamAccount | None) -> None:
        """Give the ticket back and charge the tenant's budget, with the tokens the request used."""
        if self.admission is None or self.limits is None:
            return
        prompt, completion = usage_to_charge(state, status, account)
        if state.ticket is not None:
            self.admission.release(state.ticket, prompt + completion)
        if self.budgets is not None and (prompt or completion):
            policy = self.limits.policy
            declared = policy.tenants.get(state.tenant)
            budget = declared.budget if declared else None
            if budget is not None:
                price = policy.price_of(state.model, state.base_model)
                amount = prompt + completion if budget.tokens is not None else \
                    price.dollars(prompt, completion) if price is not None else 0.0
                self.budgets.charge(state.tenant, budget, amount)


def usage_to_charge(state: RequestState, status: int, account: StreamAccount | None) -> tuple[int, int]:
    """(prompt, completion) tokens a request is charged against tokens-per-minute and its
    tenant's budget: vLLM's usage when it reported it (the prompt once per choice). A request
    the client abandoned has no usage (vLLM aborted it partway), so it is charged what it may
    have used: its prompt at about 4 bytes a token, and what it could generate, or for a
    stream what was relayed, so that leaving early is no way around the limit."""
    req = state.req
    n = req.n if req else 1
    if account is not None and account.prompt_tokens is not None:
        completion = account.completion_tokens if account.completion_tokens is not None else account.token_events
        return account.prompt_tokens * n, completion
    if status != CLIENT_CLOSED or req is None:
        return 0, 0
    prompt = state.body_bytes // 4 * n
    if req.stream and account is not None:
        return prompt, account.token_events
    return prompt, (req.max_tokens or 0) * n
