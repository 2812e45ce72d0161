"""Configuration: one TOML file plus ``LLMSLA_<SECTION>_<KEY>`` environment overrides.

Every key is declared once below, with its type, default and a one-line doc; ``llmsla config doc``
renders them to ``docs/config.md`` (a test keeps that file current). An unknown section or key,
or a value of the wrong type or range, is a :class:`ConfigError` naming the file and the key, so
a typo fails at startup instead of silently using a default.
"""

from __future__ import annotations

import math
import os
import tomllib
import types
import typing
from dataclasses import MISSING, dataclass, field, fields
from pathlib import Path
from typing import Any

from llmsla import names

ENV_PREFIX = "LLMSLA_"
ENV_CONFIG_FILE = "LLMSLA_CONFIG"


class ConfigError(ValueError):
    """A bad configuration value; the message names the source (file or env var) and the key."""


def _k(default: Any, doc: str, *, choices: tuple[str, ...] | None = None, minimum: float | None = None) -> Any:
    meta = {"doc": doc, "choices": choices, "minimum": minimum}
    if isinstance(default, list | dict):
        return field(default_factory=lambda d=default: type(d)(d), metadata=meta)
    return field(default=default, metadata=meta)


def default_data_dir() -> Path:
    from platformdirs import user_data_dir

    return Path(user_data_dir("llmsla", appauthor=False))


@dataclass
class StoreConfig:
    """Where windows, dead letters, forecasts and the audit log live."""

    dsn: str = _k("", "PostgreSQL/TimescaleDB DSN; empty starts the embedded PostgreSQL (also LLMSLA_DSN)")
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
    max_total_bytes: int = _k(10 << 30, "per kind, refuse writes past this many bytes on disk", minimum=1 << 20)
    retention_s: float = _k(86400.0, "delete published segments older than this", minimum=1)


@dataclass
class SloConfig:
    """Service level objectives; thresholds must be bucket bounds of their histograms."""

    ttft_ms: float = _k(800.0, "time-to-first-token objective, ms", minimum=0)
    e2e_ms: float = _k(10000.0, "end-to-end latency objective, ms", minimum=0)
    itl_ms: float = _k(100.0, "inter-token latency objective, ms", minimum=0)
    latency_target: float = _k(0.99, "share of requests that must meet the latency objectives", minimum=0)
    availability_target: float = _k(0.999, "share of requests that must not fail", minimum=0)
    window_days: int = _k(30, "SLO compliance window, days", minimum=1)


@dataclass
class MetricsConfig:
    """Prometheus histograms and label cardinality."""

    ttft_buckets: list[float] = _k(list(names.TTFT_BUCKETS), "TTFT histogram bounds, seconds")
    itl_buckets: list[float] = _k(list(names.ITL_BUCKETS), "inter-token latency bounds, seconds")
    e2e_buckets: list[float] = _k(list(names.E2E_BUCKETS), "end-to-end latency bounds, seconds")
    queue_buckets: list[float] = _k(list(names.QUEUE_BUCKETS), "gateway queue time bounds, seconds")
    label_top_n: int = _k(50, "per label, distinct values kept before the rest become 'other'", minimum=1)
    allowed_models: list[str] = _k([], "if set, model label values outside this list become 'other'")
    allowed_pools: list[str] = _k([], "if set, pool label values outside this list become 'other'")
    allowed_arms: list[str] = _k([], "if set, arm label values outside this list become 'other'")


@dataclass
class GatewayConfig:
    """The instrumented OpenAI-compatible proxy."""

    host: str = _k("127.0.0.1", "listen address")
    port: int = _k(8000, "listen port", minimum=0)
    upstreams: list[str] = _k([], "replica base URLs, e.g. http://127.0.0.1:9001")
    pool: str = _k("default", "pool name of these upstreams")
    request_timeout_s: float = _k(300.0, "give up on an upstream request after this long", minimum=0.1)
    max_body_bytes: int = _k(1 << 20, "reject request bodies larger than this (413)", minimum=1024)
    max_in_flight: int = _k(1024, "reject (429, status rejected) past this many concurrent requests", minimum=1)
    max_concurrency: int = _k(256, "upstream requests in flight at once; the rest wait in the gateway queue", minimum=1)
    max_prompt_chars: int = _k(65536, "reject prompts (all message contents) longer than this many characters (400)", minimum=1)
    workers: int = _k(1, "gateway processes sharing the port (SO_REUSEPORT, multi-process metrics)", minimum=1)


