"""Configuration: one TOML file plus ``LLMSLA_<SECTION>_<KEY>`` environment overrides.

Every key is declared once below, with its type, default and a one-line doc; ``llmsla config doc``
renders them to ``docs/config.md`` (a test keeps that file current). An unknown section or key,
or a value of the wrong type or range, is a :class:`ConfigError` naming the file and the key, so
a typo fails at startup instead of silently using a default.

Every check a component relies on is declared on its key (``check=``: a label the events can
carry, a URL the proxy can reach, a DSN psycopg can parse, a Redis URL redis-py accepts, a token
of 16 characters or more) and run by :func:`load`, so ``llmsla config check`` refuses exactly what
the components would: both load the configuration through the same function.
"""

from __future__ import annotations

import difflib
import ipaddress
import json
import logging
import math
import os
import re
import stat
import tomllib
import types
import typing
from collections.abc import Callable
from dataclasses import MISSING, dataclass, field, fields
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from llmsla import experiments, names
from llmsla.discovery import SOURCES as DISCOVERY_SOURCES
from llmsla.discovery import dns_target_problem
from llmsla.discovery_k8s import port_problem, selector_problem
from llmsla.errors import UserError
from llmsla.events import MAX_STRING_CHARS, string_problem

log = logging.getLogger(__name__)

ENV_PREFIX = "LLMSLA_"
ENV_CONFIG_FILE = "LLMSLA_CONFIG"
#: ``LLMSLA_*`` variables that are not configuration keys (the one place that lists them): the
#: config file, the data sets' directory (llmsla.data), the Flink cluster's process marker
#: (llmsla.streaming.cluster). Any other ``LLMSLA_*`` name must be a key, or it is a typo.
ENV_NOT_KEYS = frozenset({ENV_CONFIG_FILE, "LLMSLA_DATA_DIR", "LLMSLA_FLINK_CLUSTER"})
#: ... and prefixes of such families: the test suite's (LLMSLA_TEST_DSN) and Grafana's
#: provisioning variables (deploy/grafana, read by Grafana, not by llmsla).
ENV_NOT_KEY_PREFIXES = ("LLMSLA_TEST_", "LLMSLA_GRAFANA_")
#: Shortest accepted bearer token: guessing 16 random characters is out of reach, and a secret
#: this long is never a substring of ordinary text that masking it (llmsla.redaction) would garble.
MIN_TOKEN_CHARS = 16

#: A key's own check: the value (after type and range checks) -> why it is refused, or None.
Check = Callable[[Any], "str | None"]


class ConfigError(UserError, ValueError):
    """A bad configuration value; the message names the source (file or env var) and the key."""


def _k(default: Any, doc: str, *, choices: tuple[str, ...] | None = None, minimum: float | None = None,
       maximum: float | None = None, kind: str | None = None, check: Check | None = None) -> Any:
    """A key: default, doc, bounds; ``kind`` "host"/"port" adds the address checks ("port0": 0
    = a free port, for a process nothing needs to find at a fixed address), "secret"
    masks the value wherever the configuration is shown; ``check`` is the component's own rule
    for the value (see the validators below), run wherever the key is set."""
    meta = {"doc": doc, "choices": choices, "minimum": minimum, "maximum": maximum, "kind": kind, "check": check}
    if isinstance(default, list | dict):
        def fresh() -> Any:  # each instance its own copy of a mutable default
            return type(default)(default)

        return field(default_factory=fresh, metadata=meta)
    return field(default=default, metadata=meta)


# -- validators: each is the one definition the component relies on ------------------------------
def label_problem(value: str) -> str | None:
    """Why ``value`` cannot be a label of the events (a pool, zone, node, model or arm name), else
    None: the event contract's own rule for its string fields (llmsla.events), so a name every
    event would fail (a 300-character pool made the gateway record nothing) fails here instead."""
    if not value:
        return "must not be empty"
    if len(value) > MAX_STRING_CHARS:
        return f"longer than {MAX_STRING_CHARS} characters ({len(value)}), the longest name an event may carry"
    return string_problem(value)


def _optional_label(value: str) -> str | None:
    return None if value == "" else label_problem(value)


def url_problem(value: str, schemes: tuple[str, ...] = ("http", "https")) -> str | None:
    """Why ``value`` is not a ``scheme://host[:port][/path]`` URL with one of ``schemes``, else
    None. Never echoes the value (it may carry a password); the caller shows it redacted."""
    if not value.isprintable() or any(c.isspace() for c in value):
        return "contains whitespace or control characters"
    try:
        parts = urlsplit(value)
        port = parts.port  # a port that is not a number, or out of range, raises here
    except ValueError as exc:
        return f"not a URL: {exc}"
    if parts.scheme.lower() not in schemes or not value.lower().startswith(parts.scheme.lower() + "://"):
        return f"must start with {' or '.join(s + '://' for s in schemes)}"
    if not parts.hostname:
        return "has no host"
    if port == 0:
        return "port 0 is not an address"
    return None


def _optional_url(value: str) -> str | None:
    return None if value == "" else url_problem(value)


def _horizons_problem(value: list[float]) -> str | None:
    """Why ``forecast.horizons_s`` cannot label 5 s windows: each a whole number of windows, no repeats."""
    step = names.REQUEST_WINDOW_S
    for h in value:
        if not isinstance(h, int | float) or isinstance(h, bool) or not math.isfinite(h) or h < step or h % step:
            return f"each horizon must be a whole multiple of {step} s (the window), got {h!r}"
    if len(set(value)) != len(value):
        return f"horizons repeat: {value!r}"
    return None


def _features_problem(value: list[str]) -> str | None:
    """Why ``forecast.features`` is not a list of features the forecaster can build, once each."""
    for name in value:
        if name not in names.FORECAST_KNOWN_FEATURES:
            return f"unknown feature {name!r} (known: {', '.join(names.FORECAST_KNOWN_FEATURES)})"
    if len(set(value)) != len(value):
        return f"features repeat: {value!r}"
    return None


def split_pool_spec(spec: str) -> tuple[str, str]:
    """``pool=http://host:port`` (``gateway.pools``) as (pool, url), or a bare pool name (a pool
    whose replicas discovery finds: a pod label, the discovery file) as (pool, ""); ValueError
    says why not."""
    pool, sep, url = spec.partition("=")
    if not sep:
        if "://" in spec or (problem := label_problem(spec)) is not None:
            raise ValueError("expected pool=http://host:port, or a pool name alone for a pool discovery finds")
        return spec, ""
    if (problem := label_problem(pool)) is not None:
        raise ValueError(f"pool name {problem}")
    if (problem := url_problem(url)) is not None:
        raise ValueError(f"after '{pool}=': {problem}")
    return pool, url


def named_pools(g: GatewayConfig) -> list[str]:
    """The pools the configuration names: ``gateway.pool`` and every ``gateway.pools`` entry's
    (a replica's ``pool=url`` or a pool's name alone), in that order, each once."""
    return list(dict.fromkeys([g.pool, *(split_pool_spec(spec)[0] for spec in g.pools)]))


def _pool_spec_problem(spec: str) -> str | None:
    try:
        split_pool_spec(spec)
    except ValueError as exc:
        return str(exc)
    return None


def split_engine_spec(spec: str) -> tuple[str, str]:
    """``pool=engine`` (``engine.types``) as (pool, engine type); ValueError says why not. The
    engine may also be spelled as a pod's engine-type label spells it (``trtllm-serve``)."""
    pool, sep, engine = spec.partition("=")
    if not sep:
        raise ValueError(f"expected pool=engine with engine one of {'|'.join(names.ENGINE_TYPES)}")
    if (problem := label_problem(pool)) is not None:
        raise ValueError(f"pool name {problem}")
    engine = names.ENGINE_LABEL_VALUES.get(engine.lower(), engine)
    if engine not in names.ENGINE_TYPES:
        raise ValueError(f"engine after '{pool}=' must be one of {', '.join(names.ENGINE_TYPES)} "
                         f"(or a pod label's {', '.join(sorted(set(names.ENGINE_LABEL_VALUES) - set(names.ENGINE_TYPES)))})")
    return pool, engine


def _engine_spec_problem(spec: str) -> str | None:
    try:
        split_engine_spec(spec)
    except ValueError as exc:
        return str(exc)
    return None


def _engine_specs_problem(specs: list[str]) -> str | None:
    if (problem := _each(_engine_spec_problem)(specs)) is not None:
        return problem
    pools = [spec.partition("=")[0] for spec in specs]
    dup = next((p for p in pools if pools.count(p) > 1), None)
    return None if dup is None else f"pool {_shown_value(dup)} is listed twice"


def dsn_problem(value: str) -> str | None:
    """Why psycopg cannot parse ``value`` as a DSN (URL or key=value), else None (also for empty:
    the embedded store). The driver's reason is scrubbed: it echoes the bad token, often the password."""
    if value == "":
        return None
    import psycopg

    from llmsla.redaction import scrub, secrets_of

    try:
        psycopg.conninfo.conninfo_to_dict(value)
    except psycopg.ProgrammingError as exc:
        return "malformed DSN: " + scrub(str(exc).strip().splitlines()[0], secrets_of(value))
    return None


def redis_url_problem(value: str) -> str | None:
    """Why redis-py would refuse ``value`` (``redis://``, ``rediss://`` or ``unix://``), else None
    (also for empty: router state in process). With redis-py installed its own parser decides."""
    if value == "":
        return None
    if not value.isprintable() or any(c.isspace() for c in value):
        return "contains whitespace or control characters"
    if not value.startswith(("redis://", "rediss://", "unix://")):
        return "must start with redis://, rediss:// or unix://"
    try:
        from redis.connection import parse_url
    except ImportError:  # the redis extra is not installed: the same scheme and port rules
        try:
            urlsplit(value).port  # noqa: B018 - raises for a port that is not a number or out of range
        except ValueError as exc:
            return f"not a URL: {exc}"
        return None
    try:
        parse_url(value)
    except ValueError as exc:
        from llmsla.redaction import redact

        return f"not a Redis URL: {redact(str(exc))}"
    return None


