"""``llmsla stream --jobmanager``: what the driver sends to a cluster, without starting one (the
real submission and a TaskManager failover: tests/streaming/test_cluster_failover.py)."""

from __future__ import annotations

import socket
import sys
import zipfile
from pathlib import Path

import pytest

from llmsla import config as config_mod
from llmsla.app.cli import main
from llmsla.streaming import jar
from llmsla.streaming.job import JobOptions, flink_settings, parse_jobmanager


def test_jobmanager_address_is_host_and_rest_port() -> None:
    assert parse_jobmanager("127.0.0.1:8081") == ("127.0.0.1", 8081)
    assert parse_jobmanager("[::1]:18081") == ("::1", 18081)
    for bad in ("127.0.0.1", ":8081", "host:http", "host:0", "host:70000"):
        with pytest.raises(ValueError, match="HOST:PORT"):
            parse_jobmanager(bad)


def test_settings_target_the_cluster_with_this_interpreter(tmp_path: Path) -> None:
    cfg = config_mod.load(env={})
    cfg.stream.checkpoint_dir = str(tmp_path / "ckpt")
    conf = flink_settings(cfg, JobOptions(local=False, jobmanager="10.0.0.5:18081", resume=False))
    assert conf["execution.target"] == "remote" and conf["execution.attached"] == "true"
    assert (conf["rest.address"], conf["rest.port"]) == ("10.0.0.5", "18081")
    # the job's python.executable is what a TaskManager runs (Flink's default: `python` on PATH)
    assert conf["python.executable"] == sys.executable
    cfg.stream.python_executable = "/opt/llmsla/bin/python"
    conf = flink_settings(cfg, JobOptions(local=False, jobmanager="10.0.0.5:18081", resume=False))
    assert conf["python.executable"] == "/opt/llmsla/bin/python"
    local = flink_settings(cfg, JobOptions(resume=False))
    assert "execution.target" not in local and local["python.executable"] == sys.executable


def test_python_archive_holds_core_and_streaming_laid_out_as_llmsla(tmp_path: Path) -> None:
    archive = jar.ensure_python_archive(tmp_path)
    assert jar.ensure_python_archive(tmp_path) == archive  # cached by content
    names = set(zipfile.ZipFile(archive).namelist())
    assert {"llmsla/__init__.py", "llmsla/events.py", "llmsla/store/__init__.py",
            "llmsla/streaming/__init__.py", "llmsla/streaming/store_sink.py", "llmsla/streaming/flink_sink.py"} <= names
    assert not [n for n in names if n.startswith("llmsla/app/") or "__pycache__" in n]


def test_no_jobmanager_there_is_one_line(capsys) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # bound, not listening: the connection is refused
        assert main(["stream", "--jobmanager", f"127.0.0.1:{port}"]) == 2
    err = capsys.readouterr().err
    assert f"--jobmanager 127.0.0.1:{port}: no Flink REST endpoint answers there" in err
    assert "llmsla flink start" in err
    assert main(["stream", "--jobmanager", "nowhere"]) == 2
    assert "--jobmanager: expected HOST:PORT" in capsys.readouterr().err


def test_flink_run_entry_takes_once_and_fresh_as_program_arguments() -> None:
    """`flink run -pym llmsla.streaming.job --once`: the bounded mode is an argument (an
    LLMSLA_STREAM_ONCE variable is refused by the config loader as an unknown [stream] key)."""
    from llmsla.streaming import job

    with pytest.raises(SystemExit) as exc:
        job.main(["--twice"])
    assert exc.value.code == 2
    with pytest.raises(config_mod.ConfigError, match="unknown key 'stream.once'"):
        config_mod.load(env={"LLMSLA_STREAM_ONCE": "1"})
