"""YAML with line numbers, so a bad SLO spec or policy file is reported as ``file:line: field``.

PyYAML's composer already knows where every node starts; this module builds plain Python values
from its node tree and keeps ``path -> line`` beside them (a path is a tuple of keys and list
indexes). Duplicate keys are an error rather than "last one wins", because a pasted block that
silently overrides an earlier one is exactly the mistake a reviewer misses.
"""

from __future__ import annotations

from collections.abc import Collection, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

Path_ = tuple[str | int, ...]


class SourceError(ValueError):
    """A problem in a YAML source, already formatted as ``file:line: field: reason``."""


def fmt_path(path: Path_) -> str:
    out = ""
    for p in path:
        out += f"[{p}]" if isinstance(p, int) else (f".{p}" if out else str(p))
    return out or "(document)"


@dataclass
class Doc:
    """One YAML document: its value and where each path starts."""

    file: str
    value: Any
    lines: dict[Path_, int] = field(default_factory=dict)

    def line(self, path: Path_) -> int:
        """The line of ``path``, or of its closest ancestor that exists."""
        while path and path not in self.lines:
            path = path[:-1]
        return self.lines.get(path, 1)

    def error(self, path: Path_, reason: str) -> SourceError:
        return SourceError(f"{self.file}:{self.line(path)}: {fmt_path(path)}: {reason}")


def _build(node: yaml.Node, path: Path_, lines: dict[Path_, int], doc_file: str) -> Any:
    lines[path] = node.start_mark.line + 1
    if isinstance(node, yaml.MappingNode):
        out: dict[str, Any] = {}
        for knode, vnode in node.value:
            key = yaml.SafeLoader.construct_scalar(yaml.SafeLoader(""), knode) if isinstance(knode, yaml.ScalarNode) else None
            if not isinstance(key, str):
                raise SourceError(f"{doc_file}:{knode.start_mark.line + 1}: {fmt_path(path)}: keys must be strings")
            if key in out:
                raise SourceError(f"{doc_file}:{knode.start_mark.line + 1}: {fmt_path((*path, key))}: duplicate key")
            out[key] = _build(vnode, (*path, key), lines, doc_file)
            lines[(*path, key)] = knode.start_mark.line + 1  # the key's line reads best
        return out
    if isinstance(node, yaml.SequenceNode):
        return [_build(v, (*path, i), lines, doc_file) for i, v in enumerate(node.value)]
    loader = yaml.SafeLoader("")
    try:
        return loader.construct_object(node, deep=True)
    except yaml.YAMLError as exc:
        raise SourceError(f"{doc_file}:{node.start_mark.line + 1}: {fmt_path(path)}: {exc}") from None


def load_docs(text: str, file: str) -> Iterator[Doc]:
    """Every non-empty document of ``text`` (``---`` separated), with line numbers."""
    try:
        nodes = list(yaml.compose_all(text, Loader=yaml.SafeLoader))
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = mark.line + 1 if mark is not None else 1
        raise SourceError(f"{file}:{line}: not valid YAML: {getattr(exc, 'problem', None) or exc}") from None
    for node in nodes:
        if node is None:
            continue
        lines: dict[Path_, int] = {}
        yield Doc(file, _build(node, (), lines, file), lines)


def load_file(path: str | Path) -> list[Doc]:
    from llmsla.argtypes import file_problem

    p = Path(path)
    if (why := file_problem(p)) is not None:  # a directory or a FIFO: a message, never a traceback or a hang
        raise SourceError(f"{p}: {why}")
    try:
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise SourceError(f"{p}: file not found") from None
    except OSError as exc:
        raise SourceError(f"{p}: cannot read: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise SourceError(f"{p}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    return list(load_docs(text, str(p)))


class Reader:
    """Typed, path-aware access to one mapping of a :class:`Doc`; every miss names file:line."""

    def __init__(self, doc: Doc, path: Path_ = (), value: Any = None) -> None:
        self.doc = doc
        self.path = path
        self.value = doc.value if value is None and not path else value
        if not isinstance(self.value, dict):
            raise doc.error(path, f"expected a mapping, got {_tname(self.value)}")

    def keys(self, allowed: set[str], required: Collection[str] = frozenset()) -> None:
        for k in self.value:
            if k not in allowed:
                raise self.doc.error((*self.path, k), f"unknown field (allowed: {', '.join(sorted(allowed))})")
        for k in sorted(required):
            if k not in self.value:
                raise self.doc.error(self.path, f"missing field {k!r}")

    def has(self, key: str) -> bool:
        return key in self.value

    def sub(self, key: str) -> Reader:
        if key not in self.value:
            raise self.doc.error(self.path, f"missing field {key!r}")
        return Reader(self.doc, (*self.path, key), self.value[key])

    def items(self, key: str) -> list[tuple[Path_, Any]]:
        v = self.value.get(key)
        if not isinstance(v, list):
            raise self.doc.error((*self.path, key), f"expected a list, got {_tname(v)}")
        return [((*self.path, key, i), x) for i, x in enumerate(v)]

    def get(self, key: str, types: type | tuple[type, ...], default: Any = ...) -> Any:
        if key not in self.value:
            if default is ...:
                raise self.doc.error(self.path, f"missing field {key!r}")
            return default
        v = self.value[key]
        ok = isinstance(v, types) and not (isinstance(v, bool) and bool not in _tuple(types))
        if not ok:
            names = " or ".join(t.__name__ for t in _tuple(types))
            raise self.doc.error((*self.path, key), f"expected {names}, got {_tname(v)} {v!r}")
        return v

    def error(self, key: str | int | None, reason: str) -> SourceError:
        return self.doc.error(self.path if key is None else (*self.path, key), reason)


def _tuple(t: type | tuple[type, ...]) -> tuple[type, ...]:
    return t if isinstance(t, tuple) else (t,)


def _tname(v: Any) -> str:
    return {dict: "a mapping", list: "a list", type(None): "nothing"}.get(type(v), type(v).__name__)
