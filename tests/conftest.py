"""Session fixtures that start the real services on free loopback ports.

PostgreSQL is the embedded ``pgserver`` one unless ``LLMSLA_TEST_DSN`` points at an external
PostgreSQL/TimescaleDB, in which case every store test runs there instead. Prometheus,
Alertmanager and Redis come from PATH; a missing binary is a test *error* carrying the install
hint (never a skip), so CI cannot go green without them.
"""

from __future__ import annotations

import os
import shutil
import tempfile
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
    root = Path(tempfile.mkdtemp(prefix="llmsla-test-pg-"))
    dsn, server = start_embedded(root / "data", keep_running=False)
    yield dsn
    server.cleanup()
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture()
def pg_dsn(pg_server_dsn: str) -> Iterator[str]:
    """A fresh, empty database per test, dropped afterwards: tests never see each other's rows."""
    name = f"t_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(pg_server_dsn, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    info = psycopg.conninfo.conninfo_to_dict(pg_server_dsn)
    info["dbname"] = name
    yield psycopg.conninfo.make_conninfo(**info)
    with psycopg.connect(pg_server_dsn, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


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
    "test_spool_after_arbitrary_strings_holds_only_valid_lines",  # reads what the property test wrote
    "test_malformed_or_unreachable_dsn_is_one_line_naming_the_key",
)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    root = Path(str(config.rootpath))
    for item in items:
        rel = Path(str(item.fspath)).relative_to(root).as_posix()
        if rel.startswith(SLOW_PATHS) or item.originalname in SLOW_TESTS:
            item.add_marker(pytest.mark.slow)
