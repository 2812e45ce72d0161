"""Every subcommand refuses a bad argument as one line and exit code 2, never a traceback, a
hang or a value that silently means something else (issue 39, item 8).

Rows argparse must refuse are parsed in one subprocess (``PARSE_ROWS``): a row that parses is a
failure by itself (the command would have run with that value), so none of them starts anything.
The rest run the real command: failed binds, the A/B report's range bound, the spool commands
over entries that are not segments (under a timeout, so a hang fails).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

TIMEOUT_S = 60

#: (argv, a substring of the one-line message); every row must exit 2.
PARSE_ROWS: list[tuple[list[str], str]] = [
    # time ranges: bounded before anything is allocated (year 1 asked for 31.8 GiB)
    (["ab", "report", "--experiment", "exp", "--from=0001-01-01T00:00:00Z"], "a time must lie between 1970-01-01"),
    (["ab", "report", "--experiment", "exp", "--from=-1000000d"], "a time must lie between"),
    (["ab", "report", "--experiment", "exp", "--to", "3000-01-01T00:00:00Z"], "a year from now"),
    (["ab", "report", "--experiment", "exp", "--from", "yesterday"], "argument --from: cannot read 'yesterday' as a time"),
    (["ab", "report", "--experiment", "exp", "--json", "{tmp}/missing/r.json"], "argument --json: "),
    (["report", "--from", "0001-01-01T00:00:00Z", "--out", "{tmp}/r.html"], "a time must lie between"),
    (["report", "--from=-1h", "--out", "{tmp}"], "is a directory"),
    (["report", "--from=-1h", "--out", "{tmp}/r.html", "--scrape-interval", "nan"], "finite"),
    (["report", "--from=-1h", "--out", "{tmp}/r.html", "--prometheus", "localhost:9090"], "must start with http://"),
    # ports: 0..65535 where 0 means a free one, never wrapped (99999 bound 34463)
    (["gateway", "--control-port", "99999"], "argument --control-port: port must be 0..65535, got 99999"),
    (["gateway", "--port", "-1"], "port must be 0..65535"),
    (["gateway", "--port", "http"], "expected an integer"),
    (["gpu", "--port", "65536"], "port must be 0..65535"),
    (["engines", "--port", "99999"], "port must be 0..65535"),
    (["engines", "--host", "bad host"], "neither an IP address nor a host name"),
    (["worker", "--port", "99999"], "port must be 0..65535"),
    (["receiver", "--port", "70000"], "port must be 0..65535"),
    (["control", "serve", "--port", "99999"], "port must be 0..65535"),
    (["simulate", "--control-port", "99999"], "port must be 0..65535"),
    (["simulate", "--metrics-port", "-5"], "port must be 0..65535"),
    (["flink", "start", "--rest-port", "0"], "port must be 1..65535"),
    (["worker", "--admin-port", "65536"], "worker.admin_port: must be <= 65535"),
    # hosts: syntax here; resolution is the bind's one-line error (below)
    (["gateway", "--host", "not a host!"], "neither an IP address nor a host name"),
    (["control", "serve", "--host", ""], "empty listen address"),
    # counts, rates, durations: finite and in range; the same rule as the config key where there is one
    (["gateway", "--workers", "0"], "gateway.workers: must be >= 1"),
    (["worker", "--max-batch", "0"], "worker.max_batch: must be >= 1"),
    (["worker", "--temperature-policy", "warm"], "worker.temperature_policy: must be one of"),
    (["worker", "--policy", "warm"], "worker.temperature_policy: must be one of"),  # the old spelling
    (["worker", "--model", ""], "worker.model: must not be empty"),
    (["simulate", "--load", "poisson", "--rate", "-5"], "argument --rate: must be > 0, got -5.0"),
    (["simulate", "--load", "poisson", "--rate", "nan"], "expected a finite number"),
    (["simulate", "--load", "poisson", "--duration", "inf"], "expected a finite number"),
    (["simulate", "--load", "poisson", "--duration", "1e12"], "must be <= "),
    (["simulate", "--student-share", "1.5"], "must be <= 1"),
    (["simulate", "--route-policy", "fastest"], "control.route_policy: must be one of"),
    (["simulate", "--policy", "fastest"], "control.route_policy: must be one of"),  # the old spelling
    (["simulate", "--timeout-s", "0"], "gateway.request_timeout_s: must be >= 0.1"),
    (["simulate", "--start-ms", "-1"], "ms since the epoch"),
    (["receiver", "--duration-s", "-5"], "argument --duration-s: must be >= 0"),
    (["control", "serve", "--duration-s", "-5"], "argument --duration-s: must be >= 0"),
    (["forecast", "serve", "--steps", "-5"], "argument --steps: must be >= 0"),
    (["forecast", "run", "--steps", "-5"], "argument --steps: must be >= 0"),  # the old spelling
    (["forecast", "serve", "--receiver", "ftp://x"], "forecast.receiver_url: must start with http://"),
    (["forecast", "dataset", "--runs", "1,2"], "expected 3 comma-separated values"),
    (["forecast", "dataset", "--duration-s", "10,nan,10"], "val: expected a finite number"),
    (["forecast", "eval", "--folds", "1"], "must be >= 2"),
    (["replay", "--url", "ftp://x", "--duration", "5"], "must start with http://"),
    (["replay", "--url", "http://127.0.0.1:1", "--duration", "-5"], "must be > 0"),
    (["flink", "start", "--taskmanagers", "0"], "must be >= 1"),
    (["flink", "start", "--taskmanager-memory", "0m"], "expected a size such as 1536m or 2g, got '0m'"),
    (["demo", "--minutes", "nan"], "expected a finite number"),
    (["slo", "generate", "--window-scale", "0"], "must be > 0"),
    # paths: files to read exist and are regular files; outputs can be written; dirs can be made
    (["receiver", "--action-policy", "{tmp}"], "argument --action-policy: {tmp}: is a directory"),
    (["receiver", "--policy", "{tmp}"], "argument --policy: {tmp}: is a directory"),  # the old spelling
    (["receiver", "--policy", "{tmp}/nope.yaml"], "file not found"),
    (["receiver", "--policy", "{fifo}"], "not a regular file"),
    (["forecast", "train", "--data", "{tmp}"], "is a directory"),
    (["forecast", "eval", "--nab", "{tmp}/none"], "no such directory"),
    (["deploy", "validate", "--dir", "{file}"], "not a directory"),
    (["slo", "generate", "--specs", "{tmp}/none"], "no such directory"),
    (["simulate", "--json", "{tmp}/missing/s.json"], "missing"),
    (["simulate", "--json", "{tmp}"], "is a directory"),
    (["simulate", "--labels", "{file}/labels.json"], "not a directory"),
    (["simulate", "--spool", "{file}"], "exists and is not a directory"),
    (["replay", "--url", "http://127.0.0.1:1", "--duration", "5", "--json", "{tmp}/missing/r.json"], "missing"),
    (["forecast", "eval", "--json", "{file}/x.json"], "not a directory"),
    (["demo", "--json", "{tmp}"], "is a directory"),
    (["demo", "--workdir", "{file}/w"], "cannot create the directory"),
    (["deploy", "render", "--out", "{file}/k8s"], "argument --out: {file}/k8s: cannot create the directory"),
    (["dashboards", "build", "--out", "{file}/g"], "cannot create the directory"),
    (["schemas", "--out", "{file}/s"], "cannot create the directory"),
    (["slo", "generate", "--rules-out", "{file}/r"], "argument --rules-out: {file}/r: cannot create the directory"),
    (["--data-dir", "{file}/pg", "store", "status"], "argument --data-dir: {file}/pg: cannot create the directory"),
    (["--data-dir", "/proc/llmsla-pg", "store", "status"], "/proc/llmsla-pg: cannot create the directory"),
]

#: Parses each argv with the real parser; a row that parses is reported as such (rc None).
_PARSER = r"""
import contextlib, io, json, sys
from llmsla.app import cli
parser = cli.build_parser()
out = []
for argv in json.load(sys.stdin):
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            parser.parse_args(argv)
            rc = None
        except SystemExit as exc:
            rc = exc.code
    out.append([rc, err.getvalue()])
