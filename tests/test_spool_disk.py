"""The spool on a real full disk and a real read-only directory: tmpfs mounts of a few MiB.

A full disk while serving: every event the gateway answered is either in the spool or counted
in ``llmsla_spool_dropped_total`` (nothing lost silently), the writer keeps going, and writes
resume when space comes back; a disk freed within ``spool.write_retry_s`` loses nothing. At
start-up, a full or read-only spool stops every writer with one line and exit status 2.

Mounting a tmpfs needs CAP_SYS_ADMIN. As root the tests mount directly; otherwise each test runs
itself again (a pytest of its own node id) inside ``unshare --user --map-root-user --mount``,
where an unprivileged user may mount a tmpfs in its own mount namespace.
``LLMSLA_TEST_TMPFS_VIA=unshare`` forces that path for root too (to test it). Where neither
works, the tests fail with a hint: never a skip, never a pass untested.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from aiohttp import web
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from llmsla import config as config_mod
from llmsla import names, spool
from llmsla.app.doctor import check_spool
from llmsla.events import RequestEvent

ROOT = Path(__file__).resolve().parents[1]


#: set inside the namespace: this process may mount (do not re-run in another namespace)
_INNER = "LLMSLA_TEST_TMPFS_INNER"
_UNSHARE = ["unshare", "--user", "--map-root-user", "--mount"]
_HINT = ("these tests mount tmpfs: run them as root, or where unprivileged user namespaces are allowed "
         "(`unshare --user --map-root-user --mount true` must work: sysctl user.max_user_namespaces > 0, "
         "kernel.unprivileged_userns_clone=1, on Ubuntu kernel.apparmor_restrict_unprivileged_userns=0)")


def mount_via() -> str:
    """``mount``: this process mounts itself (root, or already inside the namespace);
    ``unshare``: each test re-runs inside a user + mount namespace."""
    if os.environ.get(_INNER):
        return "mount"
    forced = os.environ.get("LLMSLA_TEST_TMPFS_VIA", "")
    if forced:
        if forced not in ("mount", "unshare"):
            pytest.fail(f"LLMSLA_TEST_TMPFS_VIA={forced!r}: expected mount or unshare")
        return forced
    return "mount" if os.geteuid() == 0 else "unshare"


def needs_mounts(test: Callable[..., None]) -> Callable[..., None]:
    """Run ``test`` where it can mount: here, or as its own pytest inside a user + mount
    namespace (the outer test passes exactly when that run passes)."""

    @functools.wraps(test)
    def run(*args: object, **kwargs: object) -> None:
        if mount_via() == "mount":
            test(*args, **kwargs)
            return
        try:
            probe = subprocess.run([*_UNSHARE, "true"], capture_output=True, text=True)
            why = probe.stderr.strip() if probe.returncode else ""
        except OSError as exc:  # no unshare(1) here (util-linux)
            why = str(exc)
        if why:
            pytest.fail(f"not root (or LLMSLA_TEST_TMPFS_VIA=unshare), and `{' '.join(_UNSHARE)} true` failed ({why}): {_HINT}")
        node = os.environ["PYTEST_CURRENT_TEST"].rsplit(" ", 1)[0]  # "<file>::<name>[<params>] (call)"
        env = {**os.environ, _INNER: "1"}
        env.pop("PYTEST_CURRENT_TEST", None)
        proc = subprocess.run([*_UNSHARE, "--", sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider",
                               node], capture_output=True, text=True, env=env, cwd=ROOT, timeout=600)
        assert proc.returncode == 0 and " passed" in proc.stdout, f"{node} in a user namespace:\n{proc.stdout}{proc.stderr}"

    return run


@contextlib.contextmanager
def tmpfs(where: Path, size_kib: int) -> Iterator[Path]:
    where.mkdir(parents=True, exist_ok=True)
    proc = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size_kib}k", "tmpfs", str(where)],
                          capture_output=True, text=True)
    if proc.returncode != 0:
        pytest.fail(f"cannot mount a {size_kib} KiB tmpfs at {where} ({proc.stderr.strip()}): {_HINT}")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], capture_output=True)


def read_only(fs: Path) -> None:
    """Remount the tmpfs at ``fs`` read-only (this form works in a user namespace too)."""
    subprocess.run(["mount", "-t", "tmpfs", "-o", "remount,ro", "tmpfs", str(fs)], check=True)


def fill(d: Path) -> Path:
    """Take every free byte of ``d``'s file system with a ballast file."""
    ballast = d / "ballast"
    fd = os.open(ballast, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    try:
        with contextlib.suppress(OSError):
            while True:
                os.write(fd, b"\0" * 4096)
        with contextlib.suppress(OSError):
            while True:
                os.write(fd, b"\0")
    finally:
        os.close(fd)
    return ballast


def _env(spool_dir: Path, **spool_keys: object) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("LLMSLA_")}
    env["LLMSLA_SPOOL_DIR"] = str(spool_dir)
    for k, v in spool_keys.items():
        env[f"LLMSLA_SPOOL_{k.upper()}"] = str(v)
    return env


