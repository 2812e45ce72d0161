"""The model registry: the forecaster's trained models in the store, one of them the champion.

Each row holds a model's provenance (who trained it, on which history and data set), its
metrics (validation, held-out, and the gate's comparison), its status - ``candidate``,
``champion``, ``retired``, ``refused`` with a reason - and the artifact itself, a tar of the
artifact directory whose sha256 is checked on every load, so every ``forecast serve`` reading
the store serves the same champion without a shared file system. Loading refuses, with one line
naming the row, an artifact whose bytes do not match, a tar that does not unpack into an
artifact, and a model whose features are not the ones the scorer builds.
See docs/forecaster.md#model-registry.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import io
import json
import math
import tarfile
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
from psycopg.types.json import Jsonb

from llmsla import names
from llmsla.forecaster import artifact
from llmsla.forecaster import features as features_mod

CANDIDATE, CHAMPION, RETIRED, REFUSED = "candidate", "champion", "retired", "refused"
STATUSES = (CANDIDATE, CHAMPION, RETIRED, REFUSED)
#: the files of an artifact directory, the only members a registry tar may hold
MEMBERS = (artifact.META, artifact.WEIGHTS)
T = names.T_FORECAST_MODELS
VERSION_CHARS = 12  # artifact.save: the first 12 hex digits of a sha256
_COLUMNS = ("id, version, created_at, trained_by, train_from, train_to, data_sha256, metrics, status, reason, "
            "status_at, artifact_sha256, octet_length(artifact)")


class RegistryError(ValueError):
    """A registry row that cannot be served or changed (one line naming the row and what)."""


@dataclass
class ModelRow:
    id: int
    version: str
    created_at: dt.datetime
    trained_by: str
    train_from: dt.datetime | None
    train_to: dt.datetime | None
    data_sha256: str
    metrics: dict[str, Any]
    status: str
    reason: str
    status_at: dt.datetime
    artifact_sha256: str
    size: int
    label: str = field(init=False)

    def __post_init__(self) -> None:
        self.label = f"model {self.id} (v{self.version})"


def pack(art_dir: Path) -> bytes:
    """The artifact directory as an uncompressed tar (the weights do not compress), byte for
    byte the same for the same files: fixed order, times and owners."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name in MEMBERS:
            data = (Path(art_dir) / name).read_bytes()
            info = tarfile.TarInfo(name)
            info.size, info.mtime, info.mode = len(data), 0, 0o644
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def unpack(data: bytes, dest: Path, *, what: str) -> Path:
    """Write the tar's two artifact files into ``dest``; anything else in it is refused (a
    member path is never followed outside ``dest``)."""
    try:
        with tarfile.open(fileobj=io.BytesIO(data), mode="r:") as tar:
            members = tar.getmembers()
            got = sorted(m.name for m in members)
            if got != sorted(MEMBERS) or not all(m.isfile() for m in members):
                raise RegistryError(f"{what}: artifact tar holds {got}, expected the files {list(MEMBERS)}")
            for m in members:
                f = tar.extractfile(m)
                if f is None:  # isfile() above: never
                    raise RegistryError(f"{what}: artifact tar member {m.name} unreadable")
                (dest / m.name).write_bytes(f.read())
    except (tarfile.TarError, EOFError, OSError) as exc:
        raise RegistryError(f"{what}: artifact is not a readable tar ({exc}): truncated or corrupt") from None
    return dest


def check_features(art: artifact.Artifact, what: str) -> None:
    """The model's features must be ones the online scorer can build (it builds each model's own
    list, in the model's order) and its masks the scorer's."""
    if art.meta.get("mode") != "fleet" or art.scaler is None:
        raise RegistryError(f"{what}: not a fleet-mode model with its scaler")
    got = (list(art.meta.get("features") or []), list(art.meta.get("masks") or []))
    bad = features_mod.unknown_features(got[0])
    if not got[0] or bad or got[1] != list(features_mod.MASKS):
        raise RegistryError(f"{what}: reads features {got[0]} + masks {got[1]}; this scorer builds "
                            f"features from {list(features_mod.KNOWN)} + masks {list(features_mod.MASKS)}"
                            + (f" (unknown: {bad})" if bad else ""))


def _jsonable(v: Any) -> Any:
    """JSON the store takes: NaN and infinities (a mean lead of no warned breach) become null."""
    if isinstance(v, dict):
        return {str(k): _jsonable(x) for k, x in v.items()}
    if isinstance(v, list | tuple):
        return [_jsonable(x) for x in v]
    if isinstance(v, float) and not math.isfinite(v):
        return None
    if isinstance(v, str | int | float | bool) or v is None:
        return v
    return _jsonable(json.loads(json.dumps(v, default=str)))


def _row(r: tuple) -> ModelRow:
    return ModelRow(*r)


