"""The job on a real Flink session cluster (``llmsla flink start``: a JobManager and two
TaskManagers from the apache-flink wheel's ``bin/``), submitted by ``llmsla stream --jobmanager`` at
parallelism 2 over a spool of two writers. One TaskManager is SIGKILLed mid-run, after a checkpoint,
while the rest of the spool is published; a new TaskManager is started; the job restarts from its
checkpoint on the survivor and the newcomer, and the store equals the pandas reference: nothing
lost, nothing doubled. The cluster is stopped in a ``finally`` and no process of it may survive.
"""

from __future__ import annotations

import json
import signal
import socket
import time
from pathlib import Path

import numpy as np
import psycopg

from llmsla import names
from llmsla.store import open_store
from llmsla.streaming.cluster import Cluster, ClusterSpec

from . import reference as ref
from .conftest import kill_group, publish, start_stream
from .test_backlog import DELAY_MS, _check, _count, _judge, _wait, _want_dead, _writers


def _free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def _until(proc, pred):
    """``pred`` and a driver that has not exited (a failed submission ends the wait at once)."""
    def check() -> bool:
        assert proc.poll() is None, f"llmsla stream exited with {proc.returncode}"
        return pred()
    return check


def _job(cluster: Cluster) -> dict | None:
    jobs = [j for j in cluster.status()["jobs"] if j["name"] == "llmsla-stream"]
    return jobs[0] if jobs else None


def _diagnosis(cluster: Cluster, job_id: str, dsn: str) -> str:
    """What a stalled recovery looks like from the JobManager: each vertex's task states, the
    job's exceptions and the cluster's log tails (the driver's log says nothing of the tasks);
    and from the store, its sessions (a sink blocked on a lock shows its wait here)."""
    out = []
    try:
        with psycopg.connect(dsn) as conn:
            out += [str(row) for row in conn.execute(
                "SELECT pid, state, wait_event_type, wait_event, now() - xact_start, left(query, 100)"
                " FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()")]
    except psycopg.Error as e:
        out.append(f"store: {e!r}")
    try:
        detail = cluster.rest(f"/jobs/{job_id}")
        out += [f"{v['name'][:60]}: {v['status']} {v.get('tasks')}" for v in detail.get("vertices", [])]
        exc = cluster.rest(f"/jobs/{job_id}/exceptions")
        out += [str(e.get("exceptionName", e))[:300] for e in exc.get("exceptionHistory", {}).get("entries", [])[:5]]
        out.append(str(cluster.rest("/taskmanagers"))[:1500])
    except (OSError, ValueError, KeyError) as e:
        out.append(f"REST: {e!r}")
    for log in sorted((cluster.root / "log").glob("*.log")):
        lines = log.read_text(errors="replace").splitlines()
        telling = [ln[:400] for ln in lines
                   if any(w in ln for w in _TELLING) and "configuration property" not in ln]
        out.append(f"--- {log.name}: {len(lines)} lines, the last telling ones ---")
        out += telling[-40:]
    return "\n".join(out)


#: log lines that say what a recovery did: state changes, restarts, slots, warnings and errors
_TELLING = (" WARN ", " ERROR ", "switched from", "estart", "slot", "Slot", "Disconnect", "Registering")


