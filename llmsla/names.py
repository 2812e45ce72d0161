"""Every metric, label, bucket default, spool kind and store table name, defined once.

Exporters, rules, dashboards, the streaming job and tests import these constants instead of
retyping strings, so a rename is one edit and a typo is an ImportError, not a silent empty panel.
Metric names follow Prometheus conventions: the ``llmsla_`` prefix, base units (seconds, bytes,
ratios 0..1) and ``_total`` for counters (prometheus-client appends it; the constants below name
the family without it where the client wants that).
"""

from __future__ import annotations

PREFIX = "llmsla_"

# --- labels -------------------------------------------------------------------------------------
L_MODEL = "model"
L_POOL = "pool"
L_REPLICA = "replica"
L_ARM = "arm"
L_STATUS = "status"
L_KIND = "kind"
L_LABEL = "label"
L_NODE = "node"
L_GPU = "gpu"
L_UUID = "uuid"
L_MODEL_NAME = "model_name"
L_REASON = "reason"
L_POLICY_ID = "policy_id"
L_ZONE = "zone"
L_ACTION = "action"
L_TRIGGER = "trigger"
L_SCHEDULE = "schedule"
L_POLICY = "policy"
L_ROUTE_POLICY = "route_policy"
L_XID = "xid"  # GPU XID error code (NVML's critical XID event data)
L_ERROR = "error"  # kind of a hardware error counter (ECC, remapped rows, NVLink)
L_ECC_COUNTER = "counter"  # NVML ECC counter scope: volatile (since driver load) or aggregate
L_DIRECTION = "direction"  # tx | rx of a PCIe / NVLink series
#: Who a request is for and how it is served (docs/gateway.md#tenants-and-classes).
L_TENANT = "tenant"
L_CLASS = "class"

#: Labels every request metric carries, in this order.
REQUEST_LABELS: tuple[str, ...] = (L_MODEL, L_POOL, L_REPLICA, L_ARM)

#: Labels of the gateway's request series (histograms and counters): the request labels plus
#: the request's tenant and class, each bounded by the configuration (tenants.declared,
#: tenants.classes), never by what clients send.
REQUEST_SERIES_LABELS: tuple[str, ...] = (*REQUEST_LABELS, L_TENANT, L_CLASS)

#: ``tenant`` of every request while tenants are off (no tenants.header, no API-key map), and of
#: a RequestEvent written before tenants existed. A request that names no declared tenant while
#: tenants are on is ``other`` (LABEL_OVERFLOW_VALUE).
DEFAULT_TENANT = "default"
#: Request classes (tenants.classes), most protected first; a request's class is its tenant's
#: default class or a later one its class header names.
DEFAULT_CLASSES: tuple[str, ...] = ("interactive", "batch", "sheddable")
#: ``class`` of a RequestEvent written before classes existed.
DEFAULT_CLASS = DEFAULT_CLASSES[0]
#: The trusted header naming the class (llm-d's InferenceObjective header), tenants.class_header.
CLASS_HEADER = "x-gateway-inference-objective"

#: Request outcome values of the ``status`` label and of ``RequestEvent.status``.
STATUS_OK = "ok"
STATUS_ERROR = "error"
STATUS_TIMEOUT = "timeout"
STATUS_CANCELLED = "cancelled"
STATUS_REJECTED = "rejected"
STATUSES: tuple[str, ...] = (STATUS_OK, STATUS_ERROR, STATUS_TIMEOUT, STATUS_CANCELLED, STATUS_REJECTED)
#: The store windows' count column of each status (request_windows and its roll-ups).
STATUS_COLUMNS: dict[str, str] = {STATUS_OK: "ok", STATUS_ERROR: "errors", STATUS_TIMEOUT: "timeouts",
                                  STATUS_CANCELLED: "cancelled", STATUS_REJECTED: "rejected"}

#: ``arm`` of a request that is in no experiment (outside every experiment's coverage, or its
#: arm's weight was set to 0 by a rollback).
DEFAULT_ARM = "default"
DEFAULT_POOL = "default"

#: Value a guarded label takes when it is outside the allow-list or past the top-N.
LABEL_OVERFLOW_VALUE = "other"

