"""Stream runs leave nothing in the system temp dir: the mini-cluster's jars (planner 45 MB, RPC
24 MB) and directories go to a per-run directory under the data dir, removed when the run is over,
and a killed run's directory is removed by the next run.

The child sees a private "system temp dir" (TMPDIR for Python, JAVA_TOOL_OPTIONS' java.io.tmpdir
for every JVM), so other processes on the machine cannot disturb the count."""

from __future__ import annotations

import shutil
import time
from pathlib import Path

from llmsla import names
from llmsla.streaming import synth
from llmsla.streaming.jar import ensure_parser_jar

from .conftest import kill_group, publish, start_stream


def _entries(path: Path) -> list[str]:
    return sorted(p.name for p in path.iterdir()) if path.is_dir() else []


def test_runs_leave_nothing_in_the_system_temp_dir(cfg, spool_dirs, tmp_path: Path) -> None:
    systmp, data = tmp_path / "systmp", tmp_path / "xdg"
    systmp.mkdir()
    env = {"TMPDIR": str(systmp), "JAVA_TOOL_OPTIONS": f"-Djava.io.tmpdir={systmp}", "XDG_DATA_HOME": str(data)}
    runs = data / "llmsla" / "flink-tmp"
    jar = ensure_parser_jar()  # the data dir's jar cache, so the child does not compile it again
    assert jar is not None
    (data / "llmsla" / "flink-java").mkdir(parents=True)
    shutil.copy(jar, data / "llmsla" / "flink-java" / jar.name)
    now = int(time.time() * 1000)
    publish(spool_dirs[names.SPOOL_REQUESTS], "0000000000001-h-1-ab-000000.jsonl",
            list(synth.request_lines(synth.request_columns(300, start_ms=now - 60_000, span_ms=30_000))))
    log = tmp_path / "stream.log"

    # a continuous run killed with SIGKILL: nothing can clean up after it
    proc = start_stream(cfg, "--kinds", "requests", log=log, extra_env=env, checkpoint_interval_s=1)
    try:
        deadline = time.monotonic() + 120
        while not any(cfg.checkpoint_dir().glob("*/chk-*/_metadata")):
            assert time.monotonic() < deadline and proc.poll() is None, log.read_text()[-3000:]
            time.sleep(0.3)
    finally:
        kill_group(proc)
    left = _entries(runs)
    assert len(left) == 1 and left[0].startswith(f"run-{proc.pid}-"), left
    assert any(p.name.startswith("flink-table-planner") for p in (runs / left[0]).iterdir())  # it was used
    assert _entries(systmp) == []

    # a bounded run: removes the killed run's directory at start and its own when it is over
    proc = start_stream(cfg, "--once", "--kinds", "requests", log=log, extra_env=env)
    assert proc.wait(timeout=240) == 0, log.read_text()[-3000:]
    deadline = time.monotonic() + 60
    while _entries(runs) and time.monotonic() < deadline:  # the JVM exits just after the client
        time.sleep(0.5)
    assert _entries(runs) == []
    assert _entries(systmp) == []