_DURATION = re.compile(r"^(\d+(?:\.\d+)?)([smhdw]?)$")
#: seconds per unit of a duration (``24h``, ``14d``); the command line's relative times use the same
DURATION_UNIT_S = {"": 1.0, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 604800.0}


def duration_s(value: str) -> float:
    """A duration key's value in seconds: a number with an optional unit (``90``, ``30m``,
    ``24h``, ``14d``, ``1w``); ``0`` is zero. Raises ValueError with :func:`duration_problem`'s words."""
    m = _DURATION.match(value.strip())
    if m is None:
        raise ValueError(f"not a duration: {value!r} (a number with an optional unit s, m, h, d or w: 24h, 14d)")
    return float(m.group(1)) * DURATION_UNIT_S[m.group(2)]


def duration_problem(value: str) -> str | None:
    """Why ``value`` is not a duration (see :func:`duration_s`), else None."""
    try:
        duration_s(value)
    except ValueError as exc:
        return str(exc)
    return None


def _positive_duration_problem(value: str) -> str | None:
    problem = duration_problem(value)
    if problem is None and duration_s(value) <= 0:
        return "must be more than 0"
    return problem


def token_problem(value: str) -> str | None:
    """Why ``value`` cannot be a bearer token, else None (also for empty, which keeps the key's
    documented meaning: writes refused). Never echoes the value."""
    if value == "":
        return None
    if any(c.isspace() for c in value):
        return "must not contain whitespace (an HTTP client strips or splits it: the token could never match)"
    if not all("!" <= c <= "~" for c in value):
        return "must be printable ASCII (an HTTP header cannot carry other characters)"
    if len(value) < MIN_TOKEN_CHARS:
        return (f"too short: {len(value)} characters, at least {MIN_TOKEN_CHARS} are required "
                "(e.g. python -c 'import secrets; print(secrets.token_urlsafe(24))')")
    return None


def _share_problem(value: float) -> str | None:
    return None if value > 0 else f"must be > 0 (a share of gateway.max_in_flight; 1 = no per-client bound), got {value!r}"


def network_problem(value: str) -> str | None:
    """Why ``value`` is not an IP address or CIDR network (``10.0.0.0/8``, ``fd00::/8``), else
    None; a network with host bits set (``10.0.0.1/8``) is refused: /8 or the one host?"""
    import ipaddress

    try:
        ipaddress.ip_network(value.strip(), strict=True)
    except ValueError as exc:
        return str(exc)
    return None


#: RFC 9110 token characters: what a header field name may be made of.
_TCHARS = frozenset("!#$%&'*+-.^_`|~0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ")


def header_name_problem(value: str) -> str | None:
    """Why ``value`` cannot be an HTTP header name, else None."""
    if not value:
        return "must not be empty"
    if len(value) > 64:
        return f"longer than 64 characters ({len(value)})"
    if not set(value) <= _TCHARS:
        return "not an HTTP header name (letters, digits and !#$%&'*+-.^_`|~ only)"
    return None


def _theta_problem(value: float) -> str | None:
    return None if value < 1 else f"must be < 1 (an EMA memory), got {value!r}"


def _shown_value(value: str, limit: int = 80) -> str:
    """``value`` as an error message may show it: redacted, cut to ``limit`` characters."""
    from llmsla.redaction import redact

    text = redact(value)
    return repr(text if len(text) <= limit else text[: limit - 3] + "...")


def _each(check: Check) -> Check:
    """``check`` for every item of a list key; the message names the item (index, redacted)."""
    def run(values: list[Any]) -> str | None:
        for i, v in enumerate(values):
            if (problem := check(v)) is not None:
                return f"[{i}] {_shown_value(v)}: {problem}"
        return None
    run.__doc__ = check.__doc__
    return run


def default_data_dir() -> Path:
    from platformdirs import user_data_dir

    return Path(user_data_dir("llmsla", appauthor=False))


@dataclass
class StoreConfig:
    """Where windows, dead letters, forecasts and the audit log live."""

    dsn: str = _k("", "PostgreSQL/TimescaleDB DSN; empty starts the embedded PostgreSQL (also LLMSLA_DSN)", check=dsn_problem)
    data_dir: str = _k("", "data dir of the embedded PostgreSQL; empty = <user data dir>/llmsla/pg")
    timescale: str = _k("auto", "use TimescaleDB: auto (if installed), require, or off", choices=("auto", "require", "off"))
    retention_days: int = _k(30, "days of windows, dead letters and audit rows to keep", minimum=1)
    partitions_ahead_days: int = _k(7, "daily partitions created ahead of time (plain PostgreSQL)", minimum=1)
    compress_after_days: int = _k(2, "TimescaleDB: compress (columnstore) chunks older than this", minimum=1)
    connect_timeout_s: float = _k(10.0, "seconds to wait for the database to accept connections", minimum=0.1)


@dataclass
class SpoolConfig:
    """The event transport on one machine: a directory of JSON-lines segments."""

    dir: str = _k("", "spool root directory; empty = <user data dir>/llmsla/spool")
    segment_max_bytes: int = _k(8 << 20, "publish a segment when it reaches this size", minimum=1024)
    segment_max_age_s: float = _k(1.0, "publish a segment at most this long after it was opened", minimum=0.01)
    max_total_bytes: int = _k(10 << 30, "per kind, bytes on disk at most: past it writes are held, then dropped and counted (see write_retry_s)", minimum=1 << 20)
    retention_s: float = _k(86400.0, "delete published segments older than this", minimum=1)
    write_retry_s: float = _k(10.0, "retry a failed write (disk full or read-only, over max_total_bytes) this long, "
                              "then drop its events, counted in llmsla_spool_dropped_total", minimum=0)
    max_pending_bytes: int = _k(8 << 20, "per writer, hold at most this many bytes of events in memory while writes "
                                "fail; past it new events are dropped and counted", minimum=1 << 16)


@dataclass
class SloConfig:
    """Where the SLO specs are, and the thresholds a spec may delegate here (value: slo.ttft_ms)."""

    dir: str = _k("", "directory of the OpenSLO specs every component reads (empty: deploy/slo in the working directory, else the packaged defaults)")
    ttft_ms: float = _k(800.0, "time-to-first-token threshold, ms, for a spec whose value is slo.ttft_ms (must be a bound of metrics.ttft_buckets)", minimum=0)
    e2e_ms: float = _k(10000.0, "end-to-end latency threshold, ms, for a spec whose value is slo.e2e_ms", minimum=0)
    itl_ms: float = _k(100.0, "time per output token threshold, ms, for a spec whose value is slo.itl_ms (llmsla_request_time_per_output_token_seconds, per request)", minimum=0)
    min_requests: int = _k(20, "low-traffic guard: no burn-rate alert fires while its long window holds fewer requests than this (per model and pool, and per tenant/class for a spec that targets one; per replica for the replica page); 0 = none, as Sloth", minimum=0)
    latency_target: float = _k(0.99, "deprecated, no effect: each SLO's target is its spec's objectives[0].target", minimum=0, kind="deprecated")
    availability_target: float = _k(0.999, "deprecated, no effect: the availability target is its spec's objectives[0].target", minimum=0, kind="deprecated")
    window_days: int = _k(30, "deprecated, no effect: each SLO's window is its spec's timeWindow", minimum=1, kind="deprecated")


@dataclass
class MetricsConfig:
    """Prometheus histograms and label cardinality."""

    ttft_buckets: list[float] = _k(list(names.TTFT_BUCKETS), "TTFT histogram bounds, seconds")
    itl_buckets: list[float] = _k(list(names.ITL_BUCKETS), "bounds of the per-token histograms (time per output token, inter-chunk gaps), seconds")
    e2e_buckets: list[float] = _k(list(names.E2E_BUCKETS), "end-to-end latency bounds, seconds")
    queue_buckets: list[float] = _k(list(names.QUEUE_BUCKETS), "gateway queue time bounds, seconds")
    label_top_n: int = _k(50, "per label, distinct values kept before the rest become 'other'", minimum=1)
    allowed_models: list[str] = _k([], "if set, model label values outside this list become 'other'", check=_each(label_problem))
    allowed_pools: list[str] = _k([], "if set, pool label values outside this list become 'other'", check=_each(label_problem))
    allowed_arms: list[str] = _k([], "if set, arm label values outside this list become 'other'", check=_each(label_problem))