# --- gateway request metrics (exporters) --------------------------------------------------------
REQUEST_TTFT_SECONDS = "llmsla_request_ttft_seconds"
#: The gap between consecutive token-carrying chunks of a streamed response, one observation per
#: gap (a chunk may carry several tokens: this is what the client sees, not decode speed).
REQUEST_INTER_CHUNK_SECONDS = "llmsla_request_inter_chunk_seconds"
#: Per-request time per output token, (E2E - TTFT) / (output tokens - 1), one observation per
#: successful streamed request with >= 2 output tokens (what AIPerf and vLLM call ITL / TPOT).
REQUEST_TPOT_SECONDS = "llmsla_request_time_per_output_token_seconds"
REQUEST_E2E_SECONDS = "llmsla_request_e2e_seconds"
REQUEST_QUEUE_SECONDS = "llmsla_request_queue_seconds"
REQUESTS = "llmsla_requests"  # counter family; exposed as llmsla_requests_total
#: Requests that met every latency objective of the SLO catalog at once (goodput, as AIPerf's and
#: vLLM bench's --goodput count it); llmsla_request_goodput_total, labelled like llmsla_requests
REQUEST_GOODPUT = "llmsla_request_goodput"
TOKENS = "llmsla_tokens"  # counter, label kind=prompt|output; llmsla_tokens_total
REQUESTS_IN_FLIGHT = "llmsla_requests_in_flight"
LABEL_OVERFLOW = "llmsla_label_overflow"  # counter, label=label name; llmsla_label_overflow_total
GATEWAY_BAD_REQUESTS = "llmsla_gateway_bad_requests"  # counter, label reason; 4xx before dispatch
#: ``reason`` (and ``error.code`` of the 429) of a request refused because its client already
#: holds its share of the gateway's in-flight slots (gateway.client_share of max_in_flight)
REASON_CLIENT_OVER_SHARE = "client_over_share"
#: ``error.code`` of the 429 of a request whose class is shed in its pool (control API
#: ``/v1/pools/{pool}/shed``, set by the alert receiver when a more protected class burns)
REASON_SHED_BY_SLO = "shed_by_slo"
#: counter, labels pool, class: requests refused by shedding; llmsla_gateway_shed_total
GATEWAY_SHED = "llmsla_gateway_shed"
#: Is the gateway itself the bottleneck (exporters/saturation.py): how late its event loop runs a
#: 100 ms timer (histogram), and its listening socket's accept queue (gauges, Linux)
GATEWAY_LOOP_LAG_SECONDS = "llmsla_gateway_event_loop_lag_seconds"
GATEWAY_ACCEPT_BACKLOG = "llmsla_gateway_accept_backlog"
GATEWAY_ACCEPT_BACKLOG_MAX = "llmsla_gateway_accept_backlog_max"
#: Request header naming the unit a request belongs to (a session or user), for the student
#: split and A/B bucketing; the body's OpenAI ``user`` field takes precedence, else the trace id.
UNIT_HEADER = "X-Session-Id"
#: Header the gateway sends upstream with a pool's temperature schedule (JSON ``{name, params}``)
#: when the control plane set one; the reference worker applies it.
SCHEDULE_HEADER = "X-Llmsla-Schedule"
#: ``RequestEvent.replica`` of a request that never reached a replica (429, no replica available).
NO_REPLICA = "none"
#: Temperature policies (``llmsla.temperature`` implements them); the first is the default:
#: the worker's ``worker.temperature_policy``, a pool's temperature schedule (a policy and its
#: bounds, set over the control API) and ``RequestEvent.policy`` when neither the request nor the
#: upstream names one.
TEMPERATURE_POLICIES: tuple[str, ...] = ("constant", "linear", "cosine", "exponential", "entropy")
DEFAULT_POLICY = TEMPERATURE_POLICIES[0]
TOKEN_KIND_PROMPT = "prompt"
TOKEN_KIND_OUTPUT = "output"

# --- A/B rollouts (control, gateway, simulator) --------------------------------------------------
#: ``arm`` label value of a unit in an experiment: ``<experiment>:<arm>`` (one experiment per pool
#: at a time, so one label per request); a forced (test) assignment adds ``:forced`` so that the
#: analysis can leave it out.
ARM_LABEL_SEP = ":"
ARM_FORCED_SUFFIX = "forced"
#: Response header naming the request's arm label (``default`` outside every experiment).
ARM_HEADER = "X-Llmsla-Arm"
#: Response header with the arm's strategy version, when the arm has one.
ARM_VERSION_HEADER = "X-Llmsla-Arm-Version"
L_EXPERIMENT = "experiment"
ROLLOUT_ARM_WEIGHT = "llmsla_rollout_arm_weight"  # gauge, labels experiment, arm: weight in force
ROLLOUT_COVERAGE_RATIO = "llmsla_rollout_coverage_ratio"  # gauge, label experiment: coverage in force

# --- GPU collector (exporters) ------------------------------------------------------------------
GPU_MEMORY_USED_BYTES = "llmsla_gpu_memory_used_bytes"
GPU_MEMORY_TOTAL_BYTES = "llmsla_gpu_memory_total_bytes"
GPU_MEMORY_FREE_BYTES = "llmsla_gpu_memory_free_bytes"
GPU_UTILIZATION_RATIO = "llmsla_gpu_utilization_ratio"
GPU_TEMPERATURE_CELSIUS = "llmsla_gpu_temperature_celsius"
GPU_POWER_WATTS = "llmsla_gpu_power_watts"
GPU_COLLECTOR_UP = "llmsla_gpu_collector_up"
# NVML signals at dcgm-exporter parity (docs/gpu-collector.md maps each to its DCGM field). A
# signal the device does not support has no series for that GPU (never a 0).
GPU_SM_CLOCK_HERTZ = "llmsla_gpu_sm_clock_hertz"  # gauge
GPU_MEMORY_CLOCK_HERTZ = "llmsla_gpu_memory_clock_hertz"  # gauge
#: gauge 0/1 per ``reason`` (THROTTLE_REASONS' names, ``other`` for unnamed bits)
GPU_CLOCK_THROTTLE_REASON = "llmsla_gpu_clock_throttle_reason"
GPU_XID_ERRORS = "llmsla_gpu_xid_errors"  # counter, label xid: critical XID events seen since start
GPU_ECC_ERRORS = "llmsla_gpu_ecc_errors"  # counter, labels error (corrected|uncorrected), counter
GPU_REMAPPED_ROWS = "llmsla_gpu_remapped_rows"  # counter, label error (correctable|uncorrectable)
GPU_ROW_REMAP_PENDING = "llmsla_gpu_row_remap_pending"  # gauge 0/1: a remap waits for a GPU reset
GPU_ROW_REMAP_FAILED = "llmsla_gpu_row_remap_failed"  # gauge 0/1: a remap failed (replace the GPU)
GPU_PCIE_THROUGHPUT_BYTES = "llmsla_gpu_pcie_throughput_bytes_per_second"  # gauge, label direction
GPU_PCIE_REPLAYS = "llmsla_gpu_pcie_replays"  # counter
GPU_NVLINK_BYTES = "llmsla_gpu_nvlink_bytes"  # counter, label direction (data, all links)
GPU_NVLINK_ERRORS = "llmsla_gpu_nvlink_errors"  # counter, label error (crc_flit|crc_data|replay|recovery)
#: ``reason`` values of GPU_CLOCK_THROTTLE_REASON that are not a slowdown (idle, a clock the
#: operator set, the display): the dashboards leave them out.
GPU_THROTTLE_BENIGN: tuple[str, ...] = ("gpu_idle", "applications_clocks_setting", "display_clock_setting")
TORCH_CUDA_ALLOCATED_BYTES = "llmsla_torch_cuda_allocated_bytes"
TORCH_CUDA_RESERVED_BYTES = "llmsla_torch_cuda_reserved_bytes"
TORCH_CUDA_FRAGMENTATION_BYTES = "llmsla_torch_cuda_fragmentation_bytes"