def test_taskmanager_killed_mid_run_job_recovers_from_checkpoint(cfg, spool_dirs, tmp_path: Path) -> None:
    t0 = time.monotonic()
    rng = np.random.default_rng(15)
    now = int(time.time() * 1000)
    start = now - 400_000
    writers = _writers(rng, count=2, segments=8, per_segment=400, start_ms=start, span_ms=160_000,
                       poison_at={1, 6}, seed=5)
    end = max(json.loads(ln)["ts_ms"] for segs in writers.values() for _, seg in segs for ln in seg
              if isinstance(ln, str))
    closer_ids = {f"{0xc105e00 + i:032x}" for i in range(len(writers))}
    for tid, segs in zip(sorted(closer_ids), writers.values(), strict=True):
        d = json.loads(segs[0][1][0])
        d.update(ts_ms=end + 30_000, trace_id=tid)  # closes every other window of its writer
        segs.append((segs[-1][0].replace("-000007.jsonl", "-000008.jsonl"), [ref.dumps(d)]))
    judged = _judge(cfg, writers, now)
    want = ref.request_windows([ev for ev in judged.usable if ev.trace_id not in closer_ids],
                               ttft_slo=cfg.slo.ttft_ms, e2e_slo=cfg.slo.e2e_ms)
    want_dead = _want_dead(writers, judged)
    assert want_dead  # the poison lines: dead letters must not be lost or doubled either

    req = spool_dirs[names.SPOOL_REQUESTS]
    dsn, log = cfg.store.dsn, tmp_path / "stream.log"
    open_store(cfg)  # migrated, so the test can count rows from the start
    rest_port, rpc_port = _free_ports(2)
    # heartbeats short enough that the killed TaskManager's slot is given up in seconds
    spec = ClusterSpec(root=tmp_path / "flink", rest_port=rest_port, rpc_port=rpc_port, taskmanagers=2,
                       slots=1, heartbeat_interval_ms=1000, heartbeat_timeout_ms=8000)
    knobs = dict(parallelism=2, watermark_delay_s=DELAY_MS / 1000, checkpoint_interval_s=1.0,
                 monitor_interval_s=0.2, sink_flush_s=0.2, idle_timeout_s=60, restart_attempts=30)
    cluster = Cluster(spec)
    proc = None
    try:
        cluster = Cluster.start(spec)
        for segs in writers.values():
            for seg in segs[:4]:
                publish(req, *seg)
        proc = start_stream(cfg, "--jobmanager", cluster.address, "--kinds", "requests", log=log, **knobs)
        _wait(_until(proc, lambda: _count(dsn, "SELECT count(*) FROM request_windows") > 0), 180, "first windows", log)
        ckpt = cfg.checkpoint_dir()
        seen = set(ckpt.glob("*/chk-*/_metadata"))
        _wait(lambda: set(ckpt.glob("*/chk-*/_metadata")) - seen, 60, "a checkpoint", log)
        before = _count(dsn, "SELECT count(*) FROM request_windows")
        assert 0 < before < len(want)
        job = _job(cluster)
        assert job is not None and job["state"] == "RUNNING", cluster.status()

        victim = cluster.taskmanager_pids()[0]
        killed_ms = time.time() * 1000
        cluster.kill_taskmanager(victim, signal.SIGKILL)
        for segs in writers.values():  # the rest arrives while the job recovers
            for seg in segs[4:]:
                publish(req, *seg)
        cluster.add_taskmanager()
        _wait(_until(proc, lambda: _count(dsn, "SELECT count(*) FROM request_windows") >= len(want)
                     and _count(dsn, "SELECT count(*) FROM dead_letters") >= len(want_dead)), 240,
              f"{len(want)} windows and {len(want_dead)} dead letters", log,
              lambda: (f"{_count(dsn, 'SELECT count(*) FROM request_windows')} windows, "
                       f"{_count(dsn, 'SELECT count(*) FROM dead_letters')} dead letters;\n"
                       f"{_diagnosis(cluster, job['id'], dsn)}\n"))
        time.sleep(1.0)  # a double write, if any, would land now
        assert proc.poll() is None, log.read_text()[-3000:]  # the driver still waits on the job
        assert victim not in cluster.taskmanager_pids() and len(cluster.taskmanager_pids()) == 2
        same = _job(cluster)
        assert same is not None and same["id"] == job["id"] and same["state"] == "RUNNING", cluster.status()
        restored = cluster.rest(f"/jobs/{job['id']}/checkpoints")["latest"]["restored"]
        assert restored is not None, "the job did not restore from a checkpoint"
        assert restored["restore_timestamp"] > killed_ms, restored
        restore_s = (restored["restore_timestamp"] - killed_ms) / 1000
    finally:
        if proc is not None:
            kill_group(proc)
        cluster.stop()
    pid_files = list((spec.root / "pids").glob("*.pid"))
    assert not cluster.processes() and not pid_files, (cluster.processes(), pid_files)
    _check(dsn, want, want_dead)
    print(f"failover test wall {time.monotonic() - t0:.1f} s; SIGKILL -> checkpoint {restored['id']} "
          f"restored {restore_s:.1f} s")