@dataclass
class GatewayConfig:
    """The instrumented OpenAI-compatible proxy."""

    host: str = _k("127.0.0.1", "listen address (loopback by default; 0.0.0.0 = every interface)", kind="host")
    port: int = _k(8000, "listen port", kind="port")
    upstreams: list[str] = _k([], "replica base URLs, e.g. http://127.0.0.1:9001", check=_each(url_problem))
    student_upstreams: list[str] = _k([], "distilled student replicas of the same pool; the pool's student share (control API) routes to them, the upstreams are then the teachers", check=_each(url_problem))
    pool: str = _k("default", "pool name of these upstreams (a label of every event: at most 256 characters)", check=label_problem)
    pools: list[str] = _k([], "other pools an A/B arm may send its units to (its strategy's pool), each with the distillation and shedding controls of a pool: pool=url for a replica of it, e.g. canary=http://127.0.0.1:9002, or with gateway.discovery other than static the pool's name alone, its replicas found by discovery (a pod label, the discovery file)", check=_each(_pool_spec_problem))
    discovery: str = _k("static", "where the replicas come from: static (gateway.upstreams, student_upstreams, pools; ids r0, r1, ...), file (gateway.discovery_file, re-read on change), dns (gateway.discovery_dns, re-resolved) or kubernetes (the pods of gateway.discovery_kubernetes, listed from the API); discovered replicas join after a healthy probe, leave after draining, and are named by their address", choices=DISCOVERY_SOURCES)
    discovery_file: str = _k("", "with discovery = file: a file of [pool=]url lines (# comments), e.g. http://10.0.0.7:8000 or canary=http://10.0.0.9:8000")
    discovery_dns: str = _k("", "with discovery = dns: name:port resolved to A/AAAA records (a headless Service, e.g. llmsla-worker.llmsla.svc.cluster.local:8000), or an SRV name _service._proto.name (needs the dns extra); http:// or https:// may lead", check=dns_target_problem)
    discovery_kubernetes: str = _k("", "with discovery = kubernetes: a label selector of the inference pods, e.g. app=vllm; the ready ones (Running, Ready, not being deleted) are the replicas, each read as the engine its inference.networking.k8s.io/engine-type label names", check=selector_problem)
    discovery_kubernetes_namespace: str = _k("", "with discovery = kubernetes: the pods' namespace; empty = the gateway's own (its service account's)")
    discovery_kubernetes_port: str = _k("8000", "with discovery = kubernetes: the replicas' port, a number or a container port's name (e.g. http)", check=port_problem)
    discovery_kubernetes_pool_label: str = _k("", "with discovery = kubernetes: a pod label whose value is the replica's pool (e.g. llmsla.dev/pool); empty, or a pod without it: gateway.pool")
    discovery_kubernetes_api: str = _k("", "with discovery = kubernetes: the API server's URL; empty = in the pod's cluster (KUBERNETES_SERVICE_HOST, the service account's token and CA); http://127.0.0.1:8001 for kubectl proxy", check=_optional_url)
    discovery_interval_s: float = _k(5.0, "how often the discovery file is checked for changes, the DNS name re-resolved or the pods listed", minimum=0.1, maximum=3600)
    engine_signals: bool = _k(False, "scrape each replica's own /metrics (vLLM, SGLang, trtllm-serve, Triton; engine.* sets the interval, timeout, size and engine types) and give the router its queue and KV-cache usage, for LADR's engine scorers (control.ladr_engine_queue, control.ladr_engine_kv)")
    request_timeout_s: float = _k(300.0, "give up on an upstream request after this long", minimum=0.1)
    max_body_bytes: int = _k(1 << 20, "reject request bodies larger than this (413)", minimum=1024)
    max_in_flight: int = _k(1024, "reject (429, status rejected) past this many concurrent requests", minimum=1)
    max_concurrency: int = _k(256, "upstream requests in flight at once; the rest wait in the gateway queue", minimum=1)
    client_share: float = _k(0.5, "the most of max_in_flight one client may hold at once (at least 1 request, floor(share x max_in_flight)); past it 429 before the body is read; 1 = no per-client bound. A client is its peer address, or behind gateway.trusted_proxies the gateway.client_header", minimum=0, maximum=1, check=_share_problem)
    trusted_proxies: list[str] = _k([], "peers (IP addresses or CIDR networks, e.g. 10.0.0.0/8) whose gateway.client_header names the client (an ingress, a load balancer, an auth proxy); the header of any other peer is ignored", check=_each(network_problem))
    client_header: str = _k("X-Forwarded-For", "header naming the client when the peer is a trusted proxy: X-Forwarded-For (its rightmost address that is not a trusted proxy) or any other header (its whole value, e.g. an auth proxy's X-Client-Id)", check=header_name_problem)
    max_prompt_chars: int = _k(65536, "reject prompts (all message contents) longer than this many characters (400)", minimum=1)
    fast_path: bool = _k(True, "serve POST /v1/chat/completions and /v1/completions on the gateway's own HTTP/1.1 protocol (httptools), which costs a core a fraction of the general server; every other path, and any request the fast path does not take (a Content-Encoding, Expect, Upgrade, a head split over reads), is served by the general server on the same port. false = the general server for everything")
    request_usage: bool = _k(True, "ask a streaming upstream for its token usage (stream_options.include_usage) when the client did not, and strip that chunk from what the client receives")
    workers: int = _k(1, "gateway processes sharing the port (SO_REUSEPORT, multi-process metrics)", minimum=1)


def _optional_header_name(value: str) -> str | None:
    return None if value == "" else header_name_problem(value)


#: Tenant names a configuration may not declare: the values the gateway gives requests that name
#: no declared tenant (``other``) and every request while tenants are off (``default``).
RESERVED_TENANTS = (names.LABEL_OVERFLOW_VALUE, names.DEFAULT_TENANT)


def tenant_problem(value: Any) -> str | None:
    """Why ``value`` cannot be a declared tenant's name, else None."""
    if not isinstance(value, str):
        return f"a tenant name must be a string, got {type(value).__name__}"
    if value in RESERVED_TENANTS:
        return f"{value!r} is reserved (the tenant of requests that name no declared tenant, or of all while tenants are off)"
    return label_problem(value)


def _classes_problem(values: list[str]) -> str | None:
    if not values:
        return "must name at least one class"
    if (problem := _each(label_problem)(values)) is not None:
        return problem
    dup = next((c for c in values if values.count(c) > 1), None)
    return None if dup is None else f"class {_shown_value(dup)} is listed twice"


def _declared_problem(value: dict[str, Any]) -> str | None:
    """``tenants.declared``: tenant -> its default class (checked against tenants.classes at start-up)."""
    for tenant, cls in value.items():
        if (problem := tenant_problem(tenant)) is not None:
            return f"tenant {_shown_value(tenant)}: {problem}"
        if not isinstance(cls, str) or (problem := label_problem(cls)) is not None:
            return f"tenant {_shown_value(tenant)}: its default class {problem or 'must be a string'}"
    return None


def _api_keys_problem(value: dict[str, Any]) -> str | None:
    """``tenants.api_keys``: API key -> tenant. Never echoes a key: the message names its tenant."""
    for key, tenant in value.items():
        if (problem := tenant_problem(tenant)) is not None:
            return f"an API key's tenant: {problem}"
        if not key or (problem := token_problem(key)) is not None:
            return f"the API key of tenant {_shown_value(tenant)}: {problem or 'must not be empty'}"
    return None


@dataclass
class TenantsConfig:
    """Who a request is for (its tenant) and how it is served (its class): labels of the gateway's request series and events (docs/gateway.md#tenants-and-classes)."""

    header: str = _k("", "header naming the request's tenant, set by the user's auth proxy; believed only from gateway.trusted_proxies (any other peer's is ignored); empty = no tenant header", check=_optional_header_name)
    api_keys: dict[str, Any] = _k({}, "API key -> tenant: a request whose Authorization: Bearer key is listed is that tenant's (before the header); [tenants.api_keys] table, in the environment as JSON; never shown or logged", kind="secret", check=_api_keys_problem)
    api_keys_file: str = _k("", "a JSON object file of more API key -> tenant pairs (a mounted Kubernetes Secret), read at start-up; empty = none")
    declared: dict[str, Any] = _k({}, "tenant -> its default class: the tenants that keep their own label; any other tenant name is 'other'; [tenants.declared] table, in the environment as JSON", check=_declared_problem)
    classes: list[str] = _k(list(names.DEFAULT_CLASSES), "request classes, most protected first: a request may ask (tenants.class_header) for its tenant's default class or a later one, never an earlier one", check=_classes_problem)
    class_header: str = _k(names.CLASS_HEADER, "header a request names its class in (llm-d's InferenceObjective header); a value that is not one of tenants.classes, or an earlier class than its tenant's default, leaves the default; empty = the tenant's default only", check=_optional_header_name)
    default_class: str = _k("", "class of requests of tenant 'other' (no declared tenant) and of every request while tenants are off; empty = the first of tenants.classes", check=_optional_label)

    def enabled(self) -> bool:
        """Requests are told apart by tenant (a header or an API-key map is configured)."""
        return bool(self.header or self.api_keys or self.api_keys_file)


@dataclass
class WorkerConfig:
    """The reference CPU inference worker."""

    host: str = _k("127.0.0.1", "listen address (loopback by default; 0.0.0.0 = every interface)", kind="host")
    port: int = _k(9001, "listen port", kind="port")
    model: str = _k("llmsla-tiny", "model name served", check=label_problem)
    max_batch: int = _k(16, "continuous-batching limit", minimum=1)
    kv_blocks: int = _k(0, "KV-cache blocks of 16 tokens the engine may hold, as vLLM's num_gpu_blocks; 0 = max_batch x the context (every running request can reach its full context); fewer make admission wait for blocks and preempt the newest request (recompute) when a decode step needs one", minimum=0)
    max_tokens: int = _k(256, "cap on generated tokens per request", minimum=1)
    max_prompt_tokens: int = _k(2048, "reject longer prompts (400)", minimum=1)
    seed: int = _k(0, "seed of the deterministic weights", minimum=0)
    train_steps: int = _k(0, "steps of warm-up training on the bundled public-domain text at start (deterministic; ~0.15 s each)", minimum=0)
    threads: int = _k(1, "torch intra-op threads of the engine thread", minimum=1)
    pool: str = _k("default", "the pool this worker serves: the `zone` label of its temperature-policy decisions (spans, PolicyEvents, metrics), which the dashboards join to the pool's requests", check=label_problem)
    temperature_policy: str = _k(names.DEFAULT_POLICY, "default temperature policy; a request may pick one with body field llmsla_policy", choices=names.TEMPERATURE_POLICIES)
    temperature_min: float = _k(0.1, "policy lower bound T_min (the request's temperature is T_max)", minimum=0)
    policy_decay: float = _k(0.98, "exponential policy: T(s) = max(T_min, T_max * decay^s)", minimum=0)
    entropy_target: float = _k(2.5, "entropy policy: target next-token entropy, nats", minimum=0)
    entropy_band: float = _k(0.25, "entropy policy: hold while |entropy - target| is within this, nats", minimum=0)
    entropy_gain: float = _k(0.5, "entropy policy: T <- T * exp(gain * (target - entropy))", minimum=0)
    admin_port: int = _k(0, "fault-injection admin endpoint (POST /admin/fault: slowdown, down) on 127.0.0.1:PORT, always loopback, for demos and tests; 0 = none", minimum=0, maximum=65535)
    admin_token: str = _k("", "bearer token the admin endpoint requires (also LLMSLA_WORKER_ADMIN_TOKEN); empty refuses every fault; else at least 16 characters, no whitespace", kind="secret", check=token_problem)


