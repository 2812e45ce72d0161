"""The wheel a user installs: built from the checkout, installed into a fresh venv, run from an
empty directory, it finds its defaults (SLO specs, Alertmanager config, k8s base) inside the
package and writes what the checkout has committed under deploy/."""

from __future__ import annotations

import json
import os
import site
import subprocess
import sys
import venv
import zipfile
from pathlib import Path

import pytest

from llmsla.data import data_dir

ROOT = Path(__file__).resolve().parent.parent
DEPLOY = ROOT / "deploy"


def _dependency_dirs() -> list[str]:
    """The runner's site-packages, for the dependencies only: a .pth line adds a directory to
    sys.path without running the .pth files in it, so the checkout's editable llmsla stays out."""
    dirs = [p for p in sys.path if p.endswith("site-packages") and Path(p).is_dir()]
    return list(dict.fromkeys(dirs + [p for p in site.getsitepackages() if Path(p).is_dir()]))


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, str], Path]:
    tmp = tmp_path_factory.mktemp("wheel")
    build = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                            "-w", str(tmp / "dist"), str(ROOT)], capture_output=True, text=True, timeout=600,
                           cwd=tmp)
    assert build.returncode == 0, build.stderr
    assert "warn" not in (build.stdout + build.stderr).lower(), build.stdout + build.stderr
    (wheel,) = (tmp / "dist").glob("llmsla-*.whl")
    env_dir = tmp / "venv"
    venv.EnvBuilder(with_pip=False).create(env_dir)
    py = env_dir / "bin" / "python"
    purelib = subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             capture_output=True, text=True, check=True).stdout.strip()
    Path(purelib, "zz-deps.pth").write_text("\n".join(_dependency_dirs()) + "\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LLMSLA_", "VIRTUAL_ENV", "PYTHONPATH"))}
    # --ignore-installed: the runner's llmsla metadata is on the dependency path; never touch it
    inst = subprocess.run([str(py), "-m", "pip", "install", "-q", "--no-deps", "--ignore-installed", str(wheel)],
                          capture_output=True, text=True, timeout=600, env=env, cwd=tmp)
    assert inst.returncode == 0, inst.stderr
    empty = tmp / "empty"
    empty.mkdir()
    where = subprocess.run([str(py), "-c", "import llmsla; print(llmsla.__file__)"], capture_output=True,
                           text=True, check=True, env=env, cwd=empty).stdout.strip()
    assert where.startswith(purelib), where  # llmsla itself comes only from the wheel
    return env_dir / "bin" / "llmsla", env, wheel


def _run(installed: tuple[Path, dict[str, str], Path], cwd: Path, *argv: str) -> subprocess.CompletedProcess[str]:
    llmsla, env, _ = installed
    out = subprocess.run([str(llmsla), *argv], capture_output=True, text=True, timeout=300, env=env, cwd=cwd)
    assert out.returncode == 0, (argv, out.stdout, out.stderr)
    return out


def _same_tree(got: Path, committed: Path, names: list[str]) -> None:
    assert names, got
    for rel in names:
        assert (got / rel).read_text() == (committed / rel).read_text(), rel


def test_wheel_ships_license_and_defaults(installed: tuple[Path, dict[str, str], Path]) -> None:
    names = zipfile.ZipFile(installed[2]).namelist()
    assert any(n.endswith(".dist-info/licenses/LICENSE") for n in names)
    for rel in ("slo/e2e.yaml", "alertmanager/alertmanager.yml", "k8s/base/kustomization.yaml"):
        assert f"llmsla/deploy/{rel}" in names, rel


def test_checks_pass_from_an_empty_directory(installed: tuple[Path, dict[str, str], Path], tmp_path: Path) -> None:
    assert "generated files are current" in _run(installed, tmp_path, "slo", "generate", "--check").stdout
    assert "generated files are current" in _run(installed, tmp_path, "deploy", "render", "--check").stdout
    assert "generated files are current" in _run(installed, tmp_path, "dashboards", "build", "--check").stdout
    assert list(tmp_path.iterdir()) == []  # --check writes nothing


def test_generated_files_equal_the_checkout(installed: tuple[Path, dict[str, str], Path], tmp_path: Path) -> None:
    _run(installed, tmp_path, "slo", "generate", "--rules-out", "p/rules", "--tests-out", "p/tests")
    _same_tree(tmp_path / "p", DEPLOY / "prometheus",
               [str(p.relative_to(tmp_path / "p")) for p in (tmp_path / "p").rglob("*") if p.is_file()])
    _run(installed, tmp_path, "deploy", "render", "--out", "k8s")
    _same_tree(tmp_path / "k8s", DEPLOY / "k8s",
               [str(p.relative_to(tmp_path / "k8s")) for p in (tmp_path / "k8s").rglob("*") if p.is_file()])
    _run(installed, tmp_path, "dashboards", "build", "--out", "grafana")
    _same_tree(tmp_path / "grafana", DEPLOY / "grafana",
               [str(p.relative_to(tmp_path / "grafana")) for p in (tmp_path / "grafana").rglob("*") if p.is_file()])


def test_demo_from_the_wheel(installed: tuple[Path, dict[str, str], Path], pg_dsn: str, tmp_path: Path) -> None:
    """``llmsla demo`` from the installed wheel, run from an empty directory with the user's data
    directory named by ``LLMSLA_DATA_DIR`` (public traces are not shipped in the wheel), passes
    the checks of the checkout's demo run and leaves nothing running."""
    from test_demo import _db, _left_behind, assert_closed_loop

    llmsla, env, _ = installed
    empty = tmp_path / "empty"
    empty.mkdir()
    facts = tmp_path / "facts.json"
    out = subprocess.run([str(llmsla), "--dsn", pg_dsn, "demo", "--workdir", str(tmp_path / "work"), "--minutes", "2",
                          "--json", str(facts)], capture_output=True, text=True, timeout=400, cwd=empty,
                         env={**env, "LLMSLA_DATA_DIR": str(data_dir())})
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-3000:]
    assert "demo finished" in out.stdout and "Traceback" not in out.stdout + out.stderr
    assert not _left_behind(_db(pg_dsn)), _left_behind(_db(pg_dsn))
    assert_closed_loop(pg_dsn, json.loads(facts.read_text()))
    assert list(empty.iterdir()) == []  # everything went to --workdir and the store