@dataclass
class WorkerConfig:
    """The reference CPU inference worker."""

    host: str = _k("127.0.0.1", "listen address")
    port: int = _k(9001, "listen port", minimum=0)
    model: str = _k("llmsla-tiny", "model name served")
    max_batch: int = _k(16, "continuous-batching limit", minimum=1)
    max_tokens: int = _k(256, "cap on generated tokens per request", minimum=1)
    max_prompt_tokens: int = _k(2048, "reject longer prompts (400)", minimum=1)
    seed: int = _k(0, "seed of the deterministic weights", minimum=0)
    train_steps: int = _k(0, "steps of warm-up training on the bundled public-domain text at start (deterministic; ~0.15 s each)", minimum=0)
    threads: int = _k(1, "torch intra-op threads of the engine thread", minimum=1)
    zone: str = _k("default", "zone label of temperature-policy decisions (spans, PolicyEvents, metrics)")
    policy: str = _k("constant", "default temperature policy; a request may pick one with body field llmsla_policy", choices=("constant", "linear", "cosine", "exponential", "entropy"))
    temperature_min: float = _k(0.1, "policy lower bound T_min (the request's temperature is T_max)", minimum=0)
    policy_decay: float = _k(0.98, "exponential policy: T(s) = max(T_min, T_max * decay^s)", minimum=0)
    entropy_target: float = _k(2.5, "entropy policy: target next-token entropy, nats", minimum=0)
    entropy_band: float = _k(0.25, "entropy policy: hold while |entropy - target| is within this, nats", minimum=0)
    entropy_gain: float = _k(0.5, "entropy policy: T <- T * exp(gain * (target - entropy))", minimum=0)


@dataclass
class OtelConfig:
    """OpenTelemetry tracing."""

    endpoint: str = _k("", "OTLP/HTTP traces endpoint; empty = spool only")
    service_name: str = _k("llmsla", "service.name resource attribute")


@dataclass
class GpuConfig:
    """The NVML collector."""

    interval_s: float = _k(5.0, "seconds between samples", minimum=0.1)
    node: str = _k("", "node label; empty = host name")
    host: str = _k("127.0.0.1", "listen address of `llmsla gpu` (/metrics)")
    port: int = _k(9400, "listen port of `llmsla gpu` (/metrics)", minimum=0)


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
    sink_batch_rows: int = _k(5000, "flush the store sink after this many rows", minimum=1)
    sink_flush_s: float = _k(1.0, "flush the store sink at least this often", minimum=0.01)
    source: str = _k("spool", "spool or kafka", choices=("spool", "kafka"))
    kafka_bootstrap: str = _k("", "Kafka bootstrap servers (source = kafka)")
    kafka_jar: str = _k("", "path of flink-sql-connector-kafka jar (source = kafka)")
    kafka_topic_prefix: str = _k("llmsla.", "Kafka topic of a kind is <prefix><kind> (requests, policy, gpu)")
    monitor_interval_s: float = _k(1.0, "how often the spool source looks for newly published segments", minimum=0.01)
    sink_retry_s: float = _k(30.0, "keep retrying store writes this long before failing the job", minimum=0)
    restart_attempts: int = _k(3, "Flink restarts (from the last checkpoint) before the job fails", minimum=0)
    watermark_interval_ms: int = _k(200, "periodic watermark emission interval (pipeline.auto-watermark-interval)", minimum=1)
    java_parser: bool = _k(True, "parse each spool line once into typed columns with the Java llmsla-json table format (built with javac on first use); false or no javac = one JSON_VALUE per field")