@dataclass
class HttpConfig:
    """Bounds on slow and numerous clients, for every llmsla HTTP server."""

    header_timeout_s: float = _k(10.0, "close a connection whose request line and headers are not complete this long after their first byte (slowloris)", minimum=0.1)
    body_timeout_s: float = _k(30.0, "answer 408 when a request body is not complete after this long", minimum=0.1)
    keepalive_timeout_s: float = _k(75.0, "close idle keep-alive connections after this long (keep it above your load balancer's idle timeout)", minimum=0.1)
    max_connections: int = _k(4096, "open connections per server process; the next get a bare 503 and are closed", minimum=1)


@dataclass
class OtelConfig:
    """OpenTelemetry: GenAI request spans, policy decision spans, opt-in OTLP metrics (docs/opentelemetry.md)."""

    endpoint: str = _k("", "OTLP/HTTP traces endpoint, e.g. http://collector:4318/v1/traces; empty = no trace export (the gateway makes no spans, the worker only spools policy decisions)", check=_optional_url)
    service_name: str = _k("llmsla", "service.name resource attribute (the worker adds -worker)")
    sample_ratio: float = _k(1.0, "share of new traces recorded, 0..1; parent-based: a caller's traceparent flags decide for its requests", minimum=0, maximum=1)
    metrics_endpoint: str = _k("", "OTLP/HTTP metrics endpoint for the gateway's gen_ai.* metrics, e.g. http://collector:4318/v1/metrics; empty = none (Prometheus /metrics is unaffected)", check=_optional_url)
    metrics_interval_s: float = _k(10.0, "seconds between OTLP metric exports (cumulative)", minimum=0.1)
    token_estimates: bool = _k(False, "when an upstream reports no usage, put llmsla's estimates (prompt characters / 4, counted chunks) on the gateway span as llmsla.usage.estimated_*_tokens (never gen_ai.usage.*)")


@dataclass
class GpuConfig:
    """The NVML collector."""

    interval_s: float = _k(5.0, "seconds between samples", minimum=0.1)
    node: str = _k("", "node label; empty = host name", check=_optional_label)
    host: str = _k("127.0.0.1", "listen address of `llmsla gpu` (/metrics)", kind="host")
    port: int = _k(9400, "listen port of `llmsla gpu` (/metrics)", kind="port")


@dataclass
class EngineConfig:
    """The engine adapters (`llmsla engines`): each replica's own /metrics, normalised."""

    scrape_interval_s: float = _k(1.0, "seconds between two scrapes of one replica's /metrics", minimum=0.05)
    timeout_s: float = _k(0.8, "give up on one scrape after this long (connect, headers and body together)", minimum=0.01)
    max_bytes: int = _k(8 << 20, "largest /metrics body read; a longer one is a failed scrape (a replica that streams forever)", minimum=1024)
    backoff_max_s: float = _k(30.0, "a failing replica is retried after scrape_interval_s, doubling per failure up to this", minimum=0.05)
    types: list[str] = _k([], f"engine type per pool as pool=engine, engine one of {', '.join(names.ENGINE_TYPES)} "
                              f"(or as the pod label {names.ENGINE_TYPE_POD_LABEL} spells it: trtllm-serve, triton-tensorrt-llm); a pool not listed is auto (by metric prefix); a trtllm pool is scraped at /prometheus/metrics, where trtllm-serve serves Prometheus metrics",
                          check=_engine_specs_problem)
    host: str = _k("127.0.0.1", "listen address of `llmsla engines` (/metrics)", kind="host")
    port: int = _k(9402, "listen port of `llmsla engines` (/metrics)", kind="port")

    def engine_of(self, pool: str) -> str:
        """The configured engine type of ``pool`` (``auto`` when it is not listed)."""
        for spec in self.types:
            p, engine = split_engine_spec(spec)
            if p == pool:
                return engine
        return names.ENGINE_AUTO


@dataclass
class StreamConfig:
    """The PyFlink windowing job."""

    parallelism: int = _k(1, "Flink parallelism", minimum=1)
    checkpoint_interval_s: float = _k(10.0, "checkpoint interval", minimum=0.1)
    checkpoint_dir: str = _k("", "checkpoint directory; empty = <user data dir>/llmsla/checkpoints")
    watermark_delay_s: float = _k(2.0, "bounded out-of-orderness of event time (spool: within one writer's events)", minimum=0)
    allowed_lateness_s: float = _k(0.0, "extra lateness accepted after the watermark", minimum=0)
    idle_timeout_s: float = _k(5.0, "a spool writer (Kafka: a partition) without new data for this long stops holding the watermark back", minimum=0.1)
    max_future_s: float = _k(300.0, "dead-letter events stamped further than this in the future", minimum=0)
    max_past_s: float = _k(7 * 86400.0, "dead-letter events older than this", minimum=1)
    sink_batch_rows: int = _k(5000, "flush the store sink's buffer (dead letters, policy rows; the fallback's windows) after this many rows", minimum=1)
    sink_flush_s: float = _k(1.0, "flush the store sink when no output came for this long", minimum=0.01)
    sink_max_wait_s: float = _k(5.0, "flush the store sink at the latest this long after its first buffered row, even while output keeps coming (a backlog)", minimum=0.01)
    source: str = _k("spool", "spool or kafka", choices=("spool", "kafka"))
    kafka_bootstrap: str = _k("", "Kafka bootstrap servers (source = kafka)")
    kafka_jar: str = _k("", "path of flink-sql-connector-kafka jar (source = kafka)")
    kafka_topic_prefix: str = _k("llmsla.", "Kafka topic of a kind is <prefix><kind> (requests, policy, gpu)")
    monitor_interval_s: float = _k(1.0, "how often the spool source looks for newly published segments", minimum=0.01)
    sink_retry_s: float = _k(30.0, "keep retrying store writes this long before failing the job", minimum=0)
    restart_attempts: int = _k(3, "Flink restarts (from the last checkpoint) before the job fails", minimum=0)
    watermark_interval_ms: int = _k(200, "periodic watermark emission interval (pipeline.auto-watermark-interval)", minimum=1)
    metrics_host: str = _k("127.0.0.1", "listen address of `llmsla stream`'s /metrics (dead letters and window lag, read from the store)", kind="host")
    metrics_port: int = _k(9467, "listen port of `llmsla stream`'s /metrics; 0 = a free port (logged)", kind="port0")
    python_executable: str = _k("", "Python interpreter a Flink cluster's TaskManagers run the job's Python operators with (python.executable; it needs llmsla's dependencies) under `llmsla stream --jobmanager`; empty = the submitting interpreter (right for `llmsla flink start` on the same machine)")
    java_parser: bool = _k(True, "parse each spool line once into typed columns with the Java llmsla-json table format (built with javac on first use); false or no javac = one JSON_VALUE per field")


@dataclass
class ControlConfig:
    """Router, distillation controls and their HTTP control API."""

    host: str = _k("127.0.0.1", "control API listen address (loopback by default)", kind="host")
    port: int = _k(8100, "control API port", kind="port")
    token: str = _k("", "bearer token the control API requires (also LLMSLA_CONTROL_TOKEN); empty refuses all writes; else at least 16 characters, no whitespace", kind="secret", check=token_problem)
    route_policy: str = _k("ladr", "router policy", choices=names.ROUTE_POLICIES)
    urls: list[str] = _k([], "where clients (the receiver, ab report --rollback) reach the control API: base URLs tried in order; empty = http://<host>:<port> of this section (writes need control.token)", check=_each(url_problem))
    redis_url: str = _k("", "Redis URL (redis://, rediss:// or unix://) for router state shared by gateway replicas; empty = in process", check=redis_url_problem)
    ladr_alpha: float = _k(1.0, "LADR score weight of 1 / latency (latency relative to the pool's fastest replica)", minimum=0)
    ladr_beta: float = _k(1.0, "LADR score weight of the queue (live outstanding relative to the pool's mean)", minimum=0)
    ladr_sharpness: float = _k(8.0, "LADR picks with probability ~ exp(sharpness * score): 0 = uniform, larger = greedier", minimum=0)
    ladr_theta: float = _k(0.7, "LADR EMA memory of the latency: L = theta * previous + (1 - theta) * window mean (< 1)", minimum=0, check=_theta_problem)
    ladr_refresh_s: float = _k(0.2, "LADR score refresh cadence, seconds (also the Redis sync cadence)", minimum=0.001)
    ladr_ttl_s: float = _k(1.0, "LADR drops replicas whose stats are older than this, seconds", minimum=0.001)
    ladr_engine_queue: float = _k(0.0, "LADR score weight of the engine queue scorer (waiting requests from the replica's /metrics, min-max over the pool; 0 = ignore engine queues)", minimum=0)
    ladr_engine_kv: float = _k(0.0, "LADR score weight of the engine KV-cache scorer (1 - KV usage from the replica's /metrics; 0 = ignore)", minimum=0)
    ladr_ect: float = _k(0.0, "LADR score weight of the expected completion time (each replica's speed learnt from the completions and first tokens it returned, times its live queue and the pool's recent output length, relative to the best replica's; 0 = off; 3 with ladr_alpha = ladr_beta = 0 is what docs/control.md measured)", minimum=0)
    ladr_ect_cadence: float = _k(0.1, "how much each reading of a replica's decode speed from the tokens its streams are returning now moves its learnt speed (0..1; 0 = only completed requests teach it, and a replica slowed now is noticed seconds later); used when ladr_ect > 0", minimum=0, maximum=1)
    max_share_step_pct: float = _k(10.0, "largest student-share change per control action, percentage points", minimum=0)
    max_temperature_step: float = _k(0.5, "largest change of a temperature schedule bound (t_min/t_max/t_init) per action", minimum=0)

    def client_urls(self) -> list[str]:
        """The control API as its clients reach it: ``urls``, else this section's own listen
        address (a wildcard listen address is reached on loopback)."""
        if self.urls:
            return [u.rstrip("/") for u in self.urls]
        host = "127.0.0.1" if self.host in ("0.0.0.0", "::") else self.host
        return [f"http://[{host}]:{self.port}" if ":" in host else f"http://{host}:{self.port}"]


