"""The layering of docs/architecture.md, enforced: an AST walk over every module (imports inside
functions too) fails naming file:line and the rule for any import the layers forbid."""

from __future__ import annotations

import ast
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

#: component -> the components it may import (besides itself). Core is "llmsla": every module of
#: the llmsla/ folder except the composition root (llmsla.app and llmsla.__main__), which may import
#: everything.
ALLOWED: dict[str, frozenset[str]] = {
    "core": frozenset(),
    "exporters": frozenset({"core", "control"}),  # the gateway asks control for a replica and an arm
    "worker": frozenset({"core", "exporters"}),  # instrumented by the exporters (policy spans, /metrics)
    "control": frozenset({"core"}),
    "streaming": frozenset({"core"}),
    "forecaster": frozenset({"core"}),
    "fleet": frozenset({"core", "control", "exporters"}),  # the real router and recorders
    "alerting": frozenset({"core"}),  # reaches control over its HTTP API only
    "dashboards": frozenset({"core"}),
    "engines": frozenset({"core"}),  # reads replicas' /metrics over HTTP; like the GPU collector
    "app": frozenset({"core", "exporters", "worker", "control", "streaming", "forecaster", "fleet",
                      "alerting", "dashboards", "engines"}),
}
WHY: dict[str, str] = {
    "core": "core imports no component",
    "exporters": "exporters may import core and control only",
    "worker": "the worker may import core and exporters only",
    "control": "control never imports exporters, worker or any other component",
    "streaming": "streaming may import core only",
    "forecaster": "the forecaster may import core only (it reaches alerting over webhook v4)",
    "fleet": "fleet may import core, control and the exporters' recorders only",
    "alerting": "alerting reaches control over the control API only, never in-process",
    "dashboards": "dashboards import core only",
    "engines": "the engine adapters import core only",
    "app": "",
}
FORBIDDEN_ROOTS = ("bench", "tests")  # nothing imports benchmarks or tests


def package_dirs(root: Path = ROOT) -> dict[str, Path]:
    """``llmsla.<x>`` -> folder, from pyproject's package-dir mapping."""
    cfg = tomllib.loads((root / "pyproject.toml").read_text())
    return {pkg: root / folder for pkg, folder in cfg["tool"]["setuptools"]["package-dir"].items()}


def component(module: str) -> str | None:
    """The component a dotted module belongs to, or None for a third-party module."""
    parts = module.split(".")
    if parts[0] in FORBIDDEN_ROOTS:
        return parts[0]
    if parts[0] != "llmsla":
        return None
    if len(parts) == 1:
        return "core"
    if parts[1] in ("app", "__main__"):  # `python -m llmsla` is the command line too
        return "app"
    return parts[1] if parts[1] in ALLOWED else "core"


def modules(dirs: dict[str, Path]) -> dict[str, Path]:
    """Every module name -> file, for the mapped packages (a package's own sub-folders that are
    mapped separately belong to their own component)."""
    out: dict[str, Path] = {}
    mapped = {p.resolve() for p in dirs.values()}
    for pkg, folder in dirs.items():
        for path in folder.rglob("*.py"):
            rel = path.relative_to(folder)
            if any(part in (".venv", "build") for part in rel.parts):
                continue
            if any((folder / Path(*rel.parts[:i])).resolve() in mapped for i in range(1, len(rel.parts))):
                continue  # inside a separately mapped sub-package
            name = ".".join([pkg, *rel.with_suffix("").parts])
            out[name.removesuffix(".__init__")] = path
    return out


def imports(path: Path, module: str) -> list[tuple[int, str]]:
    """(line, imported module) for every import in ``path``, relative ones resolved."""
    tree = ast.parse(path.read_text(), filename=str(path))
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                target = ".".join([*base, node.module] if node.module else base)
            else:
                target = node.module or ""
            found.append((node.lineno, target))
            for alias in node.names:  # `from llmsla import control` imports a component too
                found.append((node.lineno, f"{target}.{alias.name}"))
    return found


def violations(root: Path = ROOT) -> list[str]:
    dirs = package_dirs(root)
    found = []
    for module, path in sorted(modules(dirs).items()):
        own = component(module)
        assert own in ALLOWED, module
        for line, target in imports(path, module):
            other = component(target)
            if other is None or other == own:
                continue
            if other in FORBIDDEN_ROOTS:
                found.append(f"{path.relative_to(root)}:{line}: {module} imports {target}: nothing imports {other}/")
            elif other not in ALLOWED[own]:
                found.append(f"{path.relative_to(root)}:{line}: {module} imports {target}: {WHY[own]}")
    return found


def test_the_tree_follows_the_layers() -> None:
    problems = violations()
    assert not problems, "forbidden imports:\n" + "\n".join(problems)


def test_every_module_is_seen() -> None:
    mods = modules(package_dirs())
    for expected in ("llmsla.events", "llmsla.app.cli", "llmsla.exporters.gateway", "llmsla.worker.server",
                     "llmsla.control.router", "llmsla.streaming.job", "llmsla.fleet.engine", "llmsla.store.migrate"):
        assert expected in mods, expected
    assert component("llmsla.store.migrate") == "core" and component("llmsla.app.demo") == "app"


def test_a_forbidden_import_fails_with_file_line_and_rule(tmp_path: Path) -> None:
    (tmp_path / "pyproject.toml").write_text(
        '[tool.setuptools.package-dir]\n"llmsla" = "llmsla"\n"llmsla.control" = "control"\n'
        '"llmsla.exporters" = "exporters"\n')
    for folder in ("llmsla", "control", "exporters"):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "__init__.py").write_text("")
    (tmp_path / "exporters" / "gateway.py").write_text("from llmsla.control import router\n")
    (tmp_path / "control" / "distill.py").write_text(
        '"""doc"""\n\n\ndef f():\n    from llmsla.exporters.gateway import Gateway  # deferred, still a cycle\n')
    (tmp_path / "control" / "rel.py").write_text("from ..exporters import gateway\n")
    (tmp_path / "llmsla" / "events.py").write_text("import tests.helpers\n")
    got = violations(tmp_path)
    assert got == [
        "control/distill.py:5: llmsla.control.distill imports llmsla.exporters.gateway: "
        "control never imports exporters, worker or any other component",
        "control/distill.py:5: llmsla.control.distill imports llmsla.exporters.gateway.Gateway: "
        "control never imports exporters, worker or any other component",
        "control/rel.py:1: llmsla.control.rel imports llmsla.exporters: "
        "control never imports exporters, worker or any other component",
        "control/rel.py:1: llmsla.control.rel imports llmsla.exporters.gateway: "
        "control never imports exporters, worker or any other component",
        "llmsla/events.py:1: llmsla.events imports tests.helpers: nothing imports tests/",
    ]


if __name__ == "__main__":  # `python tests/test_architecture.py`: the list, for a quick look
    print("\n".join(violations()) or "no violations")
    sys.exit(0)
