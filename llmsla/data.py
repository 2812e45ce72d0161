"""Where the public data sets live (``../shared/data`` beside the checkout by default)."""

from __future__ import annotations

import os
from pathlib import Path

ENV_DATA_DIR = "LLMSLA_DATA_DIR"


class DataMissing(FileNotFoundError):
    """The shared data directory or one of its files is absent; the message says where we looked."""


def data_dir() -> Path:
    """``$LLMSLA_DATA_DIR``, else ``../shared/data`` relative to the project root."""
    env = os.environ.get(ENV_DATA_DIR)
    if env:
        return Path(env)
    return Path(__file__).resolve().parent.parent.parent / "shared" / "data"


def data_file(relative: str) -> Path:
    """A file under the data directory, or :class:`DataMissing` naming the path and the env var."""
    path = data_dir() / relative
    if not path.is_file():
        raise DataMissing(f"data file {path} not found; set {ENV_DATA_DIR} to the shared data directory")
    return path
