"""The gateway's settings: one object per process, from INFERWATCH_GATEWAY_* or flags."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, ClassVar, Literal
from urllib.parse import urlsplit

from pydantic import Field, SecretStr, field_validator, model_validator
from pydantic_settings import NoDecode, SettingsConfigDict

from inferwatch.common.secret_files import SecretFileSettings
from inferwatch.serving.shared_state import check_redis_url
from inferwatch.serving.upstream_targets import normalize_upstream


class GatewaySettings(SecretFileSettings):
    """Everything the gateway process reads from its environment.

    Env vars are ``INFERWATCH_GATEWAY_<FIELD>``; list fields take comma-separated values.
    Each secret may instead come from a file, ``INFERWATCH_GATEWAY_<FIELD>_FILE``
    (``SECRETS``; API keys there one per line or comma-separated). The instance is frozen so
    no code path can change configuration behind a test's back.
    """

    SECRETS: ClassVar[tuple[str, ...]] = ("api_keys", "admin_token", "upstream_api_key", "drift_token", "redis_url")
    OPTIONAL_SECRETS: ClassVar[tuple[str, ...]] = ("upstream_api_key",)  # a vLLM without --api-key

    # hide_input_in_errors: a refused value is never echoed (a Redis URL or a key carries a
    # secret). env_ignore_empty: a variable set empty is unset, as compose passes one whose
    # value .env leaves out (GATEWAY_EXPERIMENT_FILE=).
    model_config = SettingsConfigDict(env_prefix="INFERWATCH_GATEWAY_", frozen=True, extra="forbid",
                                      hide_input_in_errors=True, env_ignore_empty=True)

    host: str = "127.0.0.1"
    port: int = Field(8080, ge=1, le=65535)
    # Processes serving the port (serving/workers.py): one core each; above 1 each is a replica
    # in the Redis sense, so redis_url is required.
    workers: int = Field(1, ge=1, le=64, description="gateway processes sharing the port (SO_REUSEPORT); above 1 "
                         "needs redis_url")
    upstream_url: str = Field("http://127.0.0.1:8000", description="vLLM OpenAI server base URL; several replicas "
                              "comma-separated, and a name resolving to several addresses is each of them")
    variant: str = Field("default", min_length=1, max_length=64, description="model version label")

    # Limits on what clients may send.
    max_body_bytes: int = Field(1_048_576, ge=1024)
    max_tokens_limit: int = Field(32_768, ge=1, description="largest max_tokens accepted")

    # Upstream timeouts (seconds): connect, wait for response headers / whole
    # non-streamed body, and the longest silence allowed between two stream chunks.
    upstream_connect_timeout_s: float = Field(2.0, gt=0)
    upstream_timeout_s: float = Field(300.0, gt=0)
    upstream_stream_idle_timeout_s: float = Field(60.0, gt=0)
    upstream_max_connections: int = Field(256, ge=1, description="per replica")
    # Replicas (serving/upstream_balancer.py): how a request picks one, how often names are
    # resolved again and replicas probed, when one is taken out and for how long at most.
    upstream_balance: Literal["least_outstanding", "round_robin"] = "least_outstanding"
    upstream_resolve_s: float = Field(10.0, gt=0, description="re-resolve upstream names this often")
    upstream_health_interval_s: float = Field(5.0, ge=0.1, description="GET /health of each replica this often")
    upstream_eject_after: int = Field(3, ge=1, description="5xx answers, broken streams or answers not in time, in a "
                                      "row, that take a replica out")
    upstream_eject_max_s: float = Field(10.0, ge=1, description="the longest backoff before an ejected replica "
                                        "is probed again (it doubles from 1 s with each ejection in a row)")
    upstream_max_endpoints: int = Field(64, ge=1, le=1024, description="replicas per upstream at most (bounds "
                                        "the endpoint label)")
    # uvicorn's limit_concurrency, on every route: past this many open connections or requests
    # in progress, a 503 (an OpenAI error on the proxy routes). None: no limit.
    limit_concurrency: int | None = Field(None, ge=1)
    upstream_api_key: SecretStr | None = Field(None, description="sent to vLLM if it runs with --api-key")
    models_refresh_s: float = Field(30.0, gt=0, description="how often /v1/models is re-read upstream")

    # Auth: empty means open. Comma-separated in the environment.
    api_keys: Annotated[list[SecretStr], NoDecode] = Field(default_factory=list)
    # With keys: a request without a valid key (none, or one the gateway does not have) is served
    # as tenant anonymous instead of refused. Keys then name tenants and do not guard the gateway:
    # for a local stack, or a fleet moving its clients onto keys (the openai client always sends one).
    allow_anonymous: bool = Field(False, description="with API keys, serve requests without a valid one as "
                                                      "tenant anonymous instead of refusing them (401)")
    # Admission control: a YAML file of per-key and per-model limits, tenants and their budgets
    # (serving/admission.py, serving/tenants.py), re-read when it changes. None: no limits
    # beyond max_tokens_limit, no tenants.
    limits_file: Path | None = None
    # inferwatch.yaml: its SLOs are the objectives goodput is judged by (serving/goodput.py).
    # None: their defaults, which the committed rules hold too.
    config_file: Path | None = Field(None, description="inferwatch.yaml, whose SLOs goodput is judged by")

    # A/B: a YAML file of experiments (serving/split.py); None routes every model to
    # upstream_url as the one variant above. Sticky assignment reads the request's `user`,
    # else this header, else the API key's id.
    experiment_file: Path | None = None
    unit_header: str = Field("x-inferwatch-unit", min_length=1, pattern=r"^[A-Za-z0-9-]+$")
    admin_token: SecretStr | None = Field(None, description="bearer token of /admin/*, and of forcing a variant "
                                          "(x-inferwatch-admin-token); none disables both")
    # A variant rolled back to weight 0 is usually broken: forcing it is refused (409) unless
    # this is on, for smoke-testing a canary before it takes any traffic.
    force_zero_weight: bool = False
    feedback_memory: int = Field(100_000, ge=0, description="answers remembered for feedback; 0: no feedback")
    feedback_ttl_s: float = Field(86_400.0, gt=0, description="how long an answer can be rated")

    # Tracing: no endpoint means no export (and no span recording).
    otlp_endpoint: str | None = None
    otlp_protocol: str = Field("http/protobuf", pattern=r"^(http/protobuf|grpc)$")
    trace_sample_ratio: float = Field(1.0, ge=0.0, le=1.0)
    service_name: str = "inferwatch-gateway"

    # Feature records for the drift service.
    capture_logprobs: bool = Field(False, description="ask upstream for logprobs to record confidence")
    feature_queue_size: int = Field(10_000, ge=1)
    feature_batch_size: int = Field(500, ge=1)
    feature_flush_s: float = Field(1.0, gt=0)
    drift_url: str | None = Field(None, description="drift service base URL; records are sent to its ingest")
    # A drift pair (or more): every record and rating goes to each, through a queue of its own
    # (drift_url, if set too, is one of them). Comma-separated in the environment.
    drift_urls: Annotated[list[str], NoDecode] = Field(default_factory=list, max_length=8)
    drift_token: SecretStr | None = None

    # Shared state (serving/shared_state.py): with a Redis URL, replicas behind one load
    # balancer share experiment weights, the answers remembered for feedback and admission
    # limits. None: all of it in this process (one gateway).
    redis_url: SecretStr | None = Field(None, description="redis://[:password@]host:port/db or rediss://...")
    redis_key_prefix: str = Field("inferwatch", min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.:-]+$",
                                  description="keys are <prefix>:...; two fleets may share a Redis")
    # The longest a request waits on Redis (a lease of admission allowance, a rating's
    # lookup); past it the gateway goes on without it. Background syncing waits longer.
    redis_timeout_s: float = Field(0.005, gt=0, le=5)

    @field_validator("api_keys", mode="before")
    @classmethod
    def _split_keys(cls, value: object) -> object:
        if isinstance(value, str):
            keys = [k.strip() for k in value.replace("\n", ",").split(",") if k.strip()]
            if not keys:  # "," would otherwise mean no key at all: an open gateway
                raise ValueError("holds no API key, only separators: leave it unset for an open gateway")
            return keys
        return value

    @field_validator("redis_url")
    @classmethod
    def _redis_url(cls, value: SecretStr | None) -> SecretStr | None:
        if value is not None:
            check_redis_url(value.get_secret_value())
        return value

    @field_validator("upstream_url", mode="before")
    @classmethod
    def _upstreams(cls, value: object) -> str:
        return normalize_upstream(value)

    @field_validator("drift_url")
    @classmethod
    def _strip_slash(cls, value: str | None) -> str | None:
        if value is None:
            return None
        if not value.startswith(("http://", "https://")):
            raise ValueError("must start with http:// or https://")
        return value.rstrip("/")

    @field_validator("drift_urls", mode="before")
    @classmethod
    def _split_urls(cls, value: object) -> object:
        if isinstance(value, str):
            value = [u.strip() for u in value.split(",") if u.strip()]
        if isinstance(value, list):
            for u in value:
                if not isinstance(u, str) or not u.startswith(("http://", "https://")) or any(c.isspace() for c in u) \
                        or not urlsplit(u).hostname:
                    raise ValueError(f"each drift URL must be http(s)://host[:port], separated by commas; got "
                                     f"{str(u)[:100]!r}")
            if len({u.rstrip("/") for u in value}) != len(value):
                raise ValueError("a drift URL is listed twice: each replica would get every record twice")
            return [u.rstrip("/") for u in value]
        return value

    @model_validator(mode="after")
    def _workers_share_state(self) -> GatewaySettings:
        if self.workers > 1 and self.redis_url is None:
            raise ValueError(f"workers={self.workers} needs redis_url: each worker is a replica, and without shared "
                             "state each would allow every limit in full, keep its own experiment weights and know "
                             "only the answers it gave for feedback. Start a Redis and set "
                             "INFERWATCH_GATEWAY_REDIS_URL (or --redis-url), or run one worker.")
        return self

    @property
    def drift_destinations(self) -> list[str]:
        """Every drift service that gets each record and rating."""
        urls = list(self.drift_urls)
        if self.drift_url and self.drift_url not in urls:
            urls.insert(0, self.drift_url)
        return urls
