"""Session fixtures that start the real services on free loopback ports.

PostgreSQL is the embedded ``pgserver`` one unless ``LLMSLA_TEST_DSN`` points at an external
PostgreSQL/TimescaleDB, in which case every store test runs there instead. Prometheus,
Alertmanager and Redis come from PATH; a missing binary is a test *error* carrying the install
hint (never a skip), so CI cannot go green without them.

No embedded PostgreSQL started by the session may outlive it: ``pytest_sessionfinish`` lists
and stops every postmaster this session started (tagged through its environment, or with its
data dir under this session's temporary roots) and fails the run if there was one.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from llmsla import config as config_mod
from llmsla import services
from llmsla.store.connection import start_embedded


@pytest.fixture(scope="session")
def pg_server_dsn() -> Iterator[str]:
    """DSN of a server for the whole session (admin database).

    The data dir is outside pytest's tmp tree on purpose: running as root, pgserver runs
    postgres as an unprivileged user, and pytest re-applies mode 0700 to its own tmp root
    whenever a test asks for a tmp dir, which would lock the running server out of its files.
    """
    external = os.environ.get("LLMSLA_TEST_DSN")
    if external:
        yield external
        return
    root = pg_temp_root("llmsla-test-pg-")
    dsn, server = start_embedded(root / "data", keep_running=False)
    yield dsn
    server.close()  # stops it: this session started it and nothing else holds it
    shutil.rmtree(root, ignore_errors=True)


#: set in every process of a test session (and inherited by what it starts, postmasters
#: included) so the session can tell its servers from other sessions' and the developer's;
#: not an LLMSLA_ name, which the CLI tests strip and the config loader would read
SESSION_TAG = "LLMSLATEST_SESSION"
_SESSION_ROOTS: list[Path] = []


def pg_temp_root(prefix: str) -> Path:
    """A directory for embedded data dirs outside pytest's 0700 tmp tree (see pg_server_dsn),
    registered so the end-of-session check inspects what is under it."""
    root = Path(tempfile.mkdtemp(prefix=prefix)).resolve()
    _SESSION_ROOTS.append(root)
    return root


@pytest.fixture()
def pg_root() -> Iterator[Path]:
    """A fresh :func:`pg_temp_root` for one test, removed afterwards."""
    root = pg_temp_root("llmsla-test-pg-")
    yield root
    shutil.rmtree(root, ignore_errors=True)


def pytest_configure(config: pytest.Config) -> None:
    os.environ[SESSION_TAG] = f"{os.getpid()}-{uuid.uuid4().hex[:12]}"


@pytest.fixture(autouse=True)
def _machine_share(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """With several test processes (``TEST_WORKERS``), a test marked ``exclusive`` waits until the
    tests running beside it end and runs alone; the others share the machine. Two flock()ed files
    under the run's temporary root: every test holds ``machine`` shared, an exclusive one holds it
    exclusively, and passes through ``gate`` first so that a stream of shared tests cannot keep
    it waiting (a shared test takes ``gate`` only for the instant it takes ``machine``)."""
    if not hasattr(request.config, "workerinput"):  # not an xdist worker (its env is inherited by inner runs)
        yield
        return
    import fcntl

    root = tmp_path_factory.getbasetemp().parent  # the run's root, above every worker's own
    exclusive = request.node.get_closest_marker("exclusive") is not None
    with open(root / "machine.gate", "a") as gate, open(root / "machine.lock", "a") as machine:
        if exclusive:
            fcntl.flock(gate, fcntl.LOCK_EX)
            fcntl.flock(machine, fcntl.LOCK_EX)
        else:
            fcntl.flock(gate, fcntl.LOCK_SH)
            fcntl.flock(machine, fcntl.LOCK_SH)
            fcntl.flock(gate, fcntl.LOCK_UN)
        try:
            yield
        finally:
            fcntl.flock(machine, fcntl.LOCK_UN)
            fcntl.flock(gate, fcntl.LOCK_UN)


def session_postmasters(tag: str, roots: list[Path]) -> list[tuple[int, str]]:
    """(pid, data dir) of every live postmaster this session started: its environment carries
    ``tag``, or its data dir lies under one of ``roots``. Nobody else's server is listed."""
    import psutil

    found = []
    for proc in psutil.process_iter(["name", "cmdline"]):
        cmd = proc.info["cmdline"] or []
        if not (proc.info["name"] or "").startswith("postgres") or "-D" not in cmd[:-1]:
            continue  # backends rewrite their title; only the postmaster keeps `-D <dir>`
        pgdata = Path(cmd[cmd.index("-D") + 1])
        try:
            ours = proc.environ().get(SESSION_TAG) == tag
        except psutil.Error:
            ours = False
        if ours or any(pgdata == r or r in pgdata.parents for r in roots):
            found.append((proc.pid, str(pgdata)))
    return found


def _stop_postmaster(pid: int) -> None:
    import psutil

    try:
        proc = psutil.Process(pid)
        for sig in (signal.SIGINT, signal.SIGQUIT, signal.SIGKILL):
            proc.send_signal(sig)
            try:
                proc.wait(15)
                return
            except psutil.TimeoutExpired:
                continue
    except psutil.NoSuchProcess:
        return


