"""The demo's processes: every component as its own ``llmsla`` command, as an operator runs them.

Each child gets its own session (so Ctrl-C reaches the demo, which then stops them in order, and
a stop reaches the JVM and Python workers a child started), a log file under ``<workdir>/logs``
and the demo's config file; secrets travel in the environment, never on a command line. The
time scale of the rules, the receiver's policy and Alertmanager's batching is one factor,
``Scale``, so an hour of burn-rate window is a minute of demo.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import signal
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from llmsla import data, services
from llmsla.errors import UserError
from llmsla.resources import deploy


class DemoError(UserError):
    """A component did not start or died; the message names its log."""


@dataclass(frozen=True)
class Scale:
    """One time factor for everything with a window: 1/60 makes an hour of burn-rate window a
    minute, the receiver's 600 s hold-down 10 s; scrapes every ``scrape_s``."""

    factor: float = 1 / 60
    scrape_s: float = 1.0

    def seconds(self, s: float) -> float:
        return max(self.scrape_s, s * self.factor)


@dataclass
class Proc:
    name: str
    popen: subprocess.Popen
    log: Path

    def alive(self) -> bool:
        return self.popen.poll() is None

    def tail(self, lines: int = 15) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def stop(self, timeout_s: float = 15.0) -> None:
        """SIGTERM to the whole group (a stream job's JVM and Python workers too), then SIGKILL."""
        if self.popen.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.popen.pid, signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.popen.wait(timeout=timeout_s)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.popen.pid, signal.SIGKILL)  # grandchildren that outlived their parent
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.popen.wait(timeout=5)


@dataclass
class Stack:
    """Started components in start order; ``close`` stops them in reverse."""

    workdir: Path
    config_file: Path
    dsn: str
    scale: Scale
    env: dict[str, str] = field(default_factory=dict)
    procs: list[Proc] = field(default_factory=list)
    services: list[services.Service] = field(default_factory=list)
    ports: dict[str, int] = field(default_factory=dict)
    urls: dict[str, str] = field(default_factory=dict)
    _rule_files: dict[str, str] = field(default_factory=dict)

    @classmethod
    def prepare(cls, workdir: Path, dsn: str, scale: Scale, config_text: str) -> Stack:
        (workdir / "logs").mkdir(parents=True, exist_ok=True)
        config_file = workdir / "llmsla.toml"
        config_file.write_text(config_text)
        tokens = {"LLMSLA_CONTROL_TOKEN": secrets.token_urlsafe(24), "LLMSLA_RECEIVER_TOKEN": secrets.token_urlsafe(24)}
        env = {k: v for k, v in os.environ.items() if not k.startswith("LLMSLA_")}
        env.update(tokens, LLMSLA_FORECAST_RECEIVER_TOKEN=tokens["LLMSLA_RECEIVER_TOKEN"],
                   PYTHONWARNINGS="ignore", LLMSLA_DSN=dsn,
                   # where the trace lives is not config: a wheel user's LLMSLA_DATA_DIR reaches the components
                   **{data.ENV_DATA_DIR: str(data.data_dir())})
        return cls(workdir=workdir, config_file=config_file, dsn=dsn, scale=scale, env=env)

    def port(self, name: str) -> int:
        if name not in self.ports:
            self.ports[name] = services.free_port()
        return self.ports[name]

    def llmsla(self, name: str, *args: str, ready_url: str | None = None, timeout_s: float = 60.0) -> Proc:
        """Start ``llmsla --config <demo config> <args>``; wait for ``ready_url`` to answer."""
        log = self.workdir / "logs" / f"{name}.log"
        fh = open(log, "ab")  # noqa: SIM115 - the child's; closed here once it has it
        popen = subprocess.Popen([sys.executable, "-m", "llmsla", "--config", str(self.config_file), *args],
                                 stdin=subprocess.DEVNULL, stdout=fh, stderr=subprocess.STDOUT, env=self.env,
                                 cwd=self.workdir, start_new_session=True,
                                 preexec_fn=services.die_with_parent())
        fh.close()
        proc = Proc(name, popen, log)
        self.procs.append(proc)
        if ready_url:
            deadline = time.monotonic() + timeout_s
            while not _answers(ready_url):
                if not proc.alive() or time.monotonic() > deadline:
                    raise DemoError(f"{name} did not start (see {log}):\n{proc.tail()}")
                time.sleep(0.2)
        return proc

    def check_alive(self) -> None:
        for p in self.procs:
            if not p.alive() and p.popen.returncode not in (0, None) and p.name not in ("simulate", "replay"):
                raise DemoError(f"{p.name} exited with {p.popen.returncode} (see {p.log}):\n{p.tail()}")

    # -- components --------------------------------------------------------------------------------
    def start_alerting(self, receiver_port: int, control_port: int,
                       fleet_jobs: dict[str, list[str]] | None = None) -> None:
        """Rules generated at this scale, Prometheus, Alertmanager and the receiver (with the
        built-in policy at this scale) acting on the control API at ``control_port``.
        ``fleet_jobs``: the scrape jobs of whatever serves the requests (default: the
        simulator's ``/metrics`` as job ``fleet``)."""
        from llmsla import config as config_mod
        from llmsla.alerting import amconfig
        from llmsla.alerting import generate as G

        cfg = config_mod.load(path=self.config_file, env={})
        rules_dir = self.workdir / "prometheus"
        out = G.generate(cfg, specs_dir=deploy("slo"), rules_dir=Path("rules"), tests_dir=None,
                         window_scale=self.scale.factor, scrape_interval_s=self.scale.scrape_s)
        files = {path.name: text for path, text in out.files.items()}
        self._rule_files = files
        policy = self.workdir / "receiver-policy.yaml"
        policy.write_text(scaled_policy(self.scale))
        self.llmsla("receiver", "receiver", "--port", str(receiver_port), "--action-policy", str(policy),
                    "--control-url", f"http://127.0.0.1:{control_port}",
                    ready_url=f"http://127.0.0.1:{receiver_port}/healthz")
        self.urls["receiver"] = f"http://127.0.0.1:{receiver_port}"
        token_file = self.workdir / "receiver-token"
        token_file.touch(mode=0o600)
        token_file.write_text(self.env["LLMSLA_RECEIVER_TOKEN"])
        am = services.start_alertmanager(self.workdir / "alertmanager", config_yaml=amconfig.pointed_at(
            deploy("alertmanager/alertmanager.yml").read_text(), self.urls["receiver"], token_file,
            group_wait_s=self.scale.seconds(10)))
        self.services.append(am)
        self.urls["alertmanager"] = am.url
        # the simulator's control API serves the same registry as its /metrics (router,
        # distillation, requests): scraped once, as "fleet"; so does the gateway's (--real)
        jobs = {**(fleet_jobs or {"fleet": [f"127.0.0.1:{self.port('fleet-metrics')}"]}),
                "stream": [f"127.0.0.1:{self.port('stream-metrics')}"],
                "forecaster": [f"127.0.0.1:{self.port('forecast')}"],
                "receiver": [f"127.0.0.1:{receiver_port}"]}
        prom = services.start_prometheus(
            rules_dir, extra_files={name: _recording_only(text) for name, text in files.items()},
            config_yaml=services.scrape_config(jobs, interval_s=self.scale.scrape_s, rule_files=sorted(files),
                                               alertmanagers=[f"127.0.0.1:{am.port}"]))
        self.services.append(prom)
        self.urls["prometheus"] = prom.url

    def arm_alerts(self) -> None:
        """Load the alerting rules (Prometheus started with the recording rules only). A window
        scaled to seconds holds a handful of requests right after the live part begins, and one
        slow request out of three would page; in production the windows are full."""
        rules_dir = self.workdir / "prometheus"
        for name, text in self._rule_files.items():
            (rules_dir / name).write_text(text)
        req = urllib.request.Request(self.urls["prometheus"] + "/-/reload", method="POST")
        with urllib.request.urlopen(req, timeout=10) as r:
            if r.status != 200:
                raise DemoError(f"Prometheus did not reload its rules: HTTP {r.status}")

    def close(self) -> None:
        """Stop everything, newest first; never raises (it runs on Ctrl-C)."""
        for p in reversed(self.procs):
            with contextlib.suppress(Exception):
                p.stop()
        for s in reversed(self.services):
            with contextlib.suppress(Exception):
                s.stop()
        self.procs.clear()
        self.services.clear()


