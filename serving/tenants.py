"""Tenants: the names a platform team gives sets of API keys, declared in the limits file by
key id (never the key), with what each may spend.

A request's tenant is the one its key's id is declared under; a valid key declared nowhere
is ``other``, and a request without a valid key (every request of a gateway without keys)
``anonymous``. Client-sent strings never name a tenant, so the ``tenant`` label holds the
declared names and those two, whatever clients send.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, model_validator

OTHER = "other"  # a valid key that no tenant declares
ANONYMOUS = "anonymous"  # no valid key: the key id (serving/admission.py) and the tenant alike
RESERVED = (OTHER, ANONYMOUS)

TenantName = Annotated[str, StringConstraints(pattern=r"^[a-z0-9]([a-z0-9_.-]{0,61}[a-z0-9])?$")]
KeyId = Annotated[str, StringConstraints(pattern=r"^key-[0-9a-f]{12}$")]
Period = Literal["day", "month"]


class Price(BaseModel):
    """Dollars per million tokens: what a dollar budget charges (a contract price, known when a
    request ends; the GPU-attributed cost is Prometheus's, docs/cost.md)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    input: float = Field(ge=0, allow_inf_nan=False, description="per 1M prompt tokens")
    output: float = Field(ge=0, allow_inf_nan=False, description="per 1M completion tokens")

    def dollars(self, prompt: int, completion: int) -> float:
        return (prompt * self.input + completion * self.output) / 1e6


class Budget(BaseModel):
    """What a tenant may spend per UTC day or calendar month (UTC), in tokens or dollars."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    tokens: float | None = Field(None, gt=0, allow_inf_nan=False, description="prompt and completion tokens")
    dollars: float | None = Field(None, gt=0, allow_inf_nan=False, description="at the limits file's prices")
    period: Period = "day"

    @model_validator(mode="after")
    def _one_unit(self) -> Budget:
        if (self.tokens is None) == (self.dollars is None):
            raise ValueError("a budget is either tokens or dollars: set exactly one")
        return self

    @property
    def unit(self) -> Literal["tokens", "dollars"]:
        return "tokens" if self.tokens is not None else "dollars"

    @property
    def amount(self) -> float:
        amount = self.tokens if self.tokens is not None else self.dollars
        assert amount is not None  # _one_unit
        return amount


class Tenant(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    keys: list[KeyId] = Field(default_factory=list, description="ids of its API keys (inferwatch key-id KEY)")
    critical: bool = Field(False, description="its budget running out pages (otherwise a ticket)")
    budget: Budget | None = None


def check_tenants(tenants: dict[str, Tenant]) -> dict[str, str]:
    """key id -> tenant, refusing what would make a request's tenant ambiguous (``ValueError``)."""
    owner: dict[str, str] = {}
    for name, tenant in tenants.items():
        if name in RESERVED:
            raise ValueError(f"tenants.{name}: {name!r} is reserved (undeclared keys are {OTHER!r}, requests "
                             f"without a key {ANONYMOUS!r}); pick another name")
        for kid in tenant.keys:
            if kid in owner:
                raise ValueError(f"tenants.{name}.keys: {kid} is declared for {owner[kid]!r} too: a key belongs "
                                 "to one tenant")
            owner[kid] = name
    return owner