# --- engine adapters (engines) -------------------------------------------------------------------
#: Engine types an adapter reads (``engine.types``: pool=type); ``auto`` picks by metric prefix.
ENGINE_AUTO = "auto"
ENGINE_VLLM = "vllm"
ENGINE_SGLANG = "sglang"
ENGINE_TRTLLM = "trtllm"
ENGINE_TRITON = "triton"
ENGINES: tuple[str, ...] = (ENGINE_VLLM, ENGINE_SGLANG, ENGINE_TRTLLM, ENGINE_TRITON)
ENGINE_TYPES: tuple[str, ...] = (ENGINE_AUTO, *ENGINES)
#: Where a replica serves its Prometheus metrics unless told (``llmsla engines --path``):
#: ``/metrics``, but trtllm-serve answers there with its iteration stats as JSON and mounts the
#: exposition at ``/prometheus/metrics`` (``tensorrt_llm/serve/openai_server.py``).
METRICS_PATH = "/metrics"
ENGINE_METRICS_PATHS: dict[str, str] = {ENGINE_TRTLLM: "/prometheus/metrics"}
#: The pod label the Gateway API Inference Extension reads an engine's type from (Kubernetes
#: discovery reads it too); ``engine.types`` takes its values per pool.
ENGINE_TYPE_POD_LABEL = "inference.networking.k8s.io/engine-type"
#: llm-d's router's own key for it (read when the Inference Extension's is absent).
ENGINE_TYPE_POD_LABEL_LLMD = "llm-d.ai/engine-type"
#: A pod's engine-type label value -> the engine type: the values the Inference Extension's
#: metrics extractor names its engines by, and llmsla's own.
ENGINE_LABEL_VALUES: dict[str, str] = {
    "vllm": ENGINE_VLLM, "sglang": ENGINE_SGLANG, "trtllm-serve": ENGINE_TRTLLM, "trtllm": ENGINE_TRTLLM,
    "triton-tensorrt-llm": ENGINE_TRITON, "triton": ENGINE_TRITON,
}
L_ENGINE = "engine"
#: Labels of every ``llmsla_engine_*`` series, in this order.
ENGINE_LABELS: tuple[str, ...] = (L_REPLICA, L_POOL, L_ENGINE)
ENGINE_UP = "llmsla_engine_up"  # gauge: 1 if the replica's last scrape worked
ENGINE_REQUESTS_WAITING = "llmsla_engine_requests_waiting"
ENGINE_REQUESTS_RUNNING = "llmsla_engine_requests_running"
ENGINE_KV_USAGE_RATIO = "llmsla_engine_kv_usage_ratio"
ENGINE_KV_BLOCKS = "llmsla_engine_kv_blocks"  # gauge: KV blocks the engine has in total
ENGINE_KV_BLOCK_SIZE_TOKENS = "llmsla_engine_kv_block_size_tokens"
ENGINE_KV_CAPACITY_TOKENS = "llmsla_engine_kv_capacity_tokens"
ENGINE_PREFIX_CACHE_HIT_RATIO = "llmsla_engine_prefix_cache_hit_ratio"
ENGINE_LORA_ADAPTERS = "llmsla_engine_lora_adapters"  # gauge: adapters the engine reports active
#: counter, reset-aware across engine restarts (a decrease is a restart, never a negative step);
#: exposed as llmsla_engine_preemptions_total
ENGINE_PREEMPTIONS = "llmsla_engine_preemptions"
ENGINE_SCRAPE_SECONDS = "llmsla_engine_scrape_seconds"  # gauge: duration of the last scrape
ENGINE_SCRAPE_FAILURES = "llmsla_engine_scrape_failures"  # counter, labels replica, reason
#: Bounded values of the ``reason`` label of ``llmsla_engine_scrape_failures_total``.
ENGINE_FAIL_TIMEOUT = "timeout"
ENGINE_FAIL_HTTP = "http_status"
ENGINE_FAIL_TOO_LARGE = "too_large"
ENGINE_FAIL_PARSE = "parse"
ENGINE_FAIL_UNKNOWN_ENGINE = "unknown_engine"
ENGINE_FAIL_CONNECT = "connect"
ENGINE_FAIL_REASONS: tuple[str, ...] = (ENGINE_FAIL_TIMEOUT, ENGINE_FAIL_HTTP, ENGINE_FAIL_TOO_LARGE,
                                        ENGINE_FAIL_PARSE, ENGINE_FAIL_UNKNOWN_ENGINE, ENGINE_FAIL_CONNECT)

