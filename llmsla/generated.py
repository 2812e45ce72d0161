"""One mechanism for every generated file: render -> compare -> write.

Generated files (JSON Schemas, Prometheus rules and rule tests, dashboards, k8s manifests, OpenAPI
documents, the config reference, the frozen migration SQL) are committed as golden files. Each
command renders them in memory; ``--check`` compares with what is on disk, prints the stale paths
and the command that regenerates them, and exits 1; a normal run writes only what changed. One
copy of that logic means every command answers ``--check`` the same way (docs/architecture.md,
"Generated files"); ``tests/test_generated.py`` runs every registered :class:`Generator`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from llmsla.config import Config

#: Exit status of a ``--check`` that found stale files (every generator command).
EXIT_STALE = 1

MISSING = "missing"
DIFFERS = "differs"
ORPHAN = "orphan"


def _owns_nothing(root: Path) -> list[Path]:
    return []


@dataclass(frozen=True)
class Generator:
    """A family of generated files: where they live, how to render them, how to check them.

    ``render(cfg, root)`` returns every file's path (under ``root``) and text, writing nothing;
    ``owned(root)`` lists the files on disk the generator considers its own, so one it no longer
    renders (a removed spec) is reported and deleted; ``check_argv(root)`` is the command line
    (after ``python``) of its ``--check`` against ``root``, run by the golden-file tests.
    """

    name: str
    #: The command that regenerates the files, as the ``--check`` hint prints it.
    command: str
    #: Default output, relative to the repository root (a folder, or the file itself).
    root: Path
    render: Callable[[Config, Path], dict[Path, str]]
    check_argv: Callable[[Path], list[str]]
    owned: Callable[[Path], Iterable[Path]] = field(default=_owns_nothing)


@dataclass(frozen=True, order=True)
class Problem:
    """One stale file: ``missing``, ``differs`` from the render, or an ``orphan`` no longer rendered."""

    path: Path
    kind: str

    def __str__(self) -> str:
        what = {MISSING: "missing", DIFFERS: "differs from what the generator renders",
                ORPHAN: "generated file no longer rendered (delete it)"}[self.kind]
        return f"{self.path}: {what}"


def stale(files: Mapping[Path, str], owned: Iterable[Path] = ()) -> list[Problem]:
    """Files that are missing or differ from ``files``, then owned files not among them."""
    out = []
    for path, text in sorted(files.items()):
        if not path.is_file():
            out.append(Problem(path, MISSING))
        elif path.read_text(encoding="utf-8") != text:
            out.append(Problem(path, DIFFERS))
    out += [Problem(p, ORPHAN) for p in sorted(set(owned) - set(files))]
    return out


def write(files: Mapping[Path, str], problems: Iterable[Problem]) -> list[Path]:
    """Fix ``problems`` (from :func:`stale`): write the missing and differing files, delete the
    orphans. Files already current are not touched (their mtimes stay)."""
    written = []
    for p in problems:
        if p.kind == ORPHAN:
            p.path.unlink(missing_ok=True)
            continue
        p.path.parent.mkdir(parents=True, exist_ok=True)
        p.path.write_text(files[p.path], encoding="utf-8")
        written.append(p.path)
    return written


def _files(n: int) -> str:
    return f"{n} generated file{'' if n == 1 else 's'}"


def run(files: Mapping[Path, str], *, check: bool, command: str, owned: Iterable[Path] = (),
        summary: str = "") -> int:
    """The CLI of every generator: with ``check``, print each stale file (one a line) and a hint
    naming ``command``, and return :data:`EXIT_STALE` (0 when current); otherwise write what
    changed and print each path written. ``summary`` ends the success line."""
    problems = stale(files, owned)
    tail = f" ({summary})" if summary else ""
    if check:
        for p in problems:
            print(p)
        if problems:
            print(f"run `{command}` and commit the result")
            return EXIT_STALE
        print(f"{_files(len(files))} {'is' if len(files) == 1 else 'are'} current{tail}")
        return 0
    for p in problems:
        if p.kind == ORPHAN:
            print(f"deleted {p.path}")
    written = write(files, problems)
    for path in written:
        print(f"wrote {path}")
    print(f"{_files(len(files))}, {len(written)} written{tail}")
    return 0


def module_main(gen: Generator, argv: list[str] | None = None) -> int:
    """``python -m <module> [OUT] [--check]`` for a generator that has no ``llmsla`` subcommand
    (the OpenAPI documents): the same render, check and write as every other one, from the
    default configuration (the files must not depend on the caller's environment)."""
    import argparse

    from llmsla.config import load

    ap = argparse.ArgumentParser(prog=gen.command.removesuffix(" [OUT]"),
                                 description=f"write {gen.root} (or check it)")
    ap.add_argument("out", nargs="?", type=Path, default=gen.root, help=f"output (default {gen.root})")
    ap.add_argument("--check", action="store_true", help="write nothing; exit 1 if the output is stale")
    args = ap.parse_args(argv)
    return run(gen.render(load(env={}), args.out), check=args.check, command=gen.command)