@dataclass
class ForecastConfig:
    """The degradation forecaster (LSTM): data, training, evaluation and the online scorer."""

    dir: str = _k("", "data sets and model artifacts; empty = <user data dir>/llmsla/forecast")
    window_steps: int = _k(64, "input window W, 5 s steps", minimum=2)
    horizon_steps: int = _k(5, "label horizon H: an SLO breach within the next H steps", minimum=1)
    horizons_s: list[float] = _k([], "training: several label horizons in seconds (e.g. [30, 120, 300, 600]), one model head, threshold and alert each; empty = horizon_steps alone", check=_horizons_problem)
    features: list[str] = _k([], "the input features of new models (forecast train, train --from-store, the unattended retrain); empty = the default 12; add engine_waiting, engine_kv_usage, engine_preemptions_per_s where `llmsla engines` scrapes the replicas, gpu_temp_c where GPUs throttle (docs/forecaster.md#feature-lists-per-model). A model keeps its own list: serve, eval, backtest and the gate read the artifact's", check=_features_problem)
    slo_window_steps: int = _k(12, "SLO evaluation window of a label, 5 s steps (counts merged exactly)", minimum=1)
    hidden: int = _k(50, "LSTM hidden units", minimum=1)
    layers: int = _k(1, "LSTM layers", minimum=1)
    dropout: float = _k(0.3, "dropout after the LSTM and the dense layer", minimum=0)
    dense: int = _k(32, "dense layer width", minimum=1)
    epochs: int = _k(30, "maximum training epochs (early stopping on validation AUC-PR)", minimum=1)
    patience: int = _k(4, "epochs without validation improvement before stopping", minimum=1)
    batch_size: int = _k(256, "training batch size", minimum=1)
    lr: float = _k(0.001, "Adam learning rate", minimum=0)
    seed: int = _k(0, "training seed (deterministic on the CPU for a seed and thread count)", minimum=0)
    balance_onsets: bool = _k(True, "training: positives ahead of a breach onset weigh as much as those inside a breach (early warning over persistence)")
    label_from_fault_start: bool = _k(False, "training on simulated replays: a window before a precursor fault began is a negative, and the look-ahead of a breach with no precursor fault is left out of the loss (a store history has no faults: no effect)")
    fault_negative_weight: float = _k(1.0, "training on simulated replays: loss weight of the negatives inside a precursor fault (about half the injected faults never break the SLO; no effect on a store history)", minimum=0)
    threads: int = _k(1, "torch CPU threads for training and scoring (a 50-unit LSTM gains little from more; on a shared machine two oversubscribed threads trained ~10x slower than one)", minimum=1)
    false_alarms_per_day: float = _k(4.0, "alarm threshold target: false alarms per target per healthy day, chosen on validation", minimum=0)
    threshold_confidence: float = _k(0.0, "threshold rule: > 0 = the threshold keeps the upper bound (Poisson, this confidence) of validation false alarms within false_alarms_per_day, not the count alone (0 = the count rule); forecast train, train --from-store, backtest and the benches", minimum=0, maximum=0.999)
    lead_max_steps: int = _k(24, "an alarm up to this many steps before a breach counts as an early warning", minimum=1)
    interval_s: float = _k(5.0, "online: seconds between scoring steps", minimum=0.1)
    lag_s: float = _k(10.0, "online: score the last 5 s window that ended at least this long ago (streaming latency)", minimum=0)
    reread_s: float = _k(30.0, "online: re-read the newest windows this far back every step (late upserts); older ones are read once", minimum=0)
    receiver_url: str = _k("", "online: Alertmanager webhook v4 receiver URL for forecast alerts; empty = no alerts", check=_optional_url)
    receiver_token: str = _k("", "online: bearer token sent to the receiver (also LLMSLA_FORECAST_RECEIVER_TOKEN); at least 16 characters, no whitespace", kind="secret", check=token_problem)
    fire_steps: int = _k(2, "online: consecutive steps at or above the threshold before an alert fires", minimum=1)
    fire_window: int = _k(0, "online and evaluation: k-of-n persistence, an alert fires on a step at or above the threshold when fire_steps of the last fire_window steps were (0 = fire_steps in a row)", minimum=0, maximum=60)
    resolve_steps: int = _k(6, "online: consecutive steps below resolve_ratio x threshold before it resolves", minimum=1)
    idle_s: float = _k(60.0, "online: a target that served no request for this long is not scored and its alert resolves (nothing to forecast: a drained replica)", minimum=5.0)
    resolve_ratio: float = _k(0.8, "online: hysteresis, resolve below this share of the threshold", minimum=0)
    accuracy_window_s: float = _k(86400.0, "online: the forecaster's own precision, recall, lead and false alarms are scored over this rolling window of stored history", minimum=300)
    accuracy_every_steps: int = _k(60, "online: score the forecaster's own accuracy every this many steps (0 = never)", minimum=0)
    repeat_s: float = _k(300.0, "online: re-send a firing alert this often", minimum=1)
    host: str = _k("127.0.0.1", "online: listen address of /metrics (llmsla_forecast_risk)", kind="host")
    port: int = _k(9465, "online: /metrics port", kind="port")
    gpu_map: list[str] = _k([], "replica=node/gpu pairs for GPU features; empty = the fleet simulator's layout (rN on sim-N//8, GPU N%8)")
    promote_margin: float = _k(0.02, "model registry gate: a retrained model replaces the champion when its held-out breach recall is at least the champion's plus this (absolute), at no more false alarms per target-day than the champion's (or false_alarms_per_day, if that is more)", minimum=0, maximum=1)
    retrain_every: str = _k("0", "online: `forecast serve` retrains on the store's history this often and runs the gate (24h, 7d; 0 = never); a failed retrain is logged and the champion kept", check=duration_problem)
    retrain_history: str = _k("14d", "how much history, up to now, an unattended retrain reads (14d)", check=_positive_duration_problem)
    registry_poll_s: float = _k(60.0, "online: check the model registry this often for a newly promoted champion (0 = never; serving a --model never checks)", minimum=0)

    def root(self) -> Path:
        return Path(self.dir) if self.dir else default_data_dir() / "forecast"


@dataclass
class ReceiverConfig:
    """The alert receiver: Alertmanager webhook v4 in, router/distillation actions out."""

    host: str = _k("127.0.0.1", "listen address (loopback by default)", kind="host")
    port: int = _k(8200, "listen port", kind="port")
    token: str = _k("", "bearer token Alertmanager and the forecaster must send (also LLMSLA_RECEIVER_TOKEN); empty refuses every post; else at least 16 characters, no whitespace", kind="secret", check=token_problem)
    action_policy: str = _k("", "action policy file (YAML) mapping alerts to actions; empty = the built-in llmsla/alerting/policy.default.yaml")
    control_timeout_s: float = _k(2.0, "timeout of one control API call", minimum=0.01)
    control_retries: int = _k(3, "attempts per control API action before it is audited as failed (the reconciler retries later)", minimum=1)
    control_backoff_s: float = _k(0.1, "first retry delay; doubles per attempt", minimum=0)
    max_body_bytes: int = _k(16 << 20, "reject webhook bodies larger than this (413); the shipped alertmanager.yml's max_alerts (5000) fits it at 3 KB an alert", minimum=1024)
    tick_s: float = _k(1.0, "reconciler cadence: escalation, hold-down expiry, restore steps", minimum=0.01)


@dataclass
class AbConfig:
    """A/B rollouts: experiments assigned by consistent hashing, the attribution report, rollback (docs/ab.md)."""

    experiments: dict[str, Any] = _k({}, "experiments by key: [ab.experiments.<key>] with seed, pool, coverage, control, enabled, [arms.<name>] (weight, version, route_policy, pool, student_share_pct, schedule) and [forced]; in the environment as JSON; see docs/ab.md", kind="experiments")
    alpha: float = _k(0.05, "significance level of the latency, attainment and availability intervals (two-sided)", minimum=0.0001, maximum=0.5)
    srm_alpha: float = _k(0.001, "a sample-ratio mismatch is flagged below this p-value", minimum=1e-9, maximum=0.5)
    fixed_block_minutes: int = _k(10, "block length of the fixed-horizon jackknife, minutes: longer than a user session, so that one session's correlated requests seldom straddle two blocks (docs/ab-calibration.md: 5-minute blocks gave A/A false positives above alpha)", minimum=1)
    block_minutes: int = _k(5, "block length of the always-valid mode and trailing window of the SLA-breach intervals, minutes", minimum=1)
    min_requests: int = _k(5000, "requests per arm below which every verdict is inconclusive (the default sample size of docs/ab-calibration.md)", minimum=1)
    latency_margin_pct: float = _k(5.0, "a latency quantile may be this much worse (relative, %) and still pass", minimum=0)
    ratio_margin_pct: float = _k(0.5, "attainment and availability may be this many percentage points worse and still pass", minimum=0)
    sequential_minutes: int = _k(60, "always-valid mode: the experiment length (minutes) at which its confidence sequences are tightest", minimum=1)
    auto_rollback: bool = _k(False, "llmsla ab report --sequential sets a failing arm's weight to 0 through the control API (audited)")
    control_timeout_s: float = _k(2.0, "timeout of the rollback's control API call", minimum=0.01)