# --- discovery (llmsla/discovery.py; the gateway and ``llmsla engines`` export them) ---------------
#: Replicas a discovery consumer knows, labels pool and state (one of DISCOVERY_STATES): the
#: gateway's router (probing = joined, not yet answered a health probe; serving; draining = left
#: the source's answer, in-flight requests finishing), ``llmsla engines`` (probing = not scraped
#: successfully yet or failing; serving = last scrape worked).
DISCOVERY_REPLICAS = "llmsla_discovery_replicas"
DISCOVERY_REFRESHES = "llmsla_discovery_refreshes"  # counter, label source: answers applied
DISCOVERY_FAILURES = "llmsla_discovery_failures"  # counter, labels source, reason
DISCOVERY_LAST_SUCCESS = "llmsla_discovery_last_success_timestamp_seconds"  # gauge, label source
L_STATE = "state"  # a replica's discovery state
DISCOVERY_PROBING = "probing"
DISCOVERY_SERVING = "serving"
DISCOVERY_DRAINING = "draining"
DISCOVERY_STATES: tuple[str, ...] = (DISCOVERY_PROBING, DISCOVERY_SERVING, DISCOVERY_DRAINING)
#: Bounded values of the ``reason`` label of ``llmsla_discovery_failures_total``.
DISCOVERY_FAIL_MISSING = "missing"  # the file is not there (or cannot be stat'ed)
DISCOVERY_FAIL_READ = "read"  # the file is there but cannot be read or decoded
DISCOVERY_FAIL_RESOLVE = "resolve"  # the DNS name has no answer (NXDOMAIN, SERVFAIL, no SRV)
DISCOVERY_FAIL_TIMEOUT = "timeout"  # the DNS answer did not come in time
DISCOVERY_FAIL_EMPTY = "empty"  # an answer naming no replica (the last set is kept)
DISCOVERY_FAIL_API = "api"  # the Kubernetes API could not be reached, or answered an error
DISCOVERY_FAIL_DENIED = "denied"  # the Kubernetes API refused the credentials (401/403: RBAC)
DISCOVERY_FAIL_ERROR = "error"  # anything else (a bug in a round)
DISCOVERY_FAIL_REASONS: tuple[str, ...] = (DISCOVERY_FAIL_MISSING, DISCOVERY_FAIL_READ, DISCOVERY_FAIL_RESOLVE,
                                           DISCOVERY_FAIL_TIMEOUT, DISCOVERY_FAIL_EMPTY, DISCOVERY_FAIL_API,
                                           DISCOVERY_FAIL_DENIED, DISCOVERY_FAIL_ERROR)

# --- vLLM's own names, as the reference worker and the simulator expose them (exporters) ------------
#: vLLM V1's ``PrometheusStatLogger`` (``vllm/v1/metrics/loggers.py``): the names, the labels and the
#: default buckets a vLLM replica exposes, so the worker and the simulator are read by the same
#: adapter (engines/vllm.py) as a vLLM fleet. Counters without ``_total`` (prometheus-client adds it).
VLLM_L_MODEL = "model_name"
VLLM_L_ENGINE = "engine"  # the engine-core index (data parallelism); "0" for one engine
VLLM_REQUESTS_WAITING = "vllm:num_requests_waiting"
VLLM_REQUESTS_RUNNING = "vllm:num_requests_running"
VLLM_KV_CACHE_USAGE = "vllm:kv_cache_usage_perc"  # gauge, 0..1 (1 = 100 %) despite the name
VLLM_CACHE_CONFIG_INFO = "vllm:cache_config_info"  # info gauge: labels block_size, num_gpu_blocks, ...
VLLM_PREEMPTIONS = "vllm:num_preemptions"
VLLM_PREFIX_CACHE_QUERIES = "vllm:prefix_cache_queries"  # counter, in prompt tokens
VLLM_PREFIX_CACHE_HITS = "vllm:prefix_cache_hits"  # counter, in prompt tokens found cached
VLLM_PROMPT_TOKENS = "vllm:prompt_tokens"
VLLM_GENERATION_TOKENS = "vllm:generation_tokens"
VLLM_TTFT_SECONDS = "vllm:time_to_first_token_seconds"
VLLM_ITL_SECONDS = "vllm:inter_token_latency_seconds"
VLLM_E2E_SECONDS = "vllm:e2e_request_latency_seconds"
VLLM_QUEUE_SECONDS = "vllm:request_queue_time_seconds"
VLLM_TTFT_BUCKETS: tuple[float, ...] = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0,
                                        2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
VLLM_ITL_BUCKETS: tuple[float, ...] = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5,
                                       5.0, 7.5, 10.0, 20.0, 40.0, 80.0)
VLLM_REQUEST_BUCKETS: tuple[float, ...] = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0,
                                           50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)
#: The KV block size (tokens per block) of the worker's and the simulator's engines: vLLM's
#: long-standing default (newer releases default to 64 and let the attention backend choose); a
#: real replica's size is read from its ``vllm:cache_config_info``.
VLLM_BLOCK_SIZE = 16

# --- temperature policy (exporters) -------------------------------------------------------------
POLICY_SPAN_NAME = "temperature_policy.decide"
POLICY_TEMPERATURE = "llmsla_policy_temperature"
POLICY_DECISIONS = "llmsla_policy_decisions"  # counter; llmsla_policy_decisions_total
#: OTel span attribute keys of a policy decision (``temperature_policy.decide``).
SPAN_ATTR_POLICY_ID = "policy_id"
SPAN_ATTR_ZONE = "zone"
SPAN_ATTR_STEP = "step"
SPAN_ATTR_TEMPERATURE = "temperature"
SPAN_ATTR_ACTION = "action"
SPAN_ATTR_TRIGGER = "trigger"