def _recording_only(rule_file: str) -> str:
    doc = yaml.safe_load(rule_file)
    for group in doc.get("groups", []):
        group["rules"] = [r for r in group["rules"] if "alert" not in r]
    return yaml.safe_dump(doc, sort_keys=False)


def scaled_policy(scale: Scale) -> str:
    """The receiver's built-in policy with every duration (``*_s``) scaled like the rules'
    windows: hysteresis, drain delay and restore steps keep their proportions."""
    from importlib import resources

    doc = yaml.safe_load((resources.files("llmsla.alerting") / "policy.default.yaml").read_text())

    def walk(node: object) -> object:
        if isinstance(node, dict):
            return {k: (scale.seconds(v) if k.endswith("_s") and isinstance(v, int | float) else walk(v))
                    for k, v in node.items()}
        if isinstance(node, list):
            return [walk(v) for v in node]
        return node

    return ("# The built-in receiver policy (llmsla/alerting/policy.default.yaml) with durations x "
            f"{scale.factor:.4g}, written by llmsla demo\n" + yaml.safe_dump(walk(doc), sort_keys=False))


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=1) as r:
            return r.status == 200
    except OSError:
        return False


def prom_query(url: str, query: str) -> list[dict]:
    """An instant query's result vector ([] when Prometheus does not answer)."""
    import json
    import urllib.parse

    try:
        with urllib.request.urlopen(f"{url}/api/v1/query?{urllib.parse.urlencode({'query': query})}", timeout=3) as r:
            return json.load(r)["data"]["result"]
    except (OSError, ValueError, KeyError):
        return []