@dataclass
class Config:
    store: StoreConfig = field(default_factory=StoreConfig)
    spool: SpoolConfig = field(default_factory=SpoolConfig)
    slo: SloConfig = field(default_factory=SloConfig)
    metrics: MetricsConfig = field(default_factory=MetricsConfig)
    gateway: GatewayConfig = field(default_factory=GatewayConfig)
    tenants: TenantsConfig = field(default_factory=TenantsConfig)
    worker: WorkerConfig = field(default_factory=WorkerConfig)
    otel: OtelConfig = field(default_factory=OtelConfig)
    gpu: GpuConfig = field(default_factory=GpuConfig)
    engine: EngineConfig = field(default_factory=EngineConfig)
    stream: StreamConfig = field(default_factory=StreamConfig)
    control: ControlConfig = field(default_factory=ControlConfig)
    http: HttpConfig = field(default_factory=HttpConfig)
    forecast: ForecastConfig = field(default_factory=ForecastConfig)
    receiver: ReceiverConfig = field(default_factory=ReceiverConfig)
    ab: AbConfig = field(default_factory=AbConfig)
    source: str = ""  # the file this was loaded from, for messages
    #: "section.key" -> where its value came from (file, environment variable, CLI option)
    origins: dict[str, str] = field(default_factory=dict)

    def origin(self, key: str) -> str:
        """``"store.dsn (from --dsn)"``: a key and where it was set, for error messages."""
        where = self.origins.get(key)
        return f"{key} (from {where})" if where else key

    # -- derived paths ---------------------------------------------------------------------------
    def spool_dir(self) -> Path:
        return Path(self.spool.dir) if self.spool.dir else default_data_dir() / "spool"

    def store_data_dir(self) -> Path:
        return Path(self.store.data_dir) if self.store.data_dir else default_data_dir() / "pg"

    def checkpoint_dir(self) -> Path:
        return Path(self.stream.checkpoint_dir) if self.stream.checkpoint_dir else default_data_dir() / "checkpoints"


SECTIONS: dict[str, type] = {f.name: f.type if isinstance(f.type, type) else globals()[f.type]
                             for f in fields(Config) if f.name not in ("source", "origins")}
#: Short aliases the architecture names (LLMSLA_DSN is what operators type).
ENV_ALIASES = {"LLMSLA_DSN": ("store", "dsn")}
#: Keys renamed because the old name misled (old -> new, docs/architecture.md#glossary): the old
#: spelling, in a file, the environment or a flag, still sets the new key for one release, with
#: a warning naming both.
RENAMED_KEYS = {
    "worker.zone": "worker.pool",  # it must be the pool's name: the dashboards join on it
    "worker.policy": "worker.temperature_policy",  # "policy" alone also means routing and actions
    "receiver.policy": "receiver.action_policy",
    # two keys said where the control API is; every client of it reads control.urls
    "receiver.control_urls": "control.urls",
    "ab.control_url": "control.urls",  # a single URL: read as a list of one
}


def current_key(section: str, key: str, where: str) -> tuple[str, str]:
    """(section, key) of ``section.key``, or of the key it was renamed to (with a one-line
    warning naming where the old spelling came from)."""
    new = RENAMED_KEYS.get(f"{section}.{key}")
    if new is None:
        return section, key
    log.warning("%s: %s.%s is renamed %s; the old name is read for one more release",
                where or "command line", section, key, new)
    new_section, _, new_key = new.partition(".")
    return new_section, new_key


def _coerce(value: Any, tp: Any, where: str, key: str, from_env: bool = False) -> Any:
    origin = typing.get_origin(tp)
    if origin in (list,):
        (item_tp,) = typing.get_args(tp)
        if from_env and isinstance(value, str):  # comma separated
            value = [v.strip() for v in value.split(",") if v.strip()]
        if not isinstance(value, list):
            raise ConfigError(f"{_at(where)}{key}: expected a list, got {type(value).__name__}")
        return [_coerce(v, item_tp, where, f"{key}[{i}]", from_env) for i, v in enumerate(value)]
    if origin is dict:  # a table (experiments): checked by its own parser in _set
        if from_env and isinstance(value, str):
            try:
                value = json.loads(value)
            except ValueError as exc:
                raise ConfigError(f"{_at(where)}{key}: expected a JSON object: {exc}") from None
        if not isinstance(value, dict):
            raise ConfigError(f"{_at(where)}{key}: expected a table, got {type(value).__name__}")
        return value
    if isinstance(tp, types.UnionType):  # pragma: no cover - no optional keys today
        tp = typing.get_args(tp)[0]
    if not from_env and tp is not str and isinstance(value, str):
        raise ConfigError(f"{_at(where)}{key}: expected {getattr(tp, '__name__', tp)}, got a string {value!r}")
    if tp is bool:
        if isinstance(value, str) and value.lower() in ("1", "true", "yes", "on", "0", "false", "no", "off"):
            return value.lower() in ("1", "true", "yes", "on")
        if not isinstance(value, bool):
            raise ConfigError(f"{_at(where)}{key}: expected true/false, got {value!r}")
        return value
    if tp is int:
        if isinstance(value, str):
            try:
                value = int(value.replace("_", ""))
            except ValueError:
                raise ConfigError(f"{_at(where)}{key}: expected an integer, got {value!r}") from None
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{_at(where)}{key}: expected an integer, got {value!r}")
        return value
    if tp is float:
        if isinstance(value, str):
            try:
                value = float(value)
            except ValueError:
                raise ConfigError(f"{_at(where)}{key}: expected a number, got {value!r}") from None
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
            raise ConfigError(f"{_at(where)}{key}: expected a finite number, got {value!r}")
        return float(value)
    if tp is str:
        if not isinstance(value, str):
            # the type only: a string key may be a secret (a DSN given as a list, a token as a number)
            raise ConfigError(f"{_at(where)}{key}: expected a string, got {type(value).__name__}")
        return value
    raise AssertionError(tp)  # pragma: no cover


def _at(where: str) -> str:
    """The prefix of a message about a value from ``where`` ("" for a command-line argument,
    which argparse names itself)."""
    return f"{where}: " if where else ""


def _set(cfg: Config, section: str, key: str, value: Any, where: str, from_env: bool = False) -> str:
    """Set ``section.key`` in ``cfg`` (its current name, see :data:`RENAMED_KEYS`) and return
    that name, dotted."""
    new_section, new_key = current_key(section, key, where)
    obj = getattr(cfg, new_section)
    if (new_section, new_key) != (section, key) and isinstance(value, str) and not from_env \
            and typing.get_origin(typing.get_type_hints(type(obj))[new_key]) is list:
        value = [value] if value else []  # a one-value key renamed into a list key
    setattr(obj, new_key, _checked(obj, new_section, new_key, value, where, from_env))
    return f"{new_section}.{new_key}"


def check_value(key: str, value: Any, where: str = "") -> Any:
    """``value`` for ``section.key`` after the key's own coercion and checks (a string is read as
    the environment's would be), or a :class:`ConfigError`: what a command-line flag that sets a
    key runs, so the flag and the key refuse the same values (llmsla.argtypes)."""
    section, _, name = RENAMED_KEYS.get(key, key).partition(".")
    if section not in SECTIONS:
        raise KeyError(key)
    return _checked(SECTIONS[section](), section, name, value, where, from_env=isinstance(value, str))


def _checked(section_obj: Any, section: str, key: str, value: Any, where: str, from_env: bool = False) -> Any:
    fmap = {f.name: f for f in fields(section_obj)}
    if key not in fmap:
        close = difflib.get_close_matches(key, fmap, n=1)
        hint = f"did you mean '{section}.{close[0]}'? " if close else ""
        raise ConfigError(f"{_at(where)}unknown key '{section}.{key}' ({hint}known: {', '.join(sorted(fmap))})")
    f = fmap[key]
    hints = typing.get_type_hints(type(section_obj))
    value = _coerce(value, hints[key], where, f"{section}.{key}", from_env)
    meta = f.metadata
    name = f"{section}.{key}"
    if meta.get("choices") and value not in meta["choices"]:
        raise ConfigError(f"{_at(where)}{name}: must be one of {', '.join(meta['choices'])}, got {value!r}")
    if meta.get("minimum") is not None and isinstance(value, int | float) and value < meta["minimum"]:
        raise ConfigError(f"{_at(where)}{name}: must be >= {meta['minimum']}, got {value!r}")
    if meta.get("maximum") is not None and isinstance(value, int | float) and value > meta["maximum"]:
        raise ConfigError(f"{_at(where)}{name}: must be <= {meta['maximum']}, got {value!r}")
    if meta.get("kind") == "experiments":
        try:
            value = experiments.normalised(value, name)
        except experiments.ExperimentError as exc:
            raise ConfigError(f"{_at(where)}{exc}") from None
    elif meta.get("kind") == "host":
        check_host(value, f"{_at(where)}{name}")
    elif meta.get("kind") in ("port", "port0"):
        check_port(value, f"{_at(where)}{name}", allow_zero=meta["kind"] == "port0")
    elif meta.get("kind") == "deprecated":  # accepted for one release, so old files still load
        log.warning("%s: %s is %s", where or "command line", name, meta["doc"])
    if meta.get("check") is not None and (problem := meta["check"](value)) is not None:
        got = f" (got {_shown_value(value)})" if isinstance(value, str) and meta.get("kind") != "secret" else ""
        raise ConfigError(f"{_at(where)}{name}: {problem}{got}")
    return value


