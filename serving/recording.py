"""What the gateway records of each proxied request, written once, when the request ends:
RED and token-level metrics, the feature record for the drift service, the answer
remembered for feedback, and the server span's attributes and end.

Recording once at the end (not per phase) keeps the per-request cost to a few metric
updates; the label children of each (model, variant, route) are looked up once and cached
(``RouteSeries``).
"""

from __future__ import annotations

import time
from collections.abc import Mapping

from inferwatch.drift.feature_record import FeatureRecord
from inferwatch.drift.sampling_params import sampling_bins
from inferwatch.serving.adapter_metrics import AdapterSeries
from inferwatch.serving.errors import CLIENT_CLOSED, status_class
from inferwatch.serving.features import FeatureFanout, FeatureQueue
from inferwatch.serving.feedback import AnswerMemory
from inferwatch.serving.genai_metrics import GenAIMetrics
from inferwatch.serving.goodput import Goodput
from inferwatch.serving.metrics import ABNORMAL_KINDS, GatewayMetrics, RouteSeries, observe_many
from inferwatch.serving.output_quality import assess
from inferwatch.serving.request import RequestState
from inferwatch.serving.signals import RECORDED
from inferwatch.serving.sse import StreamAccount
from inferwatch.serving.tenant_metrics import TenantSeries
from inferwatch.serving.tracing import OPERATION, end_span, exemplar, response_attributes
from inferwatch.serving.validation import ROUTE_PATHS, ModelInfo

NOTHING_READ = {field: None for field, _ in RECORDED}  # a request that never reached vLLM