@dataclass
class ControlConfig:
    """Router, distillation controls and their HTTP control API."""

    host: str = _k("127.0.0.1", "control API listen address (loopback by default)")
    port: int = _k(8100, "control API port", minimum=0)
    token: str = _k("", "bearer token the control API requires (also LLMSLA_CONTROL_TOKEN); empty refuses all writes")
    route_policy: str = _k("ladr", "router policy", choices=("round_robin", "least_outstanding", "p2c", "ladr"))
    redis_url: str = _k("", "Redis URL for router state shared by gateway replicas; empty = in process")
    ladr_alpha: float = _k(1.0, "LADR score weight of 1 / latency (latency relative to the pool's fastest replica)", minimum=0)
    ladr_beta: float = _k(1.0, "LADR score weight of the queue (live outstanding relative to the pool's mean)", minimum=0)
    ladr_sharpness: float = _k(8.0, "LADR picks with probability ~ exp(sharpness * score): 0 = uniform, larger = greedier", minimum=0)
    ladr_theta: float = _k(0.7, "LADR EMA memory of the latency: L = theta * previous + (1 - theta) * window mean (< 1)", minimum=0)
    ladr_refresh_s: float = _k(0.2, "LADR score refresh cadence, seconds (also the Redis sync cadence)", minimum=0.001)
    ladr_ttl_s: float = _k(1.0, "LADR drops replicas whose stats are older than this, seconds", minimum=0.001)
    max_share_step_pct: float = _k(10.0, "largest student-share change per control action, percentage points", minimum=0)
    max_temperature_step: float = _k(0.5, "largest change of a temperature schedule bound (t_min/t_max/t_init) per action", minimum=0)


@dataclass
class Config:
    store: StoreConfig = field(default_factory=StoreConfig)
    spool: SpoolConfig = field(default_factory=SpoolConfig)
    slo: SloConfig = field(default_factory=SloConfig)
    metrics: MetricsConfig = field(default_factory=MetricsConfig)
    gateway: GatewayConfig = field(default_factory=GatewayConfig)
    worker: WorkerConfig = field(default_factory=WorkerConfig)
    otel: OtelConfig = field(default_factory=OtelConfig)
    gpu: GpuConfig = field(default_factory=GpuConfig)
    stream: StreamConfig = field(default_factory=StreamConfig)
    control: ControlConfig = field(default_factory=ControlConfig)
    source: str = ""  # the file this was loaded from, for messages

    # -- derived paths ---------------------------------------------------------------------------
    def spool_dir(self) -> Path:
        return Path(self.spool.dir) if self.spool.dir else default_data_dir() / "spool"

    def store_data_dir(self) -> Path:
        return Path(self.store.data_dir) if self.store.data_dir else default_data_dir() / "pg"

    def checkpoint_dir(self) -> Path:
        return Path(self.stream.checkpoint_dir) if self.stream.checkpoint_dir else default_data_dir() / "checkpoints"


SECTIONS: dict[str, type] = {f.name: f.type if isinstance(f.type, type) else globals()[f.type] for f in fields(Config) if f.name != "source"}
#: Short aliases the architecture names (LLMSLA_DSN is what operators type).
ENV_ALIASES = {"LLMSLA_DSN": ("store", "dsn")}


def _coerce(value: Any, tp: Any, where: str, key: str, from_env: bool = False) -> Any:
    origin = typing.get_origin(tp)
    if origin in (list,):
        (item_tp,) = typing.get_args(tp)
        if from_env and isinstance(value, str):  # comma separated
            value = [v.strip() for v in value.split(",") if v.strip()]
        if not isinstance(value, list):
            raise ConfigError(f"{where}: {key}: expected a list, got {type(value).__name__}")
        return [_coerce(v, item_tp, where, f"{key}[{i}]", from_env) for i, v in enumerate(value)]
    if isinstance(tp, types.UnionType):  # pragma: no cover - no optional keys today
        tp = typing.get_args(tp)[0]
    if not from_env and tp is not str and isinstance(value, str):
        raise ConfigError(f"{where}: {key}: expected {getattr(tp, '__name__', tp)}, got a string {value!r}")
    if tp is bool:
        if isinstance(value, str) and value.lower() in ("1", "true", "yes", "on", "0", "false", "no", "off"):
            return value.lower() in ("1", "true", "yes", "on")
        if not isinstance(value, bool):
            raise ConfigError(f"{where}: {key}: expected true/false, got {value!r}")
        return value
    if tp is int:
        if isinstance(value, str):
            try:
                value = int(value.replace("_", ""))
            except ValueError:
                raise ConfigError(f"{where}: {key}: expected an integer, got {value!r}") from None
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{where}: {key}: expected an integer, got {value!r}")
        return value
    if tp is float:
        if isinstance(value, str):
            try:
                value = float(value)
            except ValueError:
                raise ConfigError(f"{where}: {key}: expected a number, got {value!r}") from None
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
            raise ConfigError(f"{where}: {key}: expected a finite number, got {value!r}")
        return float(value)
    if tp is str:
        if not isinstance(value, str):
            raise ConfigError(f"{where}: {key}: expected a string, got {value!r}")
        return value
    raise AssertionError(tp)  # pragma: no cover