_HOSTNAME = re.compile(r"^(?=.{1,253}$)(?!-)[A-Za-z0-9-]{1,63}(?<!-)(\.(?!-)[A-Za-z0-9-]{1,63}(?<!-))*\.?$")


def check_host(value: str, where: str) -> str:
    """A listen address: an IP literal or a host name. Empty is an error, not "every interface"
    (aiohttp would bind 0.0.0.0 and [::]); say 0.0.0.0 to mean that."""
    if not value:
        raise ConfigError(f"{_at(where)}empty listen address; use 127.0.0.1 (this machine only) "
                          "or 0.0.0.0 (every interface)")
    try:
        ipaddress.ip_address(value)
        return value
    except ValueError:
        pass
    if not _HOSTNAME.match(value):
        raise ConfigError(f"{_at(where)}{value!r} is neither an IP address nor a host name")
    return value


def check_port(value: int, where: str, *, allow_zero: bool = False) -> int:
    """1..65535 (``allow_zero``: 0 = a free port, for command-line use)."""
    if not (0 if allow_zero else 1) <= value <= 65535:
        raise ConfigError(f"{_at(where)}port must be {'0' if allow_zero else '1'}..65535, got {value}")
    return value


def check_key(cfg: Config, key: str) -> None:
    """Run ``section.key``'s declared checks on its value in ``cfg`` (a Config built in code
    meets at a component's start-up what :func:`load` refuses); ConfigError names the key."""
    section, _, name = key.partition(".")
    _set(cfg, section, name, getattr(getattr(cfg, section), name), cfg.origins.get(key) or cfg.source or "configuration")


def set_value(cfg: Config, key: str, value: Any, where: str) -> None:
    """Set ``section.key`` from a command-line option with the same checks as the file/env, and
    remember where it came from (messages then say ``store.dsn (from --dsn)``)."""
    section, _, name = key.partition(".")
    cfg.origins[_set(cfg, section, name, value, where)] = where


def load(path: str | os.PathLike[str] | None = None, *, env: dict[str, str] | None = None) -> Config:
    """Defaults, then the TOML file (``path``, else ``$LLMSLA_CONFIG`` if set), then the env."""
    env = dict(os.environ) if env is None else env
    cfg = Config()
    path = path or env.get(ENV_CONFIG_FILE) or None
    if path is not None:
        p = Path(path)
        where = str(p)
        try:
            data = tomllib.loads(read_config_text(p))
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"{where}: not valid TOML: {exc}") from None
        for section, body in data.items():
            if section not in SECTIONS:
                raise ConfigError(f"{where}: unknown section [{section}] (known: {', '.join(SECTIONS)})")
            if not isinstance(body, dict):
                raise ConfigError(f"{where}: [{section}] must be a table")
            for key, value in body.items():
                cfg.origins[_set(cfg, section, key, value, where)] = where
        cfg.source = where
    for var, value in sorted(env.items()):
        if not var.startswith(ENV_PREFIX) or var in ENV_NOT_KEYS or var.startswith(ENV_NOT_KEY_PREFIXES):
            continue
        if var in ENV_ALIASES:
            section, key = ENV_ALIASES[var]
        else:
            rest = var[len(ENV_PREFIX):].lower()
            section = next((s for s in SECTIONS if rest.startswith(s + "_")), "")
            if not section:  # LLMSLA_GATWAY_PORT: a typo must not leave the default in force
                raise ConfigError(f"environment variable {var}: {_unknown_env_hint(var)}")
            key = rest[len(section) + 1:]
        cfg.origins[_set(cfg, section, key, value, f"environment variable {var}", from_env=True)] = \
            f"environment variable {var}"
    check_slo_buckets(cfg)
    return cfg


def env_names() -> list[str]:
    """Every ``LLMSLA_*`` name llmsla reads: a variable per key, the aliases, the non-keys."""
    keys = [f"{ENV_PREFIX}{section.upper()}_{f.name.upper()}" for section, cls in SECTIONS.items() for f in fields(cls)]
    old = [f"{ENV_PREFIX}{k.replace('.', '_').upper()}" for k in RENAMED_KEYS]
    return keys + sorted(old) + sorted(ENV_ALIASES) + sorted(ENV_NOT_KEYS)


def _unknown_env_hint(var: str) -> str:
    close = difflib.get_close_matches(var, env_names(), n=1, cutoff=0.75)
    hint = f"did you mean {close[0]}? " if close else ""
    return (f"no configuration section matches ({hint}variables are LLMSLA_<SECTION>_<KEY>, sections: "
            f"{', '.join(SECTIONS)}; not keys: {', '.join(sorted(ENV_NOT_KEYS))}, "
            f"{', '.join(p + '*' for p in ENV_NOT_KEY_PREFIXES)})")


#: Largest config file read: a TOML file of keys is a few KB; a bigger one is a mistake.
MAX_CONFIG_BYTES = 16 << 20