class Recorder:
    def __init__(self, metrics: GatewayMetrics, features: FeatureQueue | FeatureFanout | None,
                 answers: AnswerMemory | None, goodput: Goodput, genai: GenAIMetrics | None = None) -> None:
        self.metrics, self.features, self.answers, self.goodput = metrics, features, answers, goodput
        self.genai = genai  # OpenTelemetry's GenAI metrics, when opted in (serving/genai_metrics.py)
        self._route_series: dict[tuple[str, str, str], RouteSeries] = {}
        self._tenant_series: dict[tuple[str, str], TenantSeries] = {}
        self._adapter_series: dict[tuple[str, str], AdapterSeries] = {}

    def series(self, model: str, variant: str, route: str) -> RouteSeries:
        series = self._route_series.get((model, variant, route))
        if series is None:
            series = self._route_series[(model, variant, route)] = RouteSeries(self.metrics, model, variant, route)
        return series

    def tenant_series(self, tenant: str, model: str) -> TenantSeries:
        series = self._tenant_series.get((tenant, model))
        if series is None:
            series = self._tenant_series[(tenant, model)] = TenantSeries(self.metrics.tenants, tenant, model)
        return series

    def adapter_series(self, model: str, adapter: str) -> AdapterSeries:
        series = self._adapter_series.get((model, adapter))
        if series is None:
            series = self._adapter_series[(model, adapter)] = AdapterSeries(self.metrics.adapters, model, adapter)
        return series

    def served(self, models: Mapping[str, ModelInfo], variant: str) -> None:
        """Models the gateway now serves: their request series exist from now on, at 0 (an
        adapter's are its base's)."""
        for model in {info.base for info in models.values()}:
            for route in ROUTE_PATHS.values():
                self.series(model, variant, route).answered_at_zero()

    def started(self, state: RequestState) -> None:
        """The request passed preprocessing: it is in flight until ``ended``."""
        self.series(state.base_model, state.variant, state.path).in_flight.inc()

    def ended(self, state: RequestState, status: int, account: StreamAccount | None, error: str | None) -> None:
        self.series(state.base_model, state.variant, state.path).in_flight.dec()
        self.finish(state, status, account, error=error)

    def rejected(self, path: str, code: str) -> None:
        self.metrics.rejected.labels(path, code).inc()

    def upstream_error(self, state: RequestState, reason: str, cause: BaseException | None = None) -> None:
        self.metrics.upstream_errors.labels(state.base_model, state.variant, reason).inc()
        if reason == "connect":
            state.upstream.unreachable(cause)

    def finish(self, state: RequestState, status: int, account: StreamAccount | None, *, error: str | None) -> None:
        """Record the request once: metrics, feature record, span attributes and end."""
        e2e = time.perf_counter() - state.started
        variant, span = state.variant, state.span
        ex = exemplar(span)
        series = self.series(state.base_model, variant, state.path)
        adapter = self.adapter_series(state.base_model, state.model) if state.model != state.base_model else None
        requests, duration = series.answered(status_class(status))
        requests.inc()
        duration.observe(e2e, ex)
        ok = account is not None and status < 400
        quality = None
        # an echoed prompt comes back as the answer's start: judging it would judge the prompt
        if account is not None and ok and account.finish_reasons and state.req is not None and state.req.n == 1 and \
                not state.req.payload.get("echo"):
            quality = assess(account.units, account.text_seen, account.finish_reasons[0], account.completion_tokens,
                             account.tool_called)
            for kind in ABNORMAL_KINDS:
                if getattr(quality, kind):
                    series.abnormal(kind)
        if account is not None and ok:
            for signal, child in series.signals:
                value = signal.read(account, quality)
                if value is None:
                    continue
                if signal.per_token:
                    observe_many(child, value)
                elif signal.exemplar:
                    child.observe(value, ex)
                else:
                    child.observe(value)
        bins = None
        if state.req is not None:
            req = state.req
            bins = sampling_bins(req.payload, stream=req.stream, default_max_tokens=req.default_max_tokens)
            series.sampled(bins)
        tenant = self.tenant_series(state.tenant, state.base_model)
        tenant.answered(status_class(status)).inc()
        if adapter is not None:
            adapter.answered(status_class(status)).inc()
        tenant.duration.observe(e2e)
        output = None
        if account is not None and (ok or status == CLIENT_CLOSED):
            # what vLLM spent, as its own counters count it: the prompt once per choice, and
            # for an abandoned stream the tokens relayed before the client left
            if account.prompt_tokens is not None:
                n = state.req.n if state.req else 1
                series.input_tokens.inc(account.prompt_tokens * n)
                tenant.input_tokens.inc(account.prompt_tokens * n)
                if adapter is not None:
                    adapter.input_tokens.inc(account.prompt_tokens * n)
                if account.cached_tokens:
                    tenant.cached_tokens.inc(account.cached_tokens)
            output = account.completion_tokens if account.completion_tokens is not None else (
                account.token_events if status == CLIENT_CLOSED else None)
            if output:
                series.output_tokens.inc(output)
                tenant.output_tokens.inc(output)
                if adapter is not None:
                    adapter.output_tokens.inc(output)
        if account is not None and ok:
            ttft = account.ttft
            if ttft is not None:
                tenant.ttft.observe(ttft)
            if self.goodput.objectives(state.base_model).met(status, ttft, account.tpot(), e2e):
                tenant.good.inc()
                if adapter is not None:
                    adapter.good.inc()
                if output:
                    tenant.good_tokens.inc(output)
        # forced requests are test traffic, not assignments: a record would count them in the
        # A/B arms (read per model and variant) and in drift's windows
        a = state.assignment
        if self.features is not None and state.req is not None and bins is not None and not state.forced:
            values = {field: read(account, quality) for field, read in RECORDED} if account else NOTHING_READ
            self.features.submit(FeatureRecord(
                model=state.model, variant=variant, route=state.route, stream=state.req.stream,
                started_at=state.started_at, finished_at=state.started_at + e2e, status=status, e2e_s=e2e,
                temperature_bin=bins.temperature, top_p_bin=bins.top_p, max_tokens_bin=bins.max_tokens,
                n_bin=bins.n, tools=bins.tools == "true", response_format=bins.response_format,
                experiment=a.experiment if a else None, unit=a.unit if a else None,
                epoch=a.epoch if a else None, weight=a.weight if a else None, **values,
            ))
        if state.response_id is not None and status < 400 and self.answers is not None and not state.forced:
            self.answers.remember(state.response_id, state.model, variant, a)
        if self.genai is not None and state.req is not None:
            self._genai(state, status, account, e2e, output)
        if span.is_recording():
            span.set_attribute("http.response.status_code", status)
            if account is not None:
                span.set_attributes(response_attributes(account, state.response_id,
                                                        state.response_model if status < 400 else None))
        end_span(span, error if status >= 500 or status == CLIENT_CLOSED else None)

    def _genai(self, state: RequestState, status: int, account: StreamAccount | None, e2e: float,
               output: int | None) -> None:
        """The request in OpenTelemetry's GenAI metrics: what vLLM's usage says it used."""
        assert self.genai is not None and state.req is not None
        answered = account if account is not None and status < 400 else None
        upstream = None
        if state.sent is not None:
            address, port, sent = state.sent
            upstream = (address, port, state.started + e2e - sent)
        self.genai.record(
            operation=OPERATION[state.req.route], model=state.model, status=status, e2e_s=e2e, upstream=upstream,
            response_model=state.response_model if answered else None,
            ttft_s=answered.ttft if answered else None, tpot_s=answered.tpot() if answered else None,
            input_tokens=answered.prompt_tokens if answered else None, output_tokens=output if answered else None)