def _set(section_obj: Any, section: str, key: str, value: Any, where: str, from_env: bool = False) -> None:
    fmap = {f.name: f for f in fields(section_obj)}
    if key not in fmap:
        raise ConfigError(f"{where}: unknown key '{section}.{key}' (known: {', '.join(sorted(fmap))})")
    f = fmap[key]
    hints = typing.get_type_hints(type(section_obj))
    value = _coerce(value, hints[key], where, f"{section}.{key}", from_env)
    meta = f.metadata
    if meta.get("choices") and value not in meta["choices"]:
        raise ConfigError(f"{where}: {section}.{key}: must be one of {', '.join(meta['choices'])}, got {value!r}")
    if meta.get("minimum") is not None and isinstance(value, int | float) and value < meta["minimum"]:
        raise ConfigError(f"{where}: {section}.{key}: must be >= {meta['minimum']}, got {value!r}")
    setattr(section_obj, key, value)


def load(path: str | os.PathLike[str] | None = None, *, env: dict[str, str] | None = None) -> Config:
    """Defaults, then the TOML file (``path``, else ``$LLMSLA_CONFIG`` if set), then the env."""
    env = dict(os.environ) if env is None else env
    cfg = Config()
    path = path or env.get(ENV_CONFIG_FILE) or None
    if path is not None:
        p = Path(path)
        where = str(p)
        try:
            data = tomllib.loads(p.read_text())
        except FileNotFoundError:
            raise ConfigError(f"{where}: config file not found") from None
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"{where}: not valid TOML: {exc}") from None
        for section, body in data.items():
            if section not in SECTIONS:
                raise ConfigError(f"{where}: unknown section [{section}] (known: {', '.join(SECTIONS)})")
            if not isinstance(body, dict):
                raise ConfigError(f"{where}: [{section}] must be a table")
            for key, value in body.items():
                _set(getattr(cfg, section), section, key, value, where)
        cfg.source = where
    for var, value in sorted(env.items()):
        if not var.startswith(ENV_PREFIX) or var == ENV_CONFIG_FILE:
            continue
        if var in ENV_ALIASES:
            section, key = ENV_ALIASES[var]
        else:
            rest = var[len(ENV_PREFIX):].lower()
            section = next((s for s in SECTIONS if rest.startswith(s + "_")), "")
            if not section:
                continue  # LLMSLA_TEST_DSN, LLMSLA_DATA_DIR ... belong to other tools
            key = rest[len(section) + 1:]
        _set(getattr(cfg, section), section, key, value, f"environment variable {var}", from_env=True)
    check_slo_buckets(cfg)
    return cfg


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
    for key in ("latency_target", "availability_target"):
        value = getattr(cfg.slo, key)
        if not 0 < value < 1:
            raise ConfigError(f"{where}: slo.{key}: must be between 0 and 1 (exclusive), got {value}")


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
        "",
    ]
    for section, cls in SECTIONS.items():
        lines += [f"## [{section}]", "", (cls.__doc__ or "").strip(), "", "| key | default | env | description |", "|---|---|---|---|"]
        for f in fields(cls):
            default = f.default if f.default is not MISSING else f.default_factory()  # type: ignore[misc]
            doc = f.metadata["doc"]
            if f.metadata.get("choices"):
                doc += f" (one of: {', '.join(f.metadata['choices'])})"
            env = f"`{ENV_PREFIX}{section.upper()}_{f.name.upper()}`"
            lines.append(f"| `{f.name}` | `{default!r}` | {env} | {doc} |")
        lines.append("")
    return "\n".join(lines)