def read_config_text(p: Path) -> str:
    """The text of config file ``p``, or a one-line :class:`ConfigError` naming it: missing, a
    directory, a FIFO or device (never opened: stat first - reading a FIFO would block until a
    writer comes), unreadable, too large, or not UTF-8."""
    where = str(p)
    try:
        st = os.stat(p)
    except FileNotFoundError:
        raise ConfigError(f"{where}: config file not found") from None
    except OSError as exc:
        raise ConfigError(f"{where}: cannot read the config file: {exc.strerror or exc}") from None
    if stat.S_ISDIR(st.st_mode):
        raise ConfigError(f"{where}: is a directory, not a config file (give the TOML file in it)")
    if not stat.S_ISREG(st.st_mode):
        raise ConfigError(f"{where}: not a regular file (a FIFO, socket or device); give a TOML file")
    if st.st_size > MAX_CONFIG_BYTES:
        raise ConfigError(f"{where}: {st.st_size} bytes, larger than a config file may be ({MAX_CONFIG_BYTES})")
    try:
        # O_NONBLOCK: if the path was swapped for a FIFO after the stat, opening it does not wait
        fd = os.open(p, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
        with os.fdopen(fd, "rb") as fh:
            if not stat.S_ISREG(os.fstat(fh.fileno()).st_mode):
                raise ConfigError(f"{where}: not a regular file (a FIFO, socket or device); give a TOML file")
            raw = fh.read(MAX_CONFIG_BYTES + 1)
    except OSError as exc:
        raise ConfigError(f"{where}: cannot read the config file: {exc.strerror or exc}") from None
    if len(raw) > MAX_CONFIG_BYTES:
        raise ConfigError(f"{where}: larger than a config file may be ({MAX_CONFIG_BYTES} bytes)")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw.count(b"\n", 0, exc.start) + 1
        raise ConfigError(f"{where}: not UTF-8 text (byte 0x{raw[exc.start]:02x} on line {line}); "
                          "TOML files are UTF-8") from None


def shown(cfg: Config) -> dict[str, dict[str, Any]]:
    """The effective configuration as it may be printed: every string redacted (a password in
    any URL or DSN, whatever the key), every ``secret`` key masked."""
    from llmsla.redaction import MASK, redact

    out: dict[str, dict[str, Any]] = {}
    for section, cls in SECTIONS.items():
        obj = getattr(cfg, section)
        values: dict[str, Any] = {}
        for f in fields(cls):
            value = getattr(obj, f.name)
            if f.metadata.get("kind") == "secret":
                value = MASK if value else ""
            elif isinstance(value, str):
                value = redact(value)
            elif isinstance(value, list):
                value = [redact(v) if isinstance(v, str) else v for v in value]
            values[f.name] = value
        out[section] = values
    return out


def secrets(cfg: Config) -> set[str]:
    """Every secret the configuration holds (tokens; passwords inside any URL or DSN), for the
    log scrubber and for error messages that may echo them."""
    from llmsla.redaction import secrets_of

    found: set[str] = set()
    for section, cls in SECTIONS.items():
        obj = getattr(cfg, section)
        for f in fields(cls):
            value = getattr(obj, f.name)
            items = value if isinstance(value, list) else list(value) if isinstance(value, dict) else [value]
            for v in items:  # a dict's keys: the secrets of tenants.api_keys are its keys
                if not isinstance(v, str) or not v:
                    continue
                if f.metadata.get("kind") == "secret":
                    found.add(v)
                found |= secrets_of(v)
    return found


def check_arm_pools(experiments: dict[str, Any], pool: str, pools: list[str], where: str) -> None:
    """Every arm of the enabled experiment on ``pool`` (parsed: llmsla.experiments.Experiment)
    must send its units to one of ``pools``, the pools the gateway has replicas of."""
    for key, e in experiments.items():
        if not e.enabled or e.pool != pool:
            continue
        for a in e.arms:
            if a.strategy.pool is not None and a.strategy.pool not in pools:
                raise ConfigError(f"{where}: ab.experiments.{key}.arms.{a.name}.pool: pool {a.strategy.pool!r} "
                                  f"has no replicas here (pools: {', '.join(pools)}); add it to gateway.pools "
                                  "(pool=http://host:port, or with gateway.discovery its name alone)")


def check_discovery(cfg: Config) -> None:
    """``gateway.discovery`` file/dns/kubernetes needs its file/name/selector, and replaces the
    static ``gateway.upstreams`` and ``student_upstreams`` (``gateway.pools`` stay, fixed, beside
    it); a ``gateway.pools`` entry that is a pool's name alone needs a discovery source."""
    g = cfg.gateway
    where = cfg.source or "configuration"
    if g.discovery == "file" and not g.discovery_file:
        raise ConfigError(f"{where}: gateway.discovery = file needs gateway.discovery_file (a file of [pool=]url lines)")
    if g.discovery == "dns" and not g.discovery_dns:
        raise ConfigError(f"{where}: gateway.discovery = dns needs gateway.discovery_dns (name:port, or _service._proto.name)")
    if g.discovery == "kubernetes" and not g.discovery_kubernetes:
        raise ConfigError(f"{where}: gateway.discovery = kubernetes needs gateway.discovery_kubernetes (a label selector, e.g. app=vllm)")
    for spec in g.pools if g.discovery == "static" else ():
        try:
            pool, url = split_pool_spec(spec)
        except ValueError:
            continue  # the key's own check says why
        if not url:
            raise ConfigError(f"{where}: gateway.pools: {pool!r} names no replica: write {pool}=http://host:port (a "
                              "pool name alone is for gateway.discovery file, dns or kubernetes, which find its replicas)")
    if g.discovery != "static" and (g.upstreams or g.student_upstreams):
        raise ConfigError(f"{where}: gateway.discovery = {g.discovery} finds the replicas itself: leave "
                          "gateway.upstreams and gateway.student_upstreams empty (gateway.pools may stay)")


def check_startup(cfg: Config) -> None:
    """The cross-key checks a component runs when it starts, beyond :func:`load` (which runs every
    key's own); ``llmsla config check`` runs them all, so it refuses what a component would."""
    check_discovery(cfg)
    g = cfg.gateway
    check_arm_pools(experiments.parse(cfg.ab.experiments), g.pool, named_pools(g), cfg.source or "configuration")
    from llmsla import slo_catalog  # the specs every component reads (it imports this module)

    slo_catalog.load(cfg)
    check_worker_kv(cfg)
    check_tenants(cfg)
    check_forecast_alarm(cfg.forecast)


def check_forecast_alarm(fc: ForecastConfig) -> None:
    """``forecast.fire_window``: 0, or a window that holds ``fire_steps`` (k of n needs n >= k)."""
    if fc.fire_window and fc.fire_window < fc.fire_steps:
        raise ConfigError(f"forecast.fire_window: {fc.fire_window} is shorter than forecast.fire_steps "
                          f"({fc.fire_steps}); k of n needs n >= k (0 = fire_steps in a row)")


def read_api_keys_file(path: str, where: str = "tenants.api_keys_file") -> dict[str, str]:
    """``tenants.api_keys_file``: a JSON object of API key -> tenant, checked like
    ``tenants.api_keys``; a :class:`ConfigError` that names the file, never a key."""
    p = Path(path)
    try:
        if not p.is_file():
            raise ConfigError(f"{where}: {path}: not a file")
        data = json.loads(p.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        if isinstance(exc, ConfigError):
            raise
        reason = exc.strerror if isinstance(exc, OSError) else "not a UTF-8 JSON object"
        raise ConfigError(f"{where}: {path}: {reason}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{where}: {path}: expected a JSON object of API key -> tenant")
    if (problem := _api_keys_problem(data)) is not None:
        raise ConfigError(f"{where}: {path}: {problem}")
    return data


def check_tenants(cfg: Config) -> None:
    """The tenant rules across keys: the header is believed only from trusted proxies (so there
    must be some), every tenant an API key names is declared, every class named is a class."""
    t = cfg.tenants
    where = cfg.source or "configuration"
    if t.header and not cfg.gateway.trusted_proxies:
        raise ConfigError(f"{where}: tenants.header = {t.header!r} is believed only from gateway.trusted_proxies, "
                          "which is empty: list the auth proxy that sets it there")
    if t.header and t.class_header and t.header.lower() == t.class_header.lower():
        raise ConfigError(f"{where}: tenants.header and tenants.class_header are both {t.header!r}; one header cannot name both")
    if t.default_class and t.default_class not in t.classes:
        raise ConfigError(f"{where}: tenants.default_class = {t.default_class!r} is not one of tenants.classes "
                          f"({', '.join(t.classes)})")
    for tenant, cls in t.declared.items():
        if cls not in t.classes:
            raise ConfigError(f"{where}: tenants.declared: tenant {_shown_value(tenant)}: class {_shown_value(cls)} "
                              f"is not one of tenants.classes ({', '.join(t.classes)})")
    keys = dict(t.api_keys)
    if t.api_keys_file:
        keys.update(read_api_keys_file(t.api_keys_file))
    for tenant in dict.fromkeys(keys.values()):
        if tenant not in t.declared:
            raise ConfigError(f"{where}: tenants.api_keys: tenant {_shown_value(tenant)} is not in tenants.declared "
                              "(declare it with its default class)")


def worker_context_tokens(cfg: Config) -> int:
    """The reference worker's model context: the longest prompt, the most tokens, one EOS."""
    return cfg.worker.max_prompt_tokens + cfg.worker.max_tokens + 1


def check_worker_kv(cfg: Config) -> None:
    """``worker.kv_blocks`` must hold one request at its full context, or that request never runs."""
    w = cfg.worker
    need = -(-worker_context_tokens(cfg) // names.VLLM_BLOCK_SIZE)
    if w.kv_blocks and w.kv_blocks < need:
        raise ConfigError(f"{cfg.source or 'configuration'}: worker.kv_blocks = {w.kv_blocks} cannot hold one request "
                          f"at the full context (max_prompt_tokens + max_tokens + 1 = {worker_context_tokens(cfg)} "
                          f"tokens, {need} blocks of {names.VLLM_BLOCK_SIZE}); set 0 or at least {need}")


def check_slo_buckets(cfg: Config) -> None:
    """Each SLO threshold must be a bound of its histogram, or PromQL cannot count it exactly."""
    pairs = (
        ("slo.ttft_ms", cfg.slo.ttft_ms, "metrics.ttft_buckets", cfg.metrics.ttft_buckets),
        ("slo.e2e_ms", cfg.slo.e2e_ms, "metrics.e2e_buckets", cfg.metrics.e2e_buckets),
        ("slo.itl_ms", cfg.slo.itl_ms, "metrics.itl_buckets", cfg.metrics.itl_buckets),
    )
    where = cfg.source or "configuration"
    for slo_key, ms, bkey, buckets in pairs:
        if sorted(buckets) != list(buckets) or len(set(buckets)) != len(buckets):
            raise ConfigError(f"{where}: {bkey}: bounds must be strictly increasing")
        if not any(math.isclose(ms / 1000.0, b, rel_tol=1e-9) for b in buckets):
            raise ConfigError(
                f"{where}: {slo_key} = {ms:g} ms is not a bucket bound of {bkey} "
                f"({', '.join(f'{b:g}' for b in buckets)} s); add {ms / 1000:g} to the buckets"
            )


def render_doc() -> str:
    """Markdown reference of every key, generated from the declarations above."""
    lines = [
        "# Configuration reference",
        "",
        "Generated by `llmsla config doc` from `llmsla/config.py`; do not edit by hand.",
        "",
        "Load order: defaults, then the TOML file (`--config FILE` or `$LLMSLA_CONFIG`), then",
        "environment variables `LLMSLA_<SECTION>_<KEY>` (lists comma-separated). `LLMSLA_DSN` is an",
        "alias of `LLMSLA_STORE_DSN`. Unknown keys and bad values are errors naming file and key.",
        "An `LLMSLA_*` variable that names no key is an error too (`LLMSLA_GATWAY_PORT`: did you mean",
        f"`LLMSLA_GATEWAY_PORT`?), except {', '.join(f'`{v}`' for v in sorted(ENV_NOT_KEYS))} and the",
        f"{' and '.join(f'`{p}*`' for p in ENV_NOT_KEY_PREFIXES)} families, which other tools read.",
        "",
        "Each key's checks are the ones its component relies on: names that label events (pools,",
        "zones, nodes, models, arms) follow the event contract (non-empty, at most 256 characters,",
        "storable text); URLs need `http://` or `https://` and a host; `store.dsn` must parse as a",
        "PostgreSQL DSN and `control.redis_url` as a Redis URL; a token is empty (its documented meaning)",
        f"or at least {MIN_TOKEN_CHARS} printable ASCII characters without whitespace. `llmsla config check`",
        "runs all of them and the components' cross-key start-up checks, so it refuses exactly what a",
        "component would. Secrets (tokens, passwords in any URL or DSN) are masked in every output.",
        "",
        "The config file must be a regular UTF-8 file; a directory, FIFO, device or unreadable file is",
        "a one-line error naming it.",
        "",
    ]
    for section, cls in SECTIONS.items():
        lines += [f"## [{section}]", "", (cls.__doc__ or "").strip(), "", "| key | default | env | description |", "|---|---|---|---|"]
        for f in fields(cls):
            default = f.default if f.default is not MISSING else (
                f.default_factory() if f.default_factory is not MISSING else None)
            doc = f.metadata["doc"]
            if f.metadata.get("choices"):
                doc += f" (one of: {', '.join(f.metadata['choices'])})"
            env = f"`{ENV_PREFIX}{section.upper()}_{f.name.upper()}`"
            lines.append(f"| `{f.name}` | `{default!r}` | {env} | {doc} |")
        lines.append("")
    lines += ["## Renamed keys", "", "The old name still sets the new key for one release, with a warning.", "",
              "| old | new |", "|---|---|"]
    lines += [f"| `{old}` | `{new}` |" for old, new in RENAMED_KEYS.items()]
    lines.append("")
    return "\n".join(lines)