def put(conn: psycopg.Connection, art_dir: Path, *, trained_by: str, train_from: dt.datetime | None = None,
        train_to: dt.datetime | None = None, metrics: dict[str, Any] | None = None) -> ModelRow:
    """Store the artifact in ``art_dir`` as a candidate; a version already stored is returned
    as it is (the same weights and settings: training is deterministic for a seed)."""
    art = artifact.load(art_dir)  # never store what cannot be loaded back
    blob = pack(art_dir)
    digest = hashlib.sha256(blob).hexdigest()
    meta_metrics = art.meta.get("metrics") or {}
    all_metrics = {"val": meta_metrics.get("val"), "test": meta_metrics.get("test"), **(metrics or {})}
    with conn.transaction():
        row = conn.execute(
            f"INSERT INTO {T} (version, trained_by, train_from, train_to, data_sha256, metrics, artifact, "
            f"artifact_sha256) VALUES (%s, %s, %s, %s, %s, %s, %s, %s) ON CONFLICT (version) DO NOTHING "
            f"RETURNING {_COLUMNS}",
            (art.version, trained_by, train_from, train_to, str(art.meta.get("data_sha256", "")),
             Jsonb(_jsonable(all_metrics)), blob, digest)).fetchone()
    if row is None:
        return get(conn, art.version)
    return _row(row)


def list_models(conn: psycopg.Connection, *, limit: int = 0) -> list[ModelRow]:
    """Newest first."""
    sql = f"SELECT {_COLUMNS} FROM {T} ORDER BY id DESC" + (f" LIMIT {int(limit)}" if limit else "")
    return [_row(r) for r in conn.execute(sql).fetchall()]


def get(conn: psycopg.Connection, ref: int | str) -> ModelRow:
    """By id (a number) or version; a missing one is a :class:`RegistryError`."""
    key = str(ref).removeprefix("v")
    # a version is 12 hex digits, which may all be decimal ones: shorter numbers are ids
    col = "id" if key.isdigit() and len(key) < VERSION_CHARS else "version"
    row = conn.execute(f"SELECT {_COLUMNS} FROM {T} WHERE {col} = %s",
                       (int(key) if col == "id" else key,)).fetchone()
    if row is None:
        raise RegistryError(f"no model {ref!r} in the registry (`llmsla forecast models` lists them)")
    return _row(row)


def champion(conn: psycopg.Connection) -> ModelRow | None:
    row = conn.execute(f"SELECT {_COLUMNS} FROM {T} WHERE status = %s", (CHAMPION,)).fetchone()
    return _row(row) if row else None


def load(conn: psycopg.Connection, row: ModelRow) -> artifact.Artifact:
    """The row's artifact, checked: sha256 of the bytes, the tar, the artifact's own checks and
    the scorer's features. Every failure is a :class:`RegistryError` naming the row."""
    got = conn.execute(f"SELECT artifact FROM {T} WHERE id = %s", (row.id,)).fetchone()
    if got is None:
        raise RegistryError(f"{row.label}: gone from the registry")
    data = bytes(got[0])
    digest = hashlib.sha256(data).hexdigest()
    if digest != row.artifact_sha256:
        raise RegistryError(f"{row.label}: artifact sha256 {digest[:12]} differs from the recorded "
                            f"{row.artifact_sha256[:12]} (corrupt or replaced)")
    with tempfile.TemporaryDirectory(prefix="llmsla-model-") as tmp:
        try:
            art = artifact.load(unpack(data, Path(tmp), what=row.label))
        except artifact.ArtifactError as exc:
            raise RegistryError(f"{row.label}: {str(exc).replace(tmp + '/', '')}") from None
    if art.version != row.version:
        raise RegistryError(f"{row.label}: the artifact inside is version {art.version}")
    check_features(art, row.label)
    return art


def set_status(conn: psycopg.Connection, row: ModelRow, status: str, reason: str) -> None:
    """A candidate's verdict (``refused``, or kept a ``candidate``) with its reason."""
    if status not in STATUSES or status == CHAMPION:
        raise ValueError(f"set_status: {status!r} (promote() makes a champion)")
    conn.execute(f"UPDATE {T} SET status = %s, reason = %s, status_at = now() WHERE id = %s", (status, reason, row.id))


def record_metrics(conn: psycopg.Connection, row: ModelRow, key: str, value: dict[str, Any]) -> None:
    """Add ``metrics[key]`` (the gate's comparison) to the row."""
    conn.execute(f"UPDATE {T} SET metrics = metrics || %s WHERE id = %s",
                 (Jsonb({key: _jsonable(value)}), row.id))


def promote(conn: psycopg.Connection, row: ModelRow, reason: str) -> ModelRow | None:
    """Make ``row`` the champion and retire the one before it, in one transaction (the unique
    index keeps two writers from making two champions); returns the retired row, if any."""
    with conn.transaction():
        old = conn.execute(f"SELECT {_COLUMNS} FROM {T} WHERE status = %s FOR UPDATE", (CHAMPION,)).fetchone()
        if old is not None and old[0] != row.id:
            conn.execute(f"UPDATE {T} SET status = %s, reason = %s, status_at = now() WHERE id = %s",
                         (RETIRED, f"replaced by v{row.version}", old[0]))
        conn.execute(f"UPDATE {T} SET status = %s, reason = %s, status_at = now() WHERE id = %s",
                     (CHAMPION, reason, row.id))
    return _row(old) if old is not None and old[0] != row.id else None