# --- reference worker (exporters) ---------------------------------------------------------------
WORKER_QUEUE_LENGTH = "llmsla_worker_queue_length"
WORKER_RUNNING_REQUESTS = "llmsla_worker_running_requests"
WORKER_BATCH_SIZE = "llmsla_worker_batch_size"
WORKER_GENERATED_TOKENS = "llmsla_worker_generated_tokens"  # counter
WORKER_TOKENS_PER_SECOND = "llmsla_worker_tokens_per_second"
WORKER_MEMORY_BYTES = "llmsla_worker_memory_bytes"
WORKER_FIRST_TOKEN_SECONDS = "llmsla_worker_first_token_seconds"
#: The fault injected through the worker's admin endpoint (worker/fault.py): ground truth on a dashboard.
WORKER_FAULT_SLOWDOWN = "llmsla_worker_fault_slowdown"
WORKER_FAULT_DOWN = "llmsla_worker_fault_down"

# --- OpenTelemetry: GenAI request spans and OTLP metrics (exporters) -----------------------------
# Convention names (gen_ai.*, server.*, error.type, the gen_ai metrics) come from the
# opentelemetry-semantic-conventions package (llmsla.exporters.genai); only what it does not
# define is here.
#: Name of a GenAI request span (gateway and worker), per the conventions: ``chat llmsla-tiny``.
GENAI_SPAN_NAME = "{operation} {model}"
#: ``gen_ai.provider.name``: the conventions' well-known values are hosted APIs; a self-hosted
#: fleet behind llmsla gets its own.
GENAI_PROVIDER = "llmsla"
#: ``gen_ai.client.token.usage`` bounds ({token}): the conventions' advised layout, which the
#: package does not carry.
TOKEN_USAGE_BUCKETS: tuple[float, ...] = (
    1, 4, 16, 64, 256, 1024, 4096, 16384, 65536, 262144, 1048576, 4194304, 16777216, 67108864,
)
#: Explicit bucket boundaries the conventions advise for the gen_ai.server metrics (semantic
#: conventions v1.41.1, docs/gen-ai/gen-ai-metrics.md; the Python package carries no advice). The
#: Prometheus histograms keep the SLO-aligned ``metrics.*_buckets``.
GENAI_TTFT_BUCKETS: tuple[float, ...] = (
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
)
GENAI_TPOT_BUCKETS: tuple[float, ...] = (
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5,
)
GENAI_DURATION_BUCKETS: tuple[float, ...] = (
    0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48, 40.96, 81.92,
)
#: llmsla's own attributes on request spans and OTLP metric points (values as in RequestEvent).
OTEL_ATTR_POOL = "llmsla.pool"
OTEL_ATTR_REPLICA = "llmsla.replica"
OTEL_ATTR_ARM = "llmsla.arm"
OTEL_ATTR_POLICY = "llmsla.policy"
OTEL_ATTR_STATUS = "llmsla.status"
OTEL_ATTR_QUEUE_MS = "llmsla.queue_ms"
OTEL_ATTR_TTFT_MS = "llmsla.ttft_ms"
#: Token counts llmsla estimated (prompt characters / 4, counted chunks) because the upstream
#: reported no ``usage``; only with ``otel.token_estimates`` on, never as ``gen_ai.usage.*``.
OTEL_ATTR_ESTIMATED_INPUT_TOKENS = "llmsla.usage.estimated_input_tokens"
OTEL_ATTR_ESTIMATED_OUTPUT_TOKENS = "llmsla.usage.estimated_output_tokens"

# --- router and distillation controls (control) -------------------------------------------------
#: Router policies (``llmsla.control.router``); config and the control API validate against it.
ROUTE_POLICIES: tuple[str, ...] = ("round_robin", "least_outstanding", "p2c", "ladr")
#: The fleet simulator's bound (``llmsla.fleet.oracle``): reads every replica's true state, so no
#: gateway can run it; the simulator and the routing bench accept it, config does not.
ORACLE_POLICY = "oracle"
SIM_ROUTE_POLICIES: tuple[str, ...] = (*ROUTE_POLICIES, ORACLE_POLICY)
ROUTER_PICKS = "llmsla_router_picks"  # counter; llmsla_router_picks_total
ROUTER_SCORE = "llmsla_router_score"
ROUTER_WEIGHT = "llmsla_router_weight"
ROUTER_DRAINED = "llmsla_router_drained"
ROUTER_FALLBACK = "llmsla_router_fallback"  # counter: shared state unavailable, local stats used
DISTILL_STUDENT_SHARE_RATIO = "llmsla_distill_student_share_ratio"
SHED_SHARE_RATIO = "llmsla_shed_share_ratio"  # gauge 0..1, labels pool, class: share of the class shed