json.dump(out, sys.stdout)
"""


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("LLMSLA_")}
    env.update(extra)
    return env


def llmsla(*args: str, env: dict[str, str] | None = None, timeout: float = TIMEOUT_S) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "llmsla", *args], capture_output=True, text=True,
                          env=env or _env(), timeout=timeout, stdin=subprocess.DEVNULL)


@pytest.fixture(scope="module")
def paths(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    tmp = tmp_path_factory.mktemp("args")
    (tmp / "file.txt").write_text("a regular file\n")
    os.mkfifo(tmp / "fifo.yaml")
    return {"tmp": str(tmp), "file": str(tmp / "file.txt"), "fifo": str(tmp / "fifo.yaml")}


@pytest.fixture(scope="module")
def parsed(paths: dict[str, str]) -> dict[int, tuple[int | None, str]]:
    rows = [[a.format(**paths) for a in argv] for argv, _ in PARSE_ROWS]
    res = subprocess.run([sys.executable, "-c", _PARSER], input=json.dumps(rows), capture_output=True,
                         text=True, env=_env(), timeout=TIMEOUT_S)
    assert res.returncode == 0, res.stderr
    return dict(enumerate(tuple(r) for r in json.loads(res.stdout)))


@pytest.mark.parametrize("i", range(len(PARSE_ROWS)), ids=[" ".join(a)[:60] for a, _ in PARSE_ROWS])
def test_argparse_refuses(i: int, parsed: dict[int, tuple[int | None, str]], paths: dict[str, str]) -> None:
    argv, needle = PARSE_ROWS[i]
    rc, err = parsed[i]
    assert rc == 2, f"{argv}: parsed (the command would run with it)" if rc is None else err
    assert "Traceback" not in err
    last = err.strip().splitlines()[-1]  # after the usage lines, one line: "llmsla <cmd>: error: argument --x: why"
    assert last.startswith("llmsla") and ": error: argument " in last, err
    assert needle.format(**paths) in last, err


def test_time_and_port_types_accept_the_documented_forms() -> None:
    import argparse
    import datetime as dt

    from llmsla import argtypes

    now = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
    for text, want in [("now", now), ("-6h", now - dt.timedelta(hours=6)), ("now-2d", now - dt.timedelta(days=2)),
                       ("now-1w", now - dt.timedelta(weeks=1)), ("2025-01-31T12:00:00Z", dt.datetime(2025, 1, 31, 12, tzinfo=dt.UTC)),
                       ("2025-01-31T12:00:00", dt.datetime(2025, 1, 31, 12, tzinfo=dt.UTC)), ("0", dt.datetime(1970, 1, 1, tzinfo=dt.UTC))]:
        assert argtypes.time(text, now=now) == want, text
    for bad in ("", "nan", "inf", "-6y", "now-99999999999999d", "1e300"):
        with pytest.raises(argparse.ArgumentTypeError):
            argtypes.time(bad, now=now)
    assert argtypes.port0("0") == 0 and argtypes.port("65535") == 65535
    with pytest.raises(argparse.ArgumentTypeError):
        argtypes.port("0")


def test_a_relative_time_may_follow_its_option_as_its_own_word() -> None:
    """``--from -14d`` is how the docs spell it; argparse alone reads ``-14d`` as an unknown option."""
    import datetime as dt

    from llmsla.app import cli

    parser = cli.build_parser()
    before = dt.datetime.now(dt.UTC)
    for argv in (["forecast", "dataset", "--from-store", "--from", "-14d", "--to", "-1.5h"],
                 ["forecast", "dataset", "--from-store", "--from=-14d", "--to=-1.5h"]):
        args = parser.parse_args(argv)
        assert before - dt.timedelta(days=14, seconds=5) < args.start <= before - dt.timedelta(days=14) + dt.timedelta(seconds=5)
        assert abs((args.end - (before - dt.timedelta(hours=1.5))).total_seconds()) < 5
    # a plain negative number and an unknown dash word are argparse's to judge, as before
    from llmsla import argtypes
    assert argtypes.attach_relative_times(["--x", "-5", "-v", "-14d"]) == ["--x", "-5", "-v", "-14d"]
    assert argtypes.attach_relative_times(["--to", "-2w", "--from", "now"]) == ["--to=-2w", "--from", "now"]


# -- failed binds: one line, for every server (llmsla.httpkit.serve and services.free_port) --------
@pytest.fixture()
def busy_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        yield s.getsockname()[1]


def _one_line_error(out: subprocess.CompletedProcess, needle: str) -> None:
    assert out.returncode == 2, (out.returncode, out.stderr)
    assert "Traceback" not in out.stderr, out.stderr
    assert needle in out.stderr, out.stderr


@pytest.mark.parametrize("server", [["gateway", "--upstream", "http://127.0.0.1:9"], ["gpu"]])
def test_port_in_use(server: list[str], busy_port: int, tmp_path: Path) -> None:
    out = llmsla(*server, "--port", str(busy_port), env=_env(LLMSLA_SPOOL_DIR=str(tmp_path)))
    _one_line_error(out, f"llmsla: error: cannot listen on 127.0.0.1:{busy_port}: Address already in use")


@pytest.mark.parametrize("host, needle", [
    ("no-such-host.invalid", "cannot resolve host 'no-such-host.invalid'"),
    ("192.0.2.1", "cannot listen on 192.0.2.1:0:"),  # TEST-NET-1: never an address of this machine
])
def test_gateway_host_that_cannot_be_bound(host: str, needle: str, tmp_path: Path) -> None:
    out = llmsla("gateway", "--upstream", "http://127.0.0.1:9", "--host", host, "--port", "0",
                 env=_env(LLMSLA_SPOOL_DIR=str(tmp_path)))
    _one_line_error(out, needle)


def test_background_server_port_in_use(busy_port: int, tmp_path: Path) -> None:
    """The simulator's /metrics listens from BackgroundServer: the same one line."""
    out = llmsla("simulate", "--load", "poisson", "--duration", "5", "--no-events", "--metrics-port", str(busy_port),
                 env=_env(LLMSLA_SPOOL_DIR=str(tmp_path)))
    _one_line_error(out, f"cannot listen on 127.0.0.1:{busy_port}: Address already in use")