class Upstream:
    """A small OpenAI-compatible upstream on its own loop (it serves any model)."""

    def __init__(self) -> None:
        self.url = ""
        self._ready = threading.Event()
        self._thread = threading.Thread(target=lambda: asyncio.run(self._main()), daemon=True)
        self._thread.start()
        assert self._ready.wait(10)

    async def _main(self) -> None:
        async def completions(request: web.Request) -> web.Response:
            await request.read()
            return web.json_response({"id": "x", "model": "m", "choices": [{"index": 0, "text": "hi",
                                      "finish_reason": "stop"}], "usage": {"prompt_tokens": 1, "completion_tokens": 1}})

        app = web.Application()
        app.router.add_post("/v1/completions", completions)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        self.url = f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"  # type: ignore[union-attr]
        self._ready.set()
        await asyncio.Event().wait()


def start_gateway(env: dict[str, str], upstream: str) -> tuple[subprocess.Popen, str]:
    proc = subprocess.Popen([sys.executable, "-m", "llmsla", "gateway", "--port", "0", "--upstream", upstream],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT)
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert "listening on" in line, line + proc.stdout.read()
    url = line.split("listening on ", 1)[1].split(" ", 1)[0]
    return proc, url


def send(url: str, n: int) -> None:
    body = json.dumps({"model": "m", "prompt": "hello", "max_tokens": 1}).encode()
    for _ in range(n):
        req = urllib.request.Request(url + "/v1/completions", body, {"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=10) as r:
            assert r.status == 200


def metric(url: str, name: str) -> float:
    with urllib.request.urlopen(url + "/metrics", timeout=10) as r:
        text = r.read().decode()
    return sum(s.value for fam in text_string_to_metric_families(text) for s in fam.samples if s.name == name)


def spooled(d: Path) -> int:
    return sum(1 for p in spool.published_segments(d, names.SPOOL_REQUESTS) for _ in spool.read_segment(p, names.SPOOL_REQUESTS))


def stop(proc: subprocess.Popen) -> str:
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=60)
    return out


@needs_mounts
def test_threads_filling_the_disk_lose_nothing_silently(tmp_path: Path) -> None:
    """Eight threads share one writer on a 1 MiB file system until it is full (short writes,
    ENOSPC mid-segment): every line a reader sees is whole and unique, and lines read + lines
    counted as dropped = lines sent; the counter, ``dropped`` and the drop record agree."""
    threads, per = 8, 1500
    registry = CollectorRegistry()
    with tmpfs(tmp_path / "fs", 1024) as fs:
        d = fs / "spool"
        w = spool.SpoolWriter(d, names.SPOOL_REQUESTS, max_segment_bytes=65536, max_segment_age_s=0.05,
                              retry_s=0.3, max_pending_bytes=1 << 16, registry=registry)

        def body(t: int) -> None:
            for i in range(per):
                w.write_line(RequestEvent(
                    ts_ms=1_700_000_000_000 + i, trace_id=f"{t:02d}{i:030d}", model="m", pool="p", replica=f"r{t}",
                    arm="default", policy="constant", prompt_tokens=1, output_tokens=1, queue_ms=0.0, ttft_ms=1.0,
                    itl_ms=[1.0], e2e_ms=10.0, status="ok").to_json())

        ts = [threading.Thread(target=body, args=(t,)) for t in range(threads)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        w.close()
        read = [e for p in spool.published_segments(d, names.SPOOL_REQUESTS)
                for e in spool.read_segment(p, names.SPOOL_REQUESTS)]
        records = spool.drop_records(d)
        left = list((d / names.SPOOL_REQUESTS / spool.INPROGRESS).glob("*.jsonl"))
    assert not [e for e in read if isinstance(e, spool.BadLine)]
    ids = [e.trace_id for e in read]
    assert len(ids) == len(set(ids))  # nothing written twice by a retry
    dropped = w.dropped[names.SPOOL_DROP_NO_SPACE]
    assert dropped > 0 and len(ids) > 0
    assert len(ids) + sum(w.dropped.values()) == threads * per
    assert registry.get_sample_value(f"{names.SPOOL_DROPPED}_total", {
        names.L_KIND: names.SPOOL_REQUESTS, names.L_REASON: names.SPOOL_DROP_NO_SPACE}) == dropped
    assert len(records) == 1 and records[0]["dropped"] == w.dropped
    assert left == [] and w.tick_errors == 0


@needs_mounts
def test_full_disk_while_serving_counts_every_lost_event_and_recovers(tmp_path: Path) -> None:
    up = Upstream()
    with tmpfs(tmp_path / "fs", 4096) as fs:
        d = fs / "spool"
        proc, url = start_gateway(_env(d, segment_max_bytes=65536, write_retry_s=1.0, segment_max_age_s=0.2), up.url)
        try:
            send(url, 50)
            time.sleep(0.6)  # published (segment_max_age_s)
            ballast = fill(fs)
            send(url, 1500)  # the disk is full: these are retried, then dropped and counted
            time.sleep(2.5)
            dropped = metric(url, f"{names.SPOOL_DROPPED}_total")
            assert dropped > 0
            ballast.unlink()  # space again: the writer (still alive) writes the next ones
            send(url, 100)
            time.sleep(1.0)
            answered = metric(url, f"{names.REQUESTS}_total")
            dropped = metric(url, f"{names.SPOOL_DROPPED}_total")
        finally:
            out = stop(proc)
        assert answered == 1650
        assert spooled(d) + dropped == 1650, out  # every answered request: in the spool or counted
        assert spooled(d) >= 150  # before the disk filled, and after it had room again
        assert "dropped" in out and "Traceback" not in out, out
        (record,) = spool.drop_records(d)
        assert record["dropped"][names.SPOOL_DROP_NO_SPACE] == dropped
        # `llmsla doctor` shows it
        cfg = config_mod.load(env={})
        cfg.spool.dir, cfg.spool.segment_max_bytes = str(d), 65536
        check = check_spool(cfg)
        assert check.status == "WARN" and f"{int(dropped)} events dropped" in check.detail, check
        assert f"requests/{names.SPOOL_DROP_NO_SPACE}: {int(dropped)}" in check.detail, check


@needs_mounts
def test_disk_freed_within_the_retry_window_loses_nothing(tmp_path: Path) -> None:
    up = Upstream()
    with tmpfs(tmp_path / "fs", 4096) as fs:
        d = fs / "spool"
        proc, url = start_gateway(_env(d, segment_max_bytes=65536, write_retry_s=30, segment_max_age_s=0.2), up.url)
        try:
            ballast = fill(fs)
            send(url, 300)
            time.sleep(1.0)
            ballast.unlink()
            time.sleep(2.0)
            dropped = metric(url, f"{names.SPOOL_DROPPED}_total")
        finally:
            out = stop(proc)
        assert dropped == 0
        assert spooled(d) == 300, out
        assert not spool.drop_records(d)


WRITERS = {
    "gateway": ["gateway", "--port", "0", "--upstream", "http://127.0.0.1:9"],
    "gpu": ["gpu", "--port", "0"],
    "simulate": ["simulate", "--load", "poisson", "--duration", "5", "--rate", "5"],
    "worker": ["worker", "--port", "0"],
}


@pytest.mark.parametrize("state", ["full", "read-only"])
@pytest.mark.parametrize("command", sorted(WRITERS))
@needs_mounts
def test_unusable_spool_at_start_up_is_one_line_and_exit_2(tmp_path: Path, command: str, state: str) -> None:
    with tmpfs(tmp_path / "fs", 1024) as fs:
        d = fs / "spool"
        for kind in names.SPOOL_KINDS:  # the spool as a writer left it: every directory there
            (d / kind / spool.INPROGRESS).mkdir(parents=True)
        if state == "read-only":
            read_only(fs)
        else:
            fill(fs)
        proc = subprocess.run([sys.executable, "-m", "llmsla", *WRITERS[command]], env=_env(d),
                              capture_output=True, text=True, timeout=120, cwd=ROOT)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2, (proc.returncode, proc.stdout, proc.stderr)
    assert len(lines) == 1 and lines[0].startswith("llmsla: error: spool.dir:"), proc.stderr
    assert ("full" if state == "full" else "Read-only file system") in lines[0], lines[0]
