"""What inferwatch alerts on: SLOs, burn-rate tiers and alerts, built from the settings.

``build`` turns a team's settings (``inferwatch.yaml``, ``inferwatch.config``) into the
:class:`Spec` every generator reads: the rules, and the dashboards, which draw their
threshold lines and write their descriptions from it, so a panel cannot disagree with the
alert it explains. What a team may change lives in the settings; what is here is how the
stack works (job names, XID classes, the expressions). Every metric is named through
``inferwatch.alerts.catalog.metric``, so a name that no component exports fails the generation.
Each alert has a runbook in ``alerts/runbooks/<name>.md``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from functools import partial

from prometheus_client.utils import floatToGoString

from inferwatch.alerts import clusters, stragglers
from inferwatch.alerts.catalog import metric as m
from inferwatch.alerts.model import SLO, Alert, BurnTier, BurnWindow, Guard, Record
from inferwatch.common.durations import seconds
from inferwatch.config import settings as config
from inferwatch.config.errors import ConfigError
from inferwatch.config.settings import Settings, Thresholds
from inferwatch.dashboards import uids
from inferwatch.drift.ab.spec import PAGE_SHARE, PAGING
from inferwatch.exporters.metrics import THROTTLE_REASONS as EXPORTED_REASONS
from inferwatch.exporters.xid_catalog import ACTIONS, LOOK_UP, XID_ACTIONS, XidAction, codes_of

# Scrape jobs, shared with the Prometheus configuration (deploy/), so rules and targets agree.
JOB_GATEWAY = "inferwatch-gateway"
JOB_VLLM = "vllm"
JOB_EXPORTER = "inferwatch-exporter"
JOB_DRIFT = "inferwatch-drift"
JOB_SUPERVISOR = "inferwatch-supervisor"
JOB_ALERTMANAGER = "alertmanager"

# Clock-event reasons that hold a busy GPU's clocks down when they should not: heat, power
# faults, clocks set low by hand (applications clocks), a board or reliability limit, sync
# boost tying it to a slower GPU. gpu_idle is no fault; sw_power_cap under full load is the
# GPU working as designed, and only informs (GPUPowerCapped).
THROTTLE_REASONS = tuple(r for r in EXPORTED_REASONS.values() if r not in ("gpu_idle", "sw_power_cap"))
NVLINK_ERRORS = "crc_flit|crc_data|replay|recovery"
VLLM_DOWN_WINDOW = "1m"
VLLM_DOWN_FAILED_SCRAPES = 2


def _le(threshold: float) -> str:
    """The ``le`` label value of a bucket boundary, as prometheus_client writes it."""
    return str(floatToGoString(threshold))  # type: ignore[no-untyped-call]  # prometheus_client.utils is unannotated


_REQUESTS = m("inferwatch_gateway_requests_total")
_TTFT = "inferwatch_gateway_time_to_first_token_seconds"
_E2E = "inferwatch_gateway_request_duration_seconds"
_ITL = "inferwatch_gateway_inter_token_latency_seconds"


def model_regex(models: tuple[str, ...]) -> str:
    """An RE2 alternation of exactly ``models``, escaped for a PromQL double-quoted string."""
    return "|".join(re.sub(r"([.+*?()\[\]{}^$|\\])", r"\\\\\1", name) for name in models)


def _selector(name: str, *matchers: str) -> str:
    present = [x for x in matchers if x]
    return f"{name}{{{','.join(present)}}}" if present else name


def slo(declared: config.SLO, models: tuple[str, ...] | None, floors: config.BurnRate) -> SLO:
    """One objective as the rules compute it, over ``models`` (None: every model). Its events
    are requests, except inter-token latency's, which are token gaps: on a quiet model one
    stuttering stream can meet its floors alone."""
    sel = f'model=~"{model_regex(models)}"' if models is not None else ""
    make = partial(SLO, period=declared.period, min_events=floors.min_events, min_bad_events=floors.min_bad_events)
    if declared.sli == "availability":
        return make(declared.name, "requests answered without a server error", declared.objective,
                    total=_selector(_REQUESTS, sel), errors=_selector(_REQUESTS, 'status_class="5xx"', sel))
    t = declared.threshold_s
    if t is None:
        raise ConfigError(("slos", declared.name, "threshold_s"), f"a {declared.sli} objective needs threshold_s")
    if declared.sli == "ttft":
        return make(declared.name, f"first token within {t:g}s", declared.objective,
                    total=_selector(m(f"{_TTFT}_count"), sel),
                    good=_selector(m(f"{_TTFT}_bucket"), f'le="{_le(t)}"', sel))
    if declared.sli == "e2e_latency":
        return make(declared.name, f"successful requests complete within {t:g}s", declared.objective,
                    total=_selector(m(f"{_E2E}_count"), 'status_class="2xx"', sel),
                    good=_selector(m(f"{_E2E}_bucket"), 'status_class="2xx"', f'le="{_le(t)}"', sel))
    return make(declared.name, f"gaps between streamed tokens within {t:g}s", declared.objective,
                total=_selector(m(f"{_ITL}_count"), sel), good=_selector(m(f"{_ITL}_bucket"), sel, f'le="{_le(t)}"'))


def tier(declared: config.BurnTier) -> BurnTier:
    return BurnTier(declared.name, declared.severity,
                    tuple(BurnWindow(w.long, w.short, w.budget_share) for w in declared.windows),
                    declared.keep_firing_for)


_XID = m("inferwatch_gpu_xid_errors_total")
_VLLM_UP = f'up{{job="{JOB_VLLM}"}}'
_ECC = m("inferwatch_gpu_ecc_errors_total")
_NVLINK = f'{m("inferwatch_gpu_nvlink_errors_total")}{{type=~"{NVLINK_ERRORS}"}}'


def _increased(selector: str, window: str) -> str:
    """A counter that rose within ``window``, including a series that first appeared with
    a non-zero value (``increase`` needs two samples and would miss the first XID)."""
    return f"(increase({selector}[{window}]) > 0) or ({selector} > 0 unless {selector} offset {window})"


def _address(expr: str, source: str, regex: str) -> str:
    """The same expression with ``address`` (a vLLM server's host:port) taken from ``source``."""
    return f'label_replace({expr}, "address", "$1", "{source}", "{regex}")'


def _vllm_service(expr: str, source: str, regex: str) -> str:
    """The same expression with ``vllm_service`` (the Kubernetes Service in front of a vLLM)
    taken from ``source``; not ``service``, which the Prometheus Operator sets on every target."""
    return f'label_replace({expr}, "vllm_service", "$1", "{source}", "{regex}")'


# The model each vLLM target serves, remembered for as long as the target is configured: a
# down vLLM exports nothing, and an alert that looked its model up over a lookback would
# lose the label (and with it its identity and its inhibitions) once the lookback passed.
# It carries itself forward while the target answers no scrape; a target removed from
# discovery has no `up` and is forgotten; a target that serves a new model is re-mapped.
# vLLM's own series win over a target's `model` label, so one target maps to one model.
SERVED_MODEL = "inferwatch:vllm_served_model:info"
# goodput over throughput: requests within every objective of their model together (serving/goodput.py)
TENANT_GOODPUT = "inferwatch_tenant:goodput_requests:ratio_rate5m"  # {tenant, model}
MODEL_GOODPUT = "inferwatch_model:goodput_requests:ratio_rate5m"  # {model}
_GOOD = m("inferwatch_gateway_goodput_requests_total")
_TENANT_REQUESTS = m("inferwatch_gateway_tenant_requests_total")
MODEL_UNAVAILABLE = "inferwatch:vllm_model_unavailable:info"
_SERVING_NOW = f'group by (job, instance, model) ({m("vllm:num_requests_running")})'
# a target discovered with its model as a label (`inferwatch up`, a labelled target file) is
# known from Prometheus's first scrape, before vLLM has served
_LABELLED = f'group by (job, instance, model) (up{{job="{JOB_VLLM}",model!=""}})'
RECORDS = (
    Record(SERVED_MODEL,
           f"{_SERVING_NOW}\nor ({_LABELLED} unless on (job, instance) {_SERVING_NOW})\nor (\n"
           f"  last_over_time({SERVED_MODEL}[1h])\n"
           f"  unless on (job, instance) ({_SERVING_NOW} or {_LABELLED})\n"
           f"  and on (job, instance) {_VLLM_UP}\n)"),
    Record(TENANT_GOODPUT, f"sum by (tenant, model) (rate({_GOOD}[5m]))\n"
                           f"/ sum by (tenant, model) (rate({_TENANT_REQUESTS}[5m]) > 0)"),
    Record(MODEL_GOODPUT, f"sum by (model) (rate({_GOOD}[5m]))\n/ sum by (model) (rate({_TENANT_REQUESTS}[5m]) > 0)"),
    # models none of whose vLLM replicas is serving: each failed VLLMDown's count of scrapes
    # (one missed scrape of a busy vLLM must not hold its model's SLO pages back)
    Record(MODEL_UNAVAILABLE,
           f"group by (model) ({SERVED_MODEL})\n"
           f"unless on (model) ({SERVED_MODEL} and on (job, instance) ("
           f"count_over_time({_VLLM_UP}[{VLLM_DOWN_WINDOW}]) - sum_over_time({_VLLM_UP}[{VLLM_DOWN_WINDOW}])"
           f" < {VLLM_DOWN_FAILED_SCRAPES}))"),
)


def _with_served_model(down: str) -> str:
    """``down`` (per vLLM target) labelled with the model that target serves (``SERVED_MODEL``):
    a target discovered without a ``model`` label (compose, Kubernetes) still names its model,
    which the inhibition of that model's pages matches on. A target that never served keeps
    its own labels."""
    return (f"({down}) * on (job, instance) group_left (model) {SERVED_MODEL}"
            f" or (({down}) unless on (job, instance) {SERVED_MODEL})")


GPU = "GPU {{ $labels.gpu }} ({{ $labels.uuid }}) on {{ $labels.instance }}"
# Each gateway replica reports the fleet's spend as it last learned it (serving/budgets.py): the largest is the latest.
_BUDGET_LIMIT = "inferwatch_gateway_tenant_budget_limit"
_BUDGET_SPENT = (f'max by (tenant, unit, period) ({m("inferwatch_gateway_tenant_budget_used")})\n'
                 f'/ max by (tenant, unit, period) ({m(_BUDGET_LIMIT)})')

# One XID alert per action of NVIDIA's catalog (exporters/xid_catalog.py): a page for those that
# take the GPU or node out of service, a ticket for the rest, its action a label and the
# description's instruction. Codes the catalog lists nowhere are a ticket of their own.
_XID_NAMES = {"critical": "GPUFatalXID", "warning": "GPUXIDError", "info": "GPUXIDError"}


def _xid_alert(action: XidAction, xid_matcher: str) -> Alert:
    return Alert(_XID_NAMES[action.severity], _increased(f"{_XID}{{{xid_matcher}}}", "10m"), action.severity,
                 dashboard=uids.GPUS, labels={"action": action.name},
                 summary=f"XID {{{{ $labels.xid }}}} on {GPU}: {action.title}",
                 description=f"{GPU} reported XID {{{{ $labels.xid }}}}. What to do, after NVIDIA's XID catalog: "
                             f"{action.todo}.")


def _xid_alerts(severity: str) -> tuple[Alert, ...]:
    chosen = tuple(_xid_alert(a, f'xid=~"{"|".join(map(str, codes_of(a.name)))}"')
                   for a in ACTIONS.values() if a.severity == severity)
    if LOOK_UP.severity == severity:
        chosen += (_xid_alert(LOOK_UP, f'xid!~"{"|".join(map(str, sorted(XID_ACTIONS)))}"'),)
    return chosen


def _alerts(t: Thresholds, outage_shadow: str) -> tuple[Alert, ...]:
    """Every alert that is not an SLO burn, with the thresholds of ``t``."""
    return (
        # -- page: users are hurting now, or the hardware under them is broken -----------------------
        # Two failed scrapes within a minute, not `up == 0` for a while: a supervised restart can
        # bring vLLM back (30 s for the tiny CPU model) before any `for` would have passed, yet every
        # request failed meanwhile. One failed scrape alone pages nobody; the page resolves once a
        # minute has passed without a failure. The failures count only after vLLM has served (in the
        # startup grace before that minute, or within it while it is down now, for a Prometheus
        # younger than a minute): a vLLM loading its model (minutes for a large one) pages
        # only once it has answered no scrape for the whole grace, as a target Prometheus has known
        # that long. Past the grace that second branch carries a long outage on without a gap.
        Alert("VLLMDown", _with_served_model(
              f'(count_over_time({_VLLM_UP}[{VLLM_DOWN_WINDOW}]) - sum_over_time({_VLLM_UP}[{VLLM_DOWN_WINDOW}])'
              f' >= {VLLM_DOWN_FAILED_SCRAPES}'
              f' and (max_over_time({_VLLM_UP}[{t.vllm_startup_grace}] offset {VLLM_DOWN_WINDOW}) == 1'
              f' or {_VLLM_UP} == 0 and max_over_time({_VLLM_UP}[{VLLM_DOWN_WINDOW}]) == 1))'
              f' or (max_over_time({_VLLM_UP}[{t.vllm_startup_grace}]) == 0 and {_VLLM_UP} offset {t.vllm_startup_grace})'),
              "critical", dashboard=uids.SERVING,
              summary="vLLM {{ $labels.instance }} is down",
              description="Prometheus cannot scrape vLLM at {{ $labels.instance }} (model {{ $labels.model }}): "
                          f"it failed {VLLM_DOWN_FAILED_SCRAPES} or more scrapes in {VLLM_DOWN_WINDOW} after serving, "
                          f"or has answered none for {t.vllm_startup_grace} (a start that never became ready). Every "
                          "request routed to it fails while it is down."),
        Alert("GatewayDown", f'up{{job="{JOB_GATEWAY}"}} == 0', "critical", for_="1m", dashboard=uids.SERVING,
              summary="inferwatch gateway {{ $labels.instance }} is down",
              description="Prometheus cannot scrape the gateway at {{ $labels.instance }}: clients cannot reach "
                          "the model through it."),
        # Only while Prometheus reaches that vLLM itself: a dead vLLM is VLLMDown's page, and the
        # gateway re-probes within seconds once it returns, well inside `for`. An upstream of
        # several replicas (a comma list) stands on its first: upstream_up is 0 only when none
        # answers, and a fleet whose first replica is down too is VLLMDown's.
        # vLLM down is VLLMDown's page. Prometheus names a vLLM by its address where it scrapes
        # the address the gateway uses (compose, `inferwatch up`) and by its Service where it
        # scrapes pods behind the Service the gateway resolves (Kubernetes).
        # An upstream that no variant sends traffic to (a rolled-back canary, the demo's slow canary
        # at rest) pages nobody while it is down: its vLLM may be gone on purpose.
        Alert("GatewayUpstreamDown",
              _vllm_service(_address(f'({m("inferwatch_gateway_upstream_up")} == 0 unless on (instance, upstream) '
                                     f'{m("inferwatch_gateway_upstream_weight_ratio")} == 0)',
                                     "upstream", "https?://([^/,]+).*"),
                            "upstream", "https?://([^/:.,]+).*")
              + "\nunless on (address) " + _address(f'up{{job="{JOB_VLLM}"}} == 0', "instance", "(.+)")
              + "\nunless on (vllm_service) " + _vllm_service(f'up{{job="{JOB_VLLM}"}} == 0', "service", "(.+)"),
              "critical", for_="1m",
              dashboard=uids.SERVING,
              summary="Gateway {{ $labels.instance }} cannot reach vLLM at {{ $labels.upstream }}",
              description="The gateway's probe of {{ $labels.upstream }} has failed for 1m while vLLM itself "
                          "answers Prometheus: the path from {{ $labels.instance }} to it is broken (network, DNS, "
                          "TLS, API key), and requests through that gateway are answered 503/504."),
        # One replica of several out while the others serve: requests avoid it, so nothing burns,
        # but the variant runs short of capacity. All replicas out is GatewayUpstreamDown's page.
        Alert("GatewayUpstreamReplicaOut",
              f'max by (upstream, endpoint) ({m("inferwatch_gateway_upstream_endpoint_up")}) == 0'
              f' unless on (upstream) max by (upstream) ({m("inferwatch_gateway_upstream_up")}) == 0',
              "warning", for_="10m", dashboard=uids.SERVING,
              summary="vLLM replica {{ $labels.endpoint }} is out of rotation",
              description="Every gateway has kept the replica {{ $labels.endpoint }} of {{ $labels.upstream }} out of "
                          "rotation for 10m (refused connects, 5xx in a row or a failing /health): the other replicas "
                          "carry its share."),
        # changes(), not increase(): a restart count is small and exact, and extrapolation would
        # turn 2 restarts into 2.01.
        Alert("InferwatchCrashLooping", f'changes({m("inferwatch_supervisor_restarts_total")}[15m]) >= 3',
              "critical", dashboard=uids.SERVING,
              summary="{{ $labels.child }} keeps crashing ({{ $value }} restarts in 15m)",
              description="The supervisor on {{ $labels.instance }} restarted {{ $labels.child }} "
                          "{{ $value }} times in 15 minutes; it is crashing on start or soon after."),
        Alert("TenantBudgetSpent", f'{_BUDGET_SPENT}\n>= 1 and on (tenant, unit, period) '
                                   f'{_BUDGET_LIMIT}{{critical="true"}}',
              "critical", dashboard=uids.TENANTS,
              summary="Critical tenant {{ $labels.tenant }} has spent its budget: its requests are refused",
              description="Tenant {{ $labels.tenant }}, marked critical, has spent all of its {{ $labels.unit }} "
                          "budget for this {{ $labels.period }} (UTC): the gateways answer its requests 429 "
                          "(insufficient_quota) until the period resets. Raise the budget in the limits file (it "
                          "applies within a second) or tell the team."),
        *_xid_alerts("critical"),
        Alert("GPUDeviceFailed", f'{m("inferwatch_gpu_device_failed")} == 1', "critical", for_="1m",
              dashboard=uids.GPUS,
              summary=f"{GPU} does not answer NVML",
              description=f"{GPU} fails NVML queries (lost, fallen off the bus or unknown error) for 1m."),
        Alert("GPUUncorrectableECC", _increased(f'{_ECC}{{type="uncorrected",scope="volatile"}}', "10m"), "critical",
              dashboard=uids.GPUS,
              summary=f"Uncorrectable ECC errors on {GPU}",
              description=f"{GPU} had uncorrectable memory errors: results may be corrupt. Drain the node."),
        Alert("GPURowRemapFailure", f'{m("inferwatch_gpu_row_remap_failure")} == 1', "critical",
              dashboard=uids.GPUS,
              summary=f"Row remapping failed on {GPU}",
              description=f"{GPU} could not remap a failing memory row: it needs service (RMA)."),
        # A canary worse on errors or time to first token while it takes a real share of traffic:
        # users are hurting now. The verdict is sequential (always-valid, Holm across guardrails),
        # so one evaluation is evidence; `for` only rides out a scrape of a window in flux. The
        # share is the gateway's live weight, not the window's share of records: the window keeps
        # the canary's records (and its "worse") for an hour after a rollback, the weight drops to
        # 0 at once, so a rollback clears the page.
        Alert("ABCanaryHurtingUsers",
              f'max by (model, control, treatment, metric) ({m("inferwatch_ab_guardrail_worse")}'
              f'{{metric=~"{"|".join(PAGING)}"}}) == 1'
              f' and on (model, treatment) max by (model, treatment) (label_replace('
              f'{m("inferwatch_gateway_experiment_weight_ratio")}, "treatment", "$1", "variant", "(.*)"))'
              f' > {PAGE_SHARE:g}',
              "critical", for_="2m", dashboard=uids.DRIFT,
              summary="Canary {{ $labels.treatment }} of {{ $labels.model }} is worse on {{ $labels.metric }}",
              description="Variant {{ $labels.treatment }} of model {{ $labels.model }} is significantly worse than "
                          "{{ $labels.control }} on {{ $labels.metric }} while it takes over "
                          f"{PAGE_SHARE:.0%} of the traffic: roll it back (send all traffic to the control)."),
        # -- ticket: will hurt soon, or needs a look this week ---------------------------------------
        Alert("ABCanaryWorse",
              f'max by (model, control, treatment, metric) ({m("inferwatch_ab_guardrail_worse")}) == 1',
              "warning", for_="5m", dashboard=uids.DRIFT,
              summary="Canary {{ $labels.treatment }} of {{ $labels.model }} is worse on {{ $labels.metric }}",
              description="The A/B verdict finds variant {{ $labels.treatment }} of model {{ $labels.model }} "
                          "worse than {{ $labels.control }} on {{ $labels.metric }} (always-valid p-value, Holm "
                          "across guardrails) for 5m: look at GET /v1/ab/{{ $labels.model }} and roll back."),
        Alert("DriftDetected",
              f'max by (model, variant, feature) ({m("inferwatch_drift_feature_detected")} == 1)'
              f' and on (model, variant) {m("inferwatch_drift_window_records")} >= {t.drift_min_window_records}',
              "warning", for_=t.drift_for, dashboard=uids.DRIFT,
              summary="Drift in {{ $labels.feature }} of {{ $labels.model }}/{{ $labels.variant }}",
              description="{{ $labels.feature }} of model {{ $labels.model }} variant {{ $labels.variant }} has "
                          f"differed from its baseline for {t.drift_for}: the segment's verdict (calibrated p-values, "
                          "Holm across its features) holds its false-alarm rate at the drift service's alpha per "
                          "evaluation."),
        Alert("VLLMKVCacheSaturated",
              f'max by (model, instance) ({m("vllm:kv_cache_usage_perc")}) > {t.kv_cache_high}'
              f' and on (model, instance) sum by (model, instance) ({m("vllm:num_requests_waiting")}) > 0',
              "warning", for_="10m", dashboard=uids.SERVING,
              summary="vLLM {{ $labels.instance }} KV cache is {{ $value | humanizePercentage }} full with requests waiting",
              description="Model {{ $labels.model }} on {{ $labels.instance }} has used over "
                          f"{t.kv_cache_high:.0%} of its KV cache for 10m while requests queue: time to first token "
                          "grows. Add replicas or lower max_num_seqs / max_model_len."),
        # Requests queue although the KV cache has room: the scheduler's own limits (max_num_seqs,
        # max_num_batched_tokens) or a replica too few, not memory. The queue never emptied for
        # 10m and is longer than 10m ago.
        Alert("VLLMQueueBuildingUp",
              f'min by (model, instance) (min_over_time({m("vllm:num_requests_waiting")}[{t.queue_window}])) > 0'
              f' and on (model, instance) sum by (model, instance) (delta({m("vllm:num_requests_waiting")}'
              f'[{t.queue_window}])) > 0'
              f' and on (model, instance) max by (model, instance) ({m("vllm:kv_cache_usage_perc")}) <= {t.kv_cache_high}',
              "warning", for_="5m", dashboard=uids.SERVING,
              summary="Requests queue up on vLLM {{ $labels.instance }} while its KV cache has room",
              description="Model {{ $labels.model }} on {{ $labels.instance }} has had requests waiting for "
                          f"{t.queue_window}, more now than {t.queue_window} ago, with its KV cache under "
                          f"{t.kv_cache_high:.0%}: the scheduler's limits (max_num_seqs, max_num_batched_tokens) or "
                          "the number of replicas hold requests back, not memory. Time to first token grows."),
        Alert("GPUThrottled",
              f'max by (instance, gpu, uuid, reason) ({m("inferwatch_gpu_throttle_active")}'
              f'{{reason=~"{"|".join(THROTTLE_REASONS)}"}}) == 1',
              "warning", for_="15m", dashboard=uids.GPUS,
              summary=f"{GPU} throttled: {{{{ $labels.reason }}}}",
              description=f"{GPU} has had its clocks held down by {{{{ $labels.reason }}}} for 15m."),
        # A link that degrades before it fails: recovery, CRC and replay counts that rise over
        # the last hour against the last day. A steady trickle (a few CRC errors a day) is the
        # link's normal, and never rises against itself.
        Alert("GPUNVLinkErrorsRising",
              f'increase({_NVLINK}[1h]) >= {t.nvlink_errors_per_hour}\n'
              f'and rate({_NVLINK}[1h]) > {t.nvlink_error_rise!r} * rate({_NVLINK}[1d])',
              "warning", dashboard=uids.GPUS,
              summary=f"NVLink {{{{ $labels.link }}}} {{{{ $labels.type }}}} errors rising on {GPU}",
              description=f"Link {{{{ $labels.link }}}} of {GPU} counted {{{{ $value | humanize }}}} "
                          f"{{{{ $labels.type }}}} errors in the last hour, over {t.nvlink_error_rise:g}x its rate "
                          "of the last day: the link is degrading, and may fail (XID 74) under load."),
        # The current generation drops on an idle GPU to save power; a busy one runs at its
        # maximum, so below it for 30m of work is a link that trained down (a bad riser or slot).
        Alert("GPUPCIeLinkDegraded",
              f'{m("inferwatch_gpu_pcie_link_generation")} < {m("inferwatch_gpu_pcie_link_generation_max")}\n'
              f'and {m("inferwatch_gpu_utilization_ratio")} >= {t.pcie_busy_utilization!r}',
              "warning", for_="30m", dashboard=uids.GPUS, labels={"link_property": "generation"},
              summary=f"{GPU} runs its PCIe link at generation {{{{ $value }}}}, below its maximum",
              description=f"{GPU} has run its PCIe link at generation {{{{ $value }}}}, below the highest it and its "
                          "slot support, for 30m while busy: host-to-GPU transfers (model loads, KV cache offload) "
                          "are slower. Reseat the GPU or its riser, or check the slot's BIOS setting."),
        Alert("GPUPCIeLinkDegraded",
              f'{m("inferwatch_gpu_pcie_link_width")} < {m("inferwatch_gpu_pcie_link_width_max")}',
              "warning", for_="30m", dashboard=uids.GPUS, labels={"link_property": "width"},
              summary=f"{GPU} runs its PCIe link on {{{{ $value }}}} lanes, below its maximum",
              description=f"{GPU} has used {{{{ $value }}}} PCIe lanes, fewer than it and its slot support, for 30m: "
                          "the link trained down (a bad riser, cable or slot). Reseat the GPU or its riser."),
        stragglers.alert(t),
        # The device plugin stops offering a GPU it finds unhealthy: pods that need one stay
        # Pending while NVML may still read it, so no other alert says capacity is gone
        Alert("GPUNotAllocatable", f'{m("inferwatch_gpu_allocatable")} == 0', "warning", for_="10m",
              dashboard=uids.GPUS,
              summary=f"{GPU} is not offered to pods",
              description=f"The kubelet has not been able to allocate {GPU} to a pod for 10m: its device plugin "
                          "reports it unhealthy. Its capacity is lost to the cluster; check the device plugin's log "
                          "and the GPU's XIDs."),
        # NVML calls take microseconds; a GPU whose calls take a second is often the one failing,
        # and a call that hangs stalls every GPU's readings (GPUExporterSnapshotStale) while the
        # scrape-time watchdog names the GPU and the query
        Alert("GPUNVMLSlow",
              f'{m("inferwatch_gpu_nvml_duration_seconds")} > {t.nvml_slow_s!r}\n'
              f'or max without (query) ({m("inferwatch_gpu_nvml_call_seconds")}) > {t.nvml_slow_s!r}',
              "warning", for_="5m", dashboard=uids.GPUS,
              summary=f"NVML calls on {GPU} take {{{{ $value | humanizeDuration }}}}",
              description=f"{GPU}'s NVML queries have taken {{{{ $value | humanizeDuration }}}} (a cycle's, or one "
                          f"call still running) for 5m, over {t.nvml_slow_s:g}s: the driver struggles to reach this GPU, "
                          "which is often the one about to fail (XID 79, 119). A hung call also stops every GPU's "
                          "readings on the host."),
        Alert("GPUCorrectableECCRising", f'increase({_ECC}{{type="corrected",scope="volatile"}}[1h]) > '
                                         f'{t.correctable_ecc_per_hour}',
              "warning", dashboard=uids.GPUS,
              summary=f"Correctable ECC errors rising on {GPU}",
              description=f"{GPU} corrected {{{{ $value | humanize }}}} memory errors in the last hour "
                          f"(threshold {t.correctable_ecc_per_hour}): its memory may be degrading."),
        *_xid_alerts("warning"),
        Alert("GatewayFeatureRecordsDropped",
              f'sum by (instance) (rate({m("inferwatch_gateway_feature_records_total")}'
              '{outcome=~"dropped_.*"}[10m])) > 0',
              "warning", for_="10m", dashboard=uids.DRIFT,
              summary="Gateway {{ $labels.instance }} drops feature records",
              description="{{ $value | humanize }} feature records/s are dropped on {{ $labels.instance }} "
                          "(queue full or drift service failing): drift runs on a partial sample."),
        # Replicas sharing weights through Redis agree within a second; routing by different
        # weights for minutes means one of them lost Redis (or runs another experiment file).
        Alert("GatewayReplicasDisagreeOnWeights",
              f'max by (model, experiment, variant) ({m("inferwatch_gateway_experiment_weight_ratio")})'
              f' - min by (model, experiment, variant) ({m("inferwatch_gateway_experiment_weight_ratio")}) > 0',
              "warning", for_="2m", dashboard=uids.SERVING,
              summary="Gateway replicas route {{ $labels.model }} by different weights",
              description="The replicas of the gateway give variant {{ $labels.variant }} of experiment "
                          "{{ $labels.experiment }} ({{ $labels.model }}) weights up to {{ $value }} "
                          "apart for 2m: sticky users flip between variants and the A/B sample ratio holds. A replica "
                          "has lost the shared state (Redis) or runs another experiment file."),
        Alert("GatewaySharedStateDown",
              f'{m("inferwatch_gateway_shared_state_up")} == 0',
              "warning", for_="5m", dashboard=uids.SERVING,
              summary="Gateway {{ $labels.instance }} cannot reach its shared state (Redis)",
              description="The gateway at {{ $labels.instance }} has had no answer from Redis for 5m. Requests are "
                          "served: it routes by the last weights it knew, enforces limits at its share of the fleet's, "
                          "and keeps feedback to its own answers; weight changes through it are refused (503)."),
        Alert("DriftIngestStalled",
              f'sum(rate({m("inferwatch_gateway_feature_records_total")}{{outcome="queued"}}[10m])) > 0'
              f' unless on () sum(rate({m("inferwatch_drift_ingested_records_total")}[10m])) > 0'
              f' and on () max(up{{job="{JOB_DRIFT}"}}) == 1',
              "warning", for_="10m", dashboard=uids.DRIFT,
              summary="The drift service ingests nothing while gateways queue feature records",
              description="Gateways queued feature records for 10m but the drift service accepted none: "
                          "drift scores are frozen."),
        Alert("NVMLDown",
              f'{m("inferwatch_nvml_up")} == 0'
              f' and on (instance, job) max_over_time({m("inferwatch_nvml_devices")}[1d]) > 0',
              "warning", for_="5m", dashboard=uids.GPUS,
              summary="NVML is down on {{ $labels.instance }}, which had GPUs",
              description="The exporter on {{ $labels.instance }} cannot talk to the NVIDIA driver although it "
                          "saw GPUs in the last day: GPU metrics and XID counting have stopped."),
        Alert("GPUExporterSnapshotStale",
              f'time() - {m("inferwatch_nvml_snapshot_timestamp_seconds")} > {t.snapshot_stale_s}',
              "warning", for_="5m", dashboard=uids.GPUS,
              summary="GPU metrics on {{ $labels.instance }} are {{ $value | humanizeDuration }} old",
              description="The exporter's NVML sampler on {{ $labels.instance }} has not produced a snapshot "
                          f"for over {t.snapshot_stale_s}s: it is stuck in a driver call."),
        Alert("InferwatchTargetDown",
              f'up{{job=~"{JOB_EXPORTER}|{JOB_DRIFT}|{JOB_SUPERVISOR}|{JOB_ALERTMANAGER}"}} == 0',
              "warning", for_="5m",
              summary="{{ $labels.job }} {{ $labels.instance }} is down",
              description="Prometheus has not scraped {{ $labels.job }} at {{ $labels.instance }} for 5m."),
        # One name for both tiers, so the page inhibits the tenant's ticket (routing.py)
        Alert("TenantBudgetSpent", f"{_BUDGET_SPENT}\n>= {t.tenant_budget_ticket!r}", "warning",
              dashboard=uids.TENANTS,
              summary="Tenant {{ $labels.tenant }} has spent {{ $value | humanizePercentage }} of its budget",
              description="Tenant {{ $labels.tenant }} has spent {{ $value | humanizePercentage }} of its "
                          "{{ $labels.unit }} budget for this {{ $labels.period }} (UTC); at all of it, the gateways "
                          "answer its requests 429 (insufficient_quota) until the period resets."),
        # -- info: context for the other alerts, routed to nobody -----------------------------------
        *_xid_alerts("info"),
        Alert("GPUPowerCapped", f'{m("inferwatch_gpu_throttle_active")}{{reason="sw_power_cap"}} == 1', "info",
              for_="30m", dashboard=uids.GPUS,
              summary=f"{GPU} runs at its power cap",
              description=f"{GPU} has been held at its power limit for 30m: expected under full load."),
        Alert("VLLMPreempting",
              f'sum by (model, instance) (rate({m("vllm:num_preemptions_total")}[10m])) > 0', "info", for_="15m",
              dashboard=uids.SERVING,
              summary="vLLM {{ $labels.instance }} preempts requests",
              description="vLLM on {{ $labels.instance }} preempts {{ $value | humanize }} requests/s: the KV "
                          "cache is too small for the batch."),
        # -- meta -------------------------------------------------------------------------------------
        Alert("Watchdog", "vector(1)", "none",
              summary="The alerting pipeline works",
              description="Always firing. Its absence at the dead man's switch means Prometheus or "
                          "Alertmanager is down or cannot notify."),
        # Reaches nobody (routing.py): inhibits the model's SLO alerts while every replica is down
        # and for outage_shadow after, so an outage pages once (VLLMDown), not again when it ends.
        # One replica down inhibits nothing: the survivors' SLO burns are theirs. It fires at the
        # first failed scrape of the last replica (`up` read here, not through a record), so it
        # is at Alertmanager before the outage's first SLO page leaves it (page group_wait); the
        # shadow follows only an outage VLLMDown counts, never a single missed scrape.
        # The shadow lifts once the model fails requests after a whole minute of being served
        # again: those failures are a new incident's (a broken rollout), not the outage's residue.
        Alert("VLLMModelUnavailable",
              f"(group by (model) ({SERVED_MODEL}) unless on (model) ({SERVED_MODEL} and on (job, instance) {_VLLM_UP} == 1))"
              f"\nor (\n  max_over_time({MODEL_UNAVAILABLE}[{outage_shadow}])\n"
              f"  unless on (model) (sum by (model) (increase({_REQUESTS}{{status_class=\"5xx\"}}[1m])) > 0"
              f"\n    unless on (model) max_over_time({MODEL_UNAVAILABLE}[1m]))\n)", "none",
              dashboard=uids.SERVING,
              summary="Every vLLM replica of {{ $labels.model }} is down, or was within the last " + outage_shadow,
              description="No vLLM target serving {{ $labels.model }} answers Prometheus (or none did within "
                          f"{outage_shadow}): the model's SLO alerts, which the outage itself causes, are inhibited; "
                          "VLLMDown pages for the outage."),
    )

# Targets and key series whose disappearance must not look like health. The drift service
# is expected once gateways deliver feature records to one; GPU metrics from anywhere
# (inferwatch's exporter, or dcgm-exporter through alerts/compat) satisfy the exporter's.
_RECORDS_SENT = f'sum(rate({m("inferwatch_gateway_feature_records_total")}{{outcome="sent"}}[10m])) > 0'
_NO_GPU_METRICS = clusters.absent_from(m("inferwatch_gpu_info"))
ABSENT_GUARDS = (
    Guard(JOB_GATEWAY, "up", f'up{{job="{JOB_GATEWAY}"}}'),
    Guard(JOB_VLLM, "up", f'up{{job="{JOB_VLLM}"}}'),
    Guard(JOB_EXPORTER, "up", f'up{{job="{JOB_EXPORTER}"}}', expected_when=_NO_GPU_METRICS),
    Guard(JOB_DRIFT, "up", f'up{{job="{JOB_DRIFT}"}}', expected_when=_RECORDS_SENT),
    Guard(JOB_GATEWAY, "inferwatch_gateway_upstream_up", m("inferwatch_gateway_upstream_up")),
    Guard(JOB_EXPORTER, "inferwatch_nvml_up", m("inferwatch_nvml_up")),
    Guard(JOB_VLLM, "vllm:num_requests_running", m("vllm:num_requests_running")),
)


@dataclass(frozen=True)
class Spec:
    """What one deployment alerts on: the generators' single input besides the metric names."""

    settings: Settings
    slos: tuple[SLO, ...]
    tiers: tuple[BurnTier, ...]
    alerts: tuple[Alert, ...]  # the enabled ones, with the settings' `for` durations

    @property
    def page_tier(self) -> BurnTier:
        """The first paging tier: the dashboards' red lines are where it starts to page."""
        return next(t for t in self.tiers if t.severity == "critical")

    def slo_of(self, sli: str) -> SLO | None:
        """The first SLO on ``sli``: what the serving dashboard draws its lines from."""
        return next((s for d, s in zip(self.settings.slos, self.slos) if d.sli == sli), None)

    @property
    def thresholds(self) -> Thresholds:
        return self.settings.alerts.thresholds


def build(settings: Settings = Settings()) -> Spec:
    """The spec of ``settings``. Raises ConfigError (with the field's path) for what only the
    whole can tell: an unknown alert name, an SLO held by no model."""
    settings.cross_check()
    tiers = tuple(tier(t) for t in settings.burn_rate.tiers)
    slos = []
    for i, declared in enumerate(settings.slos):
        models = settings.models_of(declared.name)
        if models == ():
            raise ConfigError(("slos", i, "name"), f"SLO {declared.name} is held by no model: list it in a "
                                                   "model's slos, or remove it")
        slos.append(slo(declared, models, settings.burn_rate))
    # How long after every replica of a model is back its SLO pages stay inhibited: the page
    # tiers' longest short window, which the outage keeps over the threshold until it has passed.
    # Pages for a burn that outlasts it go out; VLLMDown has paged for the outage itself.
    shadow = max((w.short for t in tiers if t.severity == "critical" for w in t.windows), key=seconds)
    every = _alerts(settings.alerts.thresholds, shadow)
    names = {a.name for a in every}
    chosen = settings.alerts
    for i, name in enumerate(chosen.disabled):
        if name not in names:
            raise ConfigError(("alerts", "disabled", i), f"no alert is named {name!r}: one of {sorted(names)}")
    for name in chosen.for_:
        if name not in names:
            raise ConfigError(("alerts", "for", name), f"no alert is named {name!r}: one of {sorted(names)}")
    kept = tuple(replace(a, for_=chosen.for_.get(a.name, a.for_)) for a in every if a.name not in chosen.disabled)
    return Spec(settings, tuple(slos), tiers, kept)


DEFAULT = build()  # the repository's: what the committed files are made of