@pytest.hookimpl(trylast=True)  # after the runner's, which tears the session fixtures down
def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    tag = os.environ.get(SESSION_TAG)
    if not tag:
        return
    roots = [*_SESSION_ROOTS]
    basetemp = getattr(getattr(session.config, "_tmp_path_factory", None), "_basetemp", None)
    if basetemp is not None:  # only if a test made one: getbasetemp() would create it
        roots.append(Path(basetemp).resolve())
    deadline = time.monotonic() + 5  # a server whose last user just exited is stopping now
    survivors = session_postmasters(tag, roots)
    while survivors and time.monotonic() < deadline:
        time.sleep(0.25)
        survivors = session_postmasters(tag, roots)
    if not survivors:
        return
    lines = [f"{len(survivors)} embedded PostgreSQL server(s) started by this test session outlived it "
             "(whatever starts one must stop it: close the store handle, or `llmsla store stop`); stopped now:"]
    lines += [f"  postmaster pid {pid}, data dir {pgdata}" for pid, pgdata in survivors]
    for pid, _ in survivors:
        _stop_postmaster(pid)
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    for line in lines:
        if reporter is not None:
            reporter.write_line(line, red=True)
        else:
            print(line)
    session.exitstatus = pytest.ExitCode.TESTS_FAILED


@contextlib.contextmanager
def fresh_database(server_dsn: str) -> Iterator[str]:
    """The DSN of a new, empty database on ``server_dsn``'s server, dropped on exit."""
    name = f"t_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(server_dsn, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    info = psycopg.conninfo.conninfo_to_dict(server_dsn)
    info["dbname"] = name
    try:
        yield psycopg.conninfo.make_conninfo(**info)
    finally:
        with psycopg.connect(server_dsn, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture()
def pg_dsn(pg_server_dsn: str) -> Iterator[str]:
    """A fresh, empty database per test, dropped afterwards: tests never see each other's rows."""
    with fresh_database(pg_server_dsn) as dsn:
        yield dsn


@pytest.fixture()
def cfg(tmp_path: Path, pg_dsn: str) -> config_mod.Config:
    """A config pointing at this test's database and a private spool directory."""
    c = config_mod.load(env={})
    c.store.dsn = pg_dsn
    c.spool.dir = str(tmp_path / "spool")
    c.stream.checkpoint_dir = str(tmp_path / "checkpoints")
    return c


@pytest.fixture(scope="session")
def prometheus_bin() -> str:
    return services.find_binary("prometheus")


@pytest.fixture(scope="session")
def alertmanager_bin() -> str:
    return services.find_binary("prometheus-alertmanager", "alertmanager")


@pytest.fixture()
def start_prometheus(tmp_path: Path, prometheus_bin: str) -> Iterator:
    """Factory: ``start_prometheus(jobs={...}, rule_files=..., interval_s=...)`` -> Service."""
    started: list[services.Service] = []

    def _start(jobs: dict[str, list[str]], *, interval_s: float = 0.5, extra_files: dict[str, str] | None = None,
               alertmanagers: list[str] | None = None) -> services.Service:
        yaml = services.scrape_config(
            jobs, interval_s=interval_s, rule_files=sorted(extra_files or {}), alertmanagers=alertmanagers
        )
        svc = services.start_prometheus(tmp_path / f"prometheus{len(started)}", config_yaml=yaml, extra_files=extra_files)
        started.append(svc)
        return svc

    yield _start
    for svc in started:
        svc.stop()


@pytest.fixture()
def start_alertmanager(tmp_path: Path, alertmanager_bin: str) -> Iterator:
    """Factory: ``start_alertmanager(config_yaml)`` -> Service."""
    started: list[services.Service] = []

    def _start(config_yaml: str) -> services.Service:
        svc = services.start_alertmanager(tmp_path / f"alertmanager{len(started)}", config_yaml=config_yaml)
        started.append(svc)
        return svc

    yield _start
    for svc in started:
        svc.stop()


@pytest.fixture()
def redis_service(tmp_path: Path) -> Iterator[services.Service]:
    """A real redis-server on a free port (url in ``.extra['url']``)."""
    svc = services.start_redis(tmp_path / "redis")
    yield svc
    svc.stop()


#: Integration runs that take tens of seconds each (a Flink mini-cluster, the whole demo, a real
#: Prometheus scraping thousands of requests): `make test-fast` leaves them out, `make test` runs
#: everything. Marked here by place so a new test in these files is slow without remembering to.
SLOW_PATHS: tuple[str, ...] = (
    "tests/streaming/",
    "tests/test_demo.py",
    "tests/test_demo_real.py",
    "tests/exporters/test_gateway_prometheus.py",
    "tests/forecaster/test_online.py",
)
SLOW_TESTS: tuple[str, ...] = (
    "test_arbitrary_strings_never_blind_metrics_or_poison_the_spool",
    "test_malformed_or_unreachable_dsn_is_one_line_naming_the_key",
)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    root = Path(str(config.rootpath))
    for item in items:
        rel = Path(str(item.fspath)).relative_to(root).as_posix()
        if rel.startswith(SLOW_PATHS) or item.originalname in SLOW_TESTS:
            item.add_marker(pytest.mark.slow)
