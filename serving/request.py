"""What one proxied request carries from its head to its record.

Every role of the request path reads or fills it: access (the key's id, the admission
ticket), routing (the variant and its upstream), the proxy (the parsed request), the relay
and the recorder (what is written once, when the request ends).
"""

from __future__ import annotations

from dataclasses import dataclass

from opentelemetry import trace
from opentelemetry.context import Context

from inferwatch.serving.admission import Ticket
from inferwatch.serving.metrics import UNKNOWN_MODEL
from inferwatch.serving.split import Assignment
from inferwatch.serving.tenants import ANONYMOUS
from inferwatch.serving.upstream import Upstream
from inferwatch.serving.upstream_balancer import Endpoint
from inferwatch.serving.validation import ParsedRequest, Route

VARIANT_HEADER = b"x-inferwatch-variant"  # on answers an experiment routed: which variant gave it


@dataclass
class RequestState:
    route: Route
    path: str
    started: float  # perf_counter
    started_at: float  # unix time
    span: trace.Span
    ctx: Context
    variant: str  # the settings' one, or the variant an experiment routed the request to
    upstream: Upstream
    model: str = UNKNOWN_MODEL  # as the client asked: a model, an experiment's public name, or a LoRA adapter
    base_model: str = UNKNOWN_MODEL  # what the request metrics count it under: an adapter's base, else ``model``
    req: ParsedRequest | None = None
    key: str = ANONYMOUS  # the API key's id (serving/admission.py), never the key
    tenant: str = ANONYMOUS  # the key's tenant (serving/tenants.py)
    body_bytes: int = 0  # of the client's request: a prompt's size when vLLM's count never came
    ticket: Ticket | None = None  # admission's, given back when the request ends
    assignment: Assignment | None = None  # set when an experiment's split assigned the request
    rename: tuple[bytes, bytes] | None = None  # the variant's served model name → the public one
    response_id: str | None = None  # the answer's id, remembered for feedback
    routed: bool = False  # an experiment chose the variant: the response says which
    forced: bool = False  # the force header picked (or tried to pick) the variant: test traffic, no feature record
    endpoint: Endpoint | None = None  # the replica the request went to, until it settles
    sent: tuple[str, int, float] | None = None  # the replica's address and port, and when the request went (perf_counter)
    response_model: str | None = None  # the name vLLM answered under (GenAI's gen_ai.response.model)

    def variant_header(self) -> list[bytes] | None:
        """On answers an experiment routed: which variant gave it."""
        return [b"%s: %s\r\n" % (VARIANT_HEADER, self.variant.encode())] if self.routed else None
