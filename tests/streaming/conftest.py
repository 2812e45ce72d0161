"""Helpers to run ``llmsla stream`` as a real process (its own JVM mini-cluster) on a test config."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from llmsla import config as config_mod
from llmsla import names

ROOT = Path(__file__).resolve().parents[2]
#: `python -m llmsla.cli` would import the CLI twice (as __main__ and as llmsla.cli), and a
#: component's CliError would then escape main() as a traceback; this runs it like the script.
LLMSLA_MAIN = "import sys; from llmsla.app.cli import main; sys.exit(main())"


def stream_env(cfg: config_mod.Config, **stream: object) -> dict[str, str]:
    """Environment for a ``llmsla stream`` child: the test config as ``LLMSLA_*`` variables."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("LLMSLA_")}
    env.update({
        "LLMSLA_STORE_DSN": cfg.store.dsn,
        "LLMSLA_SPOOL_DIR": str(cfg.spool_dir()),
        "LLMSLA_STREAM_CHECKPOINT_DIR": str(cfg.checkpoint_dir()),
        "LLMSLA_STORE_TIMESCALE": cfg.store.timescale,
        "LLMSLA_STREAM_METRICS_PORT": "0",  # tests run side by side: each job's /metrics on a free port
    })
    for key, value in stream.items():
        env[f"LLMSLA_STREAM_{key.upper()}"] = str(value)
    return env


def start_stream(cfg: config_mod.Config, *args: str, log: Path, extra_env: dict[str, str] | None = None,
                 **stream: object) -> subprocess.Popen:
    """Start ``llmsla stream`` in its own process group (JVM and Python workers die with it)."""
    fh = open(log, "ab")  # noqa: SIM115 - closed by the OS when the child exits; kept for the log
    return subprocess.Popen(
        [sys.executable, "-c", LLMSLA_MAIN, "stream", *args],
        env={**stream_env(cfg, **stream), **(extra_env or {})}, stdout=fh, stderr=subprocess.STDOUT, cwd=ROOT,
        start_new_session=True,
    )


def kill_group(proc: subprocess.Popen) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)


@pytest.fixture()
def spool_dirs(cfg: config_mod.Config) -> dict[str, Path]:
    dirs = {k: cfg.spool_dir() / k for k in names.SPOOL_KINDS}
    for d in dirs.values():
        d.mkdir(parents=True, exist_ok=True)
    return dirs


def publish(dir_: Path, name: str, lines: list[str] | list[bytes]) -> Path:
    """Write a segment the way SpoolWriter does: hidden in-progress file, then atomic rename.
    Lines may be bytes (to write what no str can: invalid UTF-8)."""
    hidden = dir_ / ".inprogress"
    hidden.mkdir(exist_ok=True)
    tmp = hidden / name
    tmp.write_bytes(b"".join((line if isinstance(line, bytes) else line.encode()) + b"\n" for line in lines))
    final = dir_ / name
    os.rename(tmp, final)
    return final
