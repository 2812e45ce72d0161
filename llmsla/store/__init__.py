"""The store: PostgreSQL (embedded from ``pgserver`` by default) or TimescaleDB via a DSN.

``open_store(cfg)`` gives a :class:`~llmsla.store.connection.StoreHandle` with a DSN that is
ready to use: the server is running and migrations are applied.
"""

from llmsla.store.connection import StoreHandle, connect, open_store, redact

__all__ = ["StoreHandle", "connect", "open_store", "redact"]
