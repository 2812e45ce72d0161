"""Golden files: every registered generator's committed files equal its render, and its
``--check`` exits 1 naming a tampered file (and the command that regenerates it)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from llmsla import config as config_mod
from llmsla import generated
from llmsla.app.generators import all_generators

ROOT = Path(__file__).resolve().parents[1]
GENERATORS = all_generators()


def test_every_generator_is_registered_once() -> None:
    names = [g.name for g in GENERATORS]
    assert len(names) == len(set(names))
    assert {"schemas", "config-doc", "slo-rules", "dashboards", "k8s", "openapi-receiver",
            "openapi-control", "migrations"} <= set(names)


@pytest.mark.parametrize("gen", GENERATORS, ids=lambda g: g.name)
def test_committed_files_equal_the_render(gen: generated.Generator, monkeypatch: pytest.MonkeyPatch) -> None:
    """A forgotten regeneration fails here, naming the files and the command."""
    monkeypatch.chdir(ROOT)  # the specs and inputs the commands read are repository-relative
    root = ROOT / gen.root
    files = gen.render(config_mod.load(env={}), root)
    assert files, f"{gen.name} renders nothing"
    problems = generated.stale(files, gen.owned(root))
    assert not problems, f"run `{gen.command}`: " + "; ".join(map(str, problems))


@pytest.mark.parametrize("gen", GENERATORS, ids=lambda g: g.name)
def test_check_exits_1_naming_a_tampered_file(gen: generated.Generator, tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """The command's own ``--check``: 0 on a fresh render, 1 and the path once a file changed."""
    monkeypatch.chdir(ROOT)
    root = tmp_path / gen.root
    files = gen.render(config_mod.load(env={}), root)
    assert generated.write(files, generated.stale(files)) == sorted(files)

    def check() -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, *gen.check_argv(root)], cwd=ROOT, capture_output=True,
                              text=True, timeout=120)

    done = check()
    assert done.returncode == 0, done.stdout + done.stderr
    tampered = sorted(files)[-1]
    tampered.write_text(tampered.read_text() + "\n")
    done = check()
    assert done.returncode == generated.EXIT_STALE == 1, done.stdout + done.stderr
    assert done.stdout.splitlines() == [f"{tampered}: differs from what the generator renders",
                                        f"run `{gen.command}` and commit the result"]


def test_stale_and_write_fix_only_what_differs(tmp_path: Path) -> None:
    same, changed, new, orphan = (tmp_path / n for n in ("same.txt", "changed.txt", "d/new.txt", "orphan.txt"))
    same.write_text("a")
    changed.write_text("old")
    orphan.write_text("x")
    files = {same: "a", changed: "new", new: "n"}
    problems = generated.stale(files, [same, orphan])
    assert [str(p) for p in problems] == [f"{changed}: differs from what the generator renders",
                                          f"{new}: missing",
                                          f"{orphan}: generated file no longer rendered (delete it)"]
    mtime = same.stat().st_mtime_ns
    assert generated.write(files, problems) == [changed, new]
    assert (changed.read_text(), new.read_text(), orphan.exists(), same.stat().st_mtime_ns) == ("new", "n", False, mtime)
    assert generated.stale(files, [same]) == []
