"""``llmsla stream --once`` on the embedded store (no DSN): the job starts the server for itself
and stops it when the run is over, as every short command does (tests/test_store_lifecycle.py)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import psutil

from llmsla import names
from llmsla.store import embedded

from .conftest import LLMSLA_MAIN, ROOT


def test_stream_once_stops_the_server_it_started(tmp_path: Path, pg_root: Path) -> None:
    data = pg_root / "pg"
    env = {k: v for k, v in os.environ.items() if not k.startswith("LLMSLA_")}
    env.update({"LLMSLA_STORE_DATA_DIR": str(data), "LLMSLA_SPOOL_DIR": str(tmp_path / "spool"),
                "LLMSLA_STREAM_CHECKPOINT_DIR": str(tmp_path / "ckpt"), "LLMSLA_STREAM_METRICS_PORT": "0"})
    out = subprocess.run([sys.executable, "-c", LLMSLA_MAIN, "stream", "--once", "--kinds", names.SPOOL_REQUESTS],
                         env=env, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, (out.stdout + out.stderr)[-3000:]
    assert (data / "PG_VERSION").exists()  # it did run on the embedded server ...
    assert embedded.running(data) is None  # ... and stopped it
    want = str(data.resolve())
    assert not [p for p in psutil.process_iter(["cmdline"]) if want in (p.info["cmdline"] or [])]