def test_ab_report_range_is_bounded_before_the_store_opens() -> None:
    spec = {"exp": {"seed": 1, "arms": {"control": {}, "treat": {}}}}
    env = _env(LLMSLA_AB_EXPERIMENTS=json.dumps(spec), LLMSLA_STORE_DSN="postgresql://nobody@127.0.0.1:1/none")
    out = llmsla("ab", "report", "--experiment", "exp", "--from=-200d", env=env)
    _one_line_error(out, "--from/--to: the range is 200.0 days; at most 120")


def test_data_dir_from_the_environment_that_cannot_be_made(tmp_path: Path) -> None:
    """--data-dir is refused by argparse; the same key from the environment, where the store starts."""
    (tmp_path / "file").write_text("")
    out = llmsla("migrate", env=_env(LLMSLA_STORE_DATA_DIR=str(tmp_path / "file" / "pg")))
    _one_line_error(out, f"store.data_dir {tmp_path}/file/pg: cannot create {tmp_path}/file: File exists")


# -- the spool commands over entries that are not segments -------------------------------------------
@pytest.fixture()
def odd_spool(tmp_path: Path) -> Path:
    from llmsla import names

    root = tmp_path / "spool"
    d = root / names.SPOOL_REQUESTS
    (d / ".inprogress").mkdir(parents=True)
    os.mkfifo(d / "0001-fifo.jsonl")
    os.symlink(tmp_path / "gone", d / "0002-dangling.jsonl")
    (d / "0003-dir.jsonl").mkdir()
    socket.socket(socket.AF_UNIX).bind(str(d / "0004-sock.jsonl"))
    os.mkfifo(d / ".inprogress" / "0005-fifo.jsonl")
    os.utime(d / ".inprogress" / "0005-fifo.jsonl", (1, 1))  # old enough to recover: never read
    old = d / "0006-good.jsonl"
    old.write_text("")
    os.utime(old, (1, 1))
    return root