# --- forecaster and alerting ---------------------------------------------------------------------
FORECAST_RISK = "llmsla_forecast_risk"  # gauge 0..1, labels target, model, pool, replica, horizon (s)
ALERT_ACTIONS = "llmsla_alert_actions"  # counter; llmsla_alert_actions_total
FORECAST_SCORE_SECONDS = "llmsla_forecast_score_seconds"  # histogram: one batch scored
FORECAST_NOTIFICATIONS = "llmsla_forecast_notifications"  # counter, label status, outcome
#: The forecaster's own accuracy over its rolling window (forecast.accuracy_window_s), per
#: horizon (label ``horizon``, seconds), scored against the stored breaches; docs/forecaster.md.
FORECAST_PRECISION = "llmsla_forecast_precision"  # gauge: share of judged notifications not false
FORECAST_RECALL = "llmsla_forecast_recall"  # gauge: share of judged breaches warned ahead
FORECAST_LEAD_SECONDS = "llmsla_forecast_lead_seconds"  # gauge histogram: lead of each warned breach
FORECAST_FALSE_ALARMS_PER_DAY = "llmsla_forecast_false_alarms_per_day"  # gauge, per healthy target-day
FORECAST_BREACHES = "llmsla_forecast_breaches"  # gauge: breaches judged (how much the recall rests on)
FORECAST_VALIDATION_RECALL = "llmsla_forecast_validation_recall"  # gauge: the serving model's, labels model, horizon
L_HORIZON = "horizon"
#: ``target`` label of the risk gauge and ``forecasts.target``: a replica or a whole pool.
FORECAST_TARGET_REPLICA = "replica"
FORECAST_TARGET_POOL = "pool"
#: The forecaster's input features: the default list every new model reads unless
#: ``forecast.features`` names another, and the ones a model may opt into (``gpu_temp_c``: the
#: hottest of the target's GPUs; the engine's own state from ``engine_windows``).
FORECAST_FEATURES: tuple[str, ...] = (
    "qps", "ttft_p50_ms", "ttft_p99_ms", "e2e_p99_ms", "itl_mean_ms", "itl_jitter_ms",
    "queue_p99_ms", "error_ratio", "gpu_mem_used_ratio", "gpu_util", "output_tps", "temperature_jitter",
)
FORECAST_ENGINE_FEATURES: tuple[str, ...] = ("engine_waiting", "engine_kv_usage", "engine_preemptions_per_s")
FORECAST_KNOWN_FEATURES: tuple[str, ...] = (*FORECAST_FEATURES, "gpu_temp_c", *FORECAST_ENGINE_FEATURES)
L_TARGET = "target"
L_OUTCOME = "outcome"
#: The forecaster's alerts (Alertmanager webhook v4 to the receiver); labels from the alerting
#: section below (the receiver's policy matches them).
FORECAST_ALERTNAME = "LLMSLAForecastDegradation"
#: Annotations of a forecaster alert.
ANN_RISK = "risk"
ANN_THRESHOLD = "threshold"
ANN_HORIZON_S = "horizon_s"
#: When the breach is expected (RFC 3339): now + the shortest horizon whose risk is over its
#: threshold. A forecaster alert's ``horizon`` label (L_HORIZON) reads ``30s``, ``2m``, ``5m``.
ANN_PREDICTED_BREACH = "predicted_breach_at"
ANN_SUMMARY = "summary"
#: SLO names (the ``slo`` label, ``metadata.name`` of the specs in deploy/slo/).
SLO_TTFT = "ttft"
SLO_E2E = "e2e"
SLO_AVAILABILITY = "availability"

# --- alerting: SLO rules, alert labels, receiver (alerting) --------------------------------------
# Recording-rule names and labels are Sloth's (https://sloth.dev), so dashboards built for Sloth
# work unchanged. Every SLI series carries sloth_id/sloth_service/sloth_slo and the SLO's model
# and pool; the meta series (objective, error budget) one per SLO, without model/pool.
SLO_WINDOWS: tuple[str, ...] = ("5m", "30m", "1h", "2h", "6h", "1d", "3d", "30d")
#: ``slo:sli_error:ratio_rate<window>`` for each of :data:`SLO_WINDOWS`.


def slo_sli_error(window: str) -> str:
    """``slo:sli_error:ratio_rate<window>`` for any window (periods other than 30d add their own)."""
    return f"slo:sli_error:ratio_rate{window}"


SLO_SLI_ERROR: dict[str, str] = {w: slo_sli_error(w) for w in SLO_WINDOWS}
SLO_OBJECTIVE = "slo:objective:ratio"
SLO_ERROR_BUDGET = "slo:error_budget:ratio"
SLO_TIME_PERIOD_DAYS = "slo:time_period:days"
SLO_CURRENT_BURN_RATE = "slo:current_burn_rate:ratio"
SLO_PERIOD_BURN_RATE = "slo:period_burn_rate:ratio"
SLO_PERIOD_ERROR_BUDGET_REMAINING = "slo:period_error_budget_remaining:ratio"
SLO_INFO = "sloth_slo_info"
#: Per-replica SLI error ratio (an llmsla addition: Sloth has no per-instance SLI), per window.


def slo_replica_sli_error(window: str) -> str:
    return f"llmsla_slo:replica_sli_error:ratio_rate{window}"


