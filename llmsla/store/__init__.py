"""The store: PostgreSQL (embedded from ``pgserver`` by default) or TimescaleDB via a DSN.

``open_store(cfg)`` gives a :class:`~llmsla.store.connection.StoreHandle` with a DSN that is
ready to use: the server is running and migrations are applied.
"""

from llmsla.store.connection import StoreError, StoreHandle, connect, open_store

__all__ = ["StoreError", "StoreHandle", "connect", "open_store"]
