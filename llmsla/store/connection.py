"""Connections: resolve the DSN (``--dsn``, ``LLMSLA_DSN``, else the embedded server), connect
with a timeout, and never print a password."""

from __future__ import annotations

import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
from psycopg.abc import Params

from llmsla import extras
from llmsla.config import Config, dsn_problem
from llmsla.errors import UserError
from llmsla.redaction import redact, scrub, secrets_of
from llmsla.store import embedded
from llmsla.store.embedded import EmbeddedServer

# platformdirs warns about XDG_RUNTIME_DIR on servers without a login session; pgserver asks it
# for a lock directory on every call. The fallback (/tmp) is fine, the noise is not.
warnings.filterwarnings("ignore", message=".*XDG_RUNTIME_DIR.*")


class StoreError(UserError, RuntimeError):
    """The store cannot be reached or prepared; the message says what to do."""


def check_dsn(dsn: str, key: str = "store.dsn") -> None:
    """A one-line :class:`StoreError` naming ``key`` for a DSN psycopg cannot parse: the check
    ``store.dsn`` declares (:func:`llmsla.config.dsn_problem`, which ``config check`` runs too),
    for DSNs that do not come from the configuration (``open_store(dsn=...)``)."""
    problem = dsn_problem(dsn)
    if problem is not None:
        raise StoreError(f"{key}: {problem} (got {redact(dsn)})")


@dataclass
class StoreHandle:
    """A ready store: its DSN and, for the embedded server, this process's handle on it.
    :meth:`close` it (or use it as a context manager) when the command is done with it."""

    dsn: str
    embedded: bool
    data_dir: Path | None = None
    _server: EmbeddedServer | None = None
    key: str = "store.dsn"  #: where the DSN came from, for messages ("store.dsn (from --dsn)")
    timeout_s: float = 10.0  #: store.connect_timeout_s

    def connect(self, **kwargs: Any) -> psycopg.Connection:
        kwargs.setdefault("timeout_s", self.timeout_s)
        try:
            return connect(self.dsn, **kwargs)
        except StoreError as exc:
            raise StoreError(f"{self.key}: {exc}") from None

    def close(self) -> None:
        """Release the embedded server: the last llmsla process to go stops one llmsla
        started and nobody kept. A no-op for an external DSN, and the second time."""
        if self._server is not None:
            self._server.close()
            self._server = None

    def __enter__(self) -> StoreHandle:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def start_embedded(data_dir: Path, *, keep_running: bool = False) -> tuple[str, EmbeddedServer]:
    """Start (or join) the embedded PostgreSQL in ``data_dir``; returns (dsn, server handle).

    Close the handle when done (``server.close()``; also at exit and on SIGTERM): the last
    llmsla process to let go stops a server llmsla started, unless ``keep_running`` (``llmsla
    store start``, ``demo --keep``) asked to keep it until ``llmsla store stop``. A server found
    running that llmsla did not start is left as it was (llmsla.store.embedded).
    """
    extras.require("embedded", "the embedded PostgreSQL (no store.dsn / --dsn)")
    data_dir = Path(data_dir).expanduser()
    try:
        data_dir.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:  # store.data_dir from the file or the environment: --data-dir is checked earlier
        raise StoreError(f"store.data_dir {data_dir}: cannot create {exc.filename or data_dir.parent}: "
                         f"{exc.strerror or exc}") from None
    try:
        server = embedded.start(data_dir, keep=keep_running)
    except Exception as exc:
        raise StoreError(f"embedded PostgreSQL failed to start in {data_dir}: {exc}") from exc
    return server.dsn, server


def scalar(conn: psycopg.Connection[Any], query: str, params: Params | None = None) -> Any:
    """The first column of the one row ``query`` returns (``count(*)``, ``SHOW``, ``to_regclass``).
    A query of that kind always returns a row; if none comes back the store is not what this code
    was written for, so say so instead of failing on ``None[0]``."""
    row = conn.execute(query, params).fetchone()
    if row is None:
        raise StoreError(f"the store returned no row for {query!r}")
    return row[0]


def connect(dsn: str, *, timeout_s: float = 10.0, autocommit: bool = False, **kwargs: Any) -> psycopg.Connection:
    """Connect, retrying until ``timeout_s`` (a database that is restarting is not an error yet)."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return psycopg.connect(dsn, autocommit=autocommit, connect_timeout=max(1, int(timeout_s)), **kwargs)
        except psycopg.OperationalError as exc:
            if time.monotonic() >= deadline:
                reason = scrub(" ".join(str(exc).split()), secrets_of(dsn))
                raise StoreError(f"cannot connect to {redact(dsn)}: {reason}") from None
            time.sleep(0.2)
        except psycopg.ProgrammingError:
            check_dsn(dsn, "DSN")
            raise


def open_store(cfg: Config, *, dsn: str | None = None, migrate: bool = True, keep_running: bool = False) -> StoreHandle:
    """The configured store, started if embedded and migrated unless ``migrate=False``.

    An embedded server this call starts stops when the handle is closed (or this process
    ends), unless ``keep_running``; see :func:`start_embedded`.
    """
    dsn = dsn or cfg.store.dsn
    if dsn:
        check_dsn(dsn, cfg.origin("store.dsn"))
        handle = StoreHandle(dsn=dsn, embedded=False, key=cfg.origin("store.dsn"), timeout_s=cfg.store.connect_timeout_s)
    else:
        data_dir = cfg.store_data_dir()
        uri, server = start_embedded(data_dir, keep_running=keep_running)
        handle = StoreHandle(dsn=uri, embedded=True, data_dir=data_dir, _server=server)
    if migrate:
        from llmsla.store.migrate import migrate as run_migrations

        try:
            with handle.connect() as conn:
                run_migrations(conn, cfg)
        except BaseException:
            handle.close()
            raise
    return handle