SLO_REPLICA_SLI_ERROR: dict[str, str] = {w: slo_replica_sli_error(w) for w in SLO_WINDOWS}
L_SLOTH_ID = "sloth_id"
L_SLOTH_SERVICE = "sloth_service"
L_SLOTH_SLO = "sloth_slo"
L_SLOTH_WINDOW = "sloth_window"
L_SLOTH_SEVERITY = "sloth_severity"
#: Alert labels the receiver policy matches on; Prometheus rules and the forecaster set them.
L_ALERTNAME = "alertname"
L_ALERTSTATE = "alertstate"
L_SEVERITY = "severity"
L_SLO = "slo"
L_SOURCE = "source"
L_SCOPE = "scope"
SEVERITY_PAGE = "page"
SEVERITY_TICKET = "ticket"
SOURCE_BURN_RATE = "burn_rate"
SOURCE_FORECASTER = "forecaster"
SOURCE_STATIC = "static"
SCOPE_POOL = "pool"
SCOPE_REPLICA = "replica"
#: Prometheus' own series of pending and firing alerts.
ALERTS = "ALERTS"
ALERTSTATE_FIRING = "firing"
#: Metrics other components export for the static alert rules (reserved here, rules use them).
DEAD_LETTERS = "llmsla_dead_letters"  # counter, label source; llmsla_dead_letters_total
#: Newest window end the stream job has stored, per window table (`time() - x` is its lag).
STREAM_NEWEST_WINDOW = "llmsla_stream_newest_window_end_timestamp_seconds"  # gauge, label table
RECEIVER_ALERTS = "llmsla_receiver_alerts"  # counter, labels status, decision
RECEIVER_ACTION_SECONDS = "llmsla_receiver_action_seconds"  # histogram, label action
RECEIVER_TRUNCATED = "llmsla_receiver_truncated_alerts"  # counter: alerts Alertmanager's max_alerts left out
#: Store tables of the receiver: one row per idempotency key, one state document per target.
T_ALERT_RECEIPTS = "alert_receipts"
T_RECEIVER_STATE = "receiver_state"

# --- histogram bucket defaults (seconds) --------------------------------------------------------
# SLO-aligned: every default SLO threshold in config.py is a bound here; a configured SLO that is
# not a bound of its histogram is a startup error (llmsla.config.check_slo_buckets).
TTFT_BUCKETS: tuple[float, ...] = (
    0.025, 0.05, 0.1, 0.2, 0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 3.0, 5.0, 10.0, 20.0, 60.0,
)
ITL_BUCKETS: tuple[float, ...] = (
    0.005, 0.01, 0.02, 0.03, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 1.0, 2.5,
)
E2E_BUCKETS: tuple[float, ...] = (
    0.1, 0.25, 0.5, 1.0, 2.0, 3.0, 5.0, 8.0, 10.0, 15.0, 20.0, 30.0, 60.0, 120.0, 300.0,
)
QUEUE_BUCKETS: tuple[float, ...] = (
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
)

# --- mergeable latency histograms (streaming job, store, A/B report) ----------------------------
# One fixed log-spaced layout (DDSketch-like) for the store's per-window TTFT and E2E bucket
# counts. Bucket 0 holds values <= HIST_BOUNDS_MS[0] (0 included), bucket i (1..N) holds
# (HIST_BOUNDS_MS[i-1], HIST_BOUNDS_MS[i]], bucket N+1 values above the last bound. A bucket is
# read back as HIST_VALUES_MS[i], within HIST_REL_ERROR of every value it holds (the clamped end
# buckets excepted), so a quantile of summed counts is within 1 % of the exact order statistic.
HIST_REL_ERROR = 0.01
HIST_GAMMA = (1.0 + HIST_REL_ERROR) / (1.0 - HIST_REL_ERROR)
HIST_MIN_MS = 0.1
HIST_MAX_MS = 3_600_000.0  # one hour
HIST_N = 870  # bounds b_0..b_N: b_N = HIST_MIN_MS * HIST_GAMMA**N >= HIST_MAX_MS
HIST_BOUNDS_MS: tuple[float, ...] = tuple(HIST_MIN_MS * HIST_GAMMA**i for i in range(HIST_N + 1))
HIST_VALUES_MS: tuple[float, ...] = (
    HIST_BOUNDS_MS[0],
    *(2.0 * lo * hi / (lo + hi) for lo, hi in zip(HIST_BOUNDS_MS, HIST_BOUNDS_MS[1:], strict=False)),
    HIST_BOUNDS_MS[-1],
)
#: Histogram columns of request_windows (integer[]) and its roll-ups (bigint[]): PostgreSQL arrays
#: whose subscripts are the bucket indices (lower bound = first non-empty bucket), so only the
#: range from the smallest to the largest value of a window is stored.
C_TTFT_HIST = "ttft_hist"
C_E2E_HIST = "e2e_hist"
C_ENGINE_TTFT_HIST = "engine_ttft_hist"  # engine_windows (migration 0015): the engine's own TTFT, native buckets spread onto the layout

# --- spool kinds (one sub-directory per event type) ---------------------------------------------
#: counter, labels kind, reason (:data:`SPOOL_DROP_REASONS`): events a spool writer could not
#: write after retrying for ``spool.write_retry_s``; exposed as llmsla_spool_dropped_total
SPOOL_DROPPED = "llmsla_spool_dropped"
SPOOL_DROP_LIMIT = "limit"  # the kind's directory reached spool.max_total_bytes (consumer behind)
SPOOL_DROP_NO_SPACE = "no_space"  # the file system is full (ENOSPC, EDQUOT)
SPOOL_DROP_IO_ERROR = "io_error"  # any other write error (read-only, EIO, ...)
SPOOL_DROP_REASONS: tuple[str, ...] = (SPOOL_DROP_LIMIT, SPOOL_DROP_NO_SPACE, SPOOL_DROP_IO_ERROR)
SPOOL_REQUESTS = "requests"
SPOOL_POLICY = "policy"
SPOOL_GPU = "gpu"
#: The kinds of the request path (gateway, simulator, GPU collector): the forecaster windows
#: these in memory too (``forecaster/windowing.py``).
SPOOL_KINDS: tuple[str, ...] = (SPOOL_REQUESTS, SPOOL_POLICY, SPOOL_GPU)
#: ``EngineSample`` lines (``llmsla engines``): windowed by the stream job into ``engine_windows``;
#: the forecaster does not read them (yet), so not in :data:`SPOOL_KINDS`.
SPOOL_ENGINE = "engine"
#: Every kind a spool holds: what ``llmsla spool`` and ``llmsla doctor`` walk, and the kinds the
#: stream job windows (``llmsla stream --kinds``; each has a window query).
SPOOL_ALL_KINDS: tuple[str, ...] = (*SPOOL_KINDS, SPOOL_ENGINE)