@pytest.mark.parametrize("action, stdout", [
    ("check", "0 good, 0 bad lines, 5 entries skipped"),
    ("stats", '"skipped"'),
    ("prune", "requests: removed 1 segments"),
    ("recover", "requests: published 0 abandoned segments"),
])
def test_spool_skips_what_is_not_a_segment(action: str, stdout: str, odd_spool: Path) -> None:
    out = llmsla("spool", action, env=_env(LLMSLA_SPOOL_DIR=str(odd_spool)), timeout=30)  # a FIFO read would hang
    assert out.returncode == 0, out.stderr
    assert "Traceback" not in out.stderr, out.stderr
    assert stdout in out.stdout, out.stdout
    for name, why in [("0001-fifo.jsonl", "a FIFO"), ("0002-dangling.jsonl", "a dangling symbolic link"),
                      ("0003-dir.jsonl", "a directory"), ("0004-sock.jsonl", "a socket"), ("0005-fifo.jsonl", "a FIFO")]:
        assert f"{name}: {why}, not a segment" in out.stderr, out.stderr
    assert (odd_spool / "requests" / "0001-fifo.jsonl").exists()  # skipped, not deleted


@pytest.mark.parametrize(("argv", "dest", "value", "new"), [
    (["worker", "--policy", "entropy"], "temperature_policy", "entropy", "--temperature-policy"),
    (["simulate", "--policy", "p2c"], "route_policy", "p2c", "--route-policy"),
])
def test_an_old_flag_spelling_sets_the_new_flag_and_says_so(argv: list[str], dest: str, value: str, new: str,
                                                            caplog: pytest.LogCaptureFixture) -> None:
    """``--policy`` meant three things; the renamed flags keep the old spelling for one release."""
    from llmsla.app.cli import build_parser

    with caplog.at_level("WARNING", logger="llmsla.argtypes"):
        args = build_parser().parse_args(argv)
    assert getattr(args, dest) == value
    assert f"--policy is renamed {new}" in caplog.text
    sub = next(a for a in build_parser()._subparsers._group_actions[0].choices.items() if a[0] == argv[0])[1]
    assert new in sub.format_help() and "--policy " not in sub.format_help()  # hidden from --help