# --- store tables and views (same names on TimescaleDB and plain PostgreSQL) --------------------
T_MIGRATIONS = "llmsla_migrations"
T_REQUEST_WINDOWS = "request_windows"  # 5 s tumbling, per (model, pool, replica, arm, tenant, class)
T_REQUEST_WINDOWS_1M = "request_windows_1m"  # roll-up view / continuous aggregate
T_REQUEST_WINDOWS_1H = "request_windows_1h"  # roll-up view / continuous aggregate
T_POLICY_WINDOWS = "policy_windows"  # 60 s tumbling, per (zone, policy_id)
T_GPU_WINDOWS = "gpu_windows"  # 5 s tumbling, per (node, gpu)
T_ENGINE_WINDOWS = "engine_windows"  # 5 s tumbling, per (pool, replica, engine)
T_ENGINE_WINDOWS_1M = "engine_windows_1m"  # roll-up table (trigger) / continuous aggregate
T_ENGINE_WINDOWS_1H = "engine_windows_1h"  # roll-up table (trigger) / continuous aggregate
T_DEAD_LETTERS = "dead_letters"
T_DEAD_LETTER_COUNTS = "dead_letter_counts"  # view: dead letters per (source, reason category)
T_DEAD_LETTER_TOTALS = "dead_letter_totals"  # running totals per (source, reason category), outlive retention
T_FORECASTS = "forecasts"
T_FORECASTS_1M = "forecasts_1m"  # roll-up table (trigger) / continuous aggregate
T_FORECASTS_1H = "forecasts_1h"  # roll-up table (trigger) / continuous aggregate
T_ACTION_LOG = "action_log"  # alert receiver / control API audit log
T_AB_RESULTS = "ab_results"
T_FORECAST_MODELS = "forecast_models"  # the forecaster's model registry (artifacts, status)

#: Time-partitioned tables: retention and partition maintenance apply to these.
TIME_TABLES: dict[str, str] = {
    T_REQUEST_WINDOWS: "bucket",
    T_POLICY_WINDOWS: "bucket",
    T_GPU_WINDOWS: "bucket",
    T_ENGINE_WINDOWS: "bucket",
    T_DEAD_LETTERS: "received_at",
    T_FORECASTS: "ts",
    T_ACTION_LOG: "ts",
    T_AB_RESULTS: "ts",
}

# --- window lengths (seconds) -------------------------------------------------------------------
REQUEST_WINDOW_S = 5
POLICY_WINDOW_S = 60
GPU_WINDOW_S = 5
ENGINE_WINDOW_S = 5

# --- read by the dashboards and the report -------------------------------------------
# Names other components produce that dashboards query (Sloth's rules, alerts, the forecaster's
# risk) are defined with their producers above; these are the dashboards' own.
L_LE = "le"  # histogram bucket bound (Prometheus)
L_INSTANCE = "instance"  # added by Prometheus to every scraped series
L_JOB = "job"  # added by Prometheus: the scrape job (which exporter a series comes from)
#: ``ab_results.metric`` values the A/B dashboard reads (A/B attribution writes them).
AB_METRIC_TTFT_P95 = "ttft_p95_ms"
AB_METRIC_E2E_P95 = "e2e_p95_ms"
AB_METRIC_TTFT_ATTAINMENT = "ttft_attainment"
AB_METRIC_SRM = "srm"  # sample-ratio mismatch: value = observed share, p_value = chi-square test
AB_METRIC_TTFT_P50 = "ttft_p50_ms"
AB_METRIC_TTFT_P99 = "ttft_p99_ms"
AB_METRIC_E2E_P50 = "e2e_p50_ms"
AB_METRIC_E2E_P99 = "e2e_p99_ms"
AB_METRIC_E2E_ATTAINMENT = "e2e_attainment"
AB_METRIC_AVAILABILITY = "availability"  # 1 - (errors + timeouts) / requests: higher is better
AB_METRIC_ITL_MEAN = "itl_mean_ms"  # mean inter-token latency, token-weighted (sum of gaps / gaps)
#: ``ab_results.metric`` values where lower is better (latencies, ms); every other metric but
#: SRM is a ratio where higher is better.
AB_LATENCY_METRICS: tuple[str, ...] = (
    AB_METRIC_TTFT_P50, AB_METRIC_TTFT_P95, AB_METRIC_TTFT_P99,
    AB_METRIC_E2E_P50, AB_METRIC_E2E_P95, AB_METRIC_E2E_P99, AB_METRIC_ITL_MEAN,
)
#: Grafana datasource uids written by ``llmsla dashboards build`` (provisioning) and used as the
#: default of each dashboard's datasource variable.
GRAFANA_PROMETHEUS_UID = "llmsla-prometheus"
GRAFANA_STORE_UID = "llmsla-store"
#: Grafana's plugin id of its built-in PostgreSQL datasource (TimescaleDB too).
GRAFANA_POSTGRES_TYPE = "grafana-postgresql-datasource"
