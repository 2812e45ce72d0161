"""The GPU collector: NVML per-device gauges + ``GpuSample`` events, and torch allocator memory.

NVML is reached through the ``pynvml`` module of nvidia-ml-py; the module is a parameter so tests
inject a shim with NVML's API (``tests/exporters/fake_nvml.py``) - hardware is the one thing we
fake. On a host without NVML (no library, no driver, no permission) the collector exports only
``llmsla_gpu_collector_up 0`` with a bounded ``reason`` label, so dashboards can tell "no GPU
here" from "collector dead", and no device series that would look like zeros.

The torch CUDA allocator numbers (allocated, reserved, their difference = memory the caching
allocator holds but no tensor uses) are per *process*: they are read only when torch is already
imported and CUDA initialised in this process (an inference worker embedding the collector);
the collector never imports torch itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import sys
import time
from collections.abc import Callable
from types import ModuleType
from typing import Any

from prometheus_client import CollectorRegistry, Gauge

from llmsla import names
from llmsla.config import Config
from llmsla.events import GpuSample
from llmsla.exporters.gpu_signals import (
    FUNCTION_NOT_FOUND,
    DeviceSignals,
    GpuLost,
    SignalRecorder,
    read_signals,
)
from llmsla.exporters.gpu_xid import XidWatcher
from llmsla.exporters.metrics import gpu_metrics
from llmsla.exporters.recorder import GpuRecorder
from llmsla.seams import EventSink

log = logging.getLogger(__name__)

#: Bounded values of the ``reason`` label of ``llmsla_gpu_collector_up``.
REASON_OK = ""
REASON_MODULE_MISSING = "module_missing"
REASON_LIBRARY_NOT_FOUND = "library_not_found"
REASON_DRIVER_NOT_LOADED = "driver_not_loaded"
REASON_NO_PERMISSION = "no_permission"
REASON_INIT_FAILED = "init_failed"
REASON_SAMPLE_FAILED = "sample_failed"

_NVML_REASONS = {  # NVML_ERROR_* codes (stable across NVML versions)
    12: REASON_LIBRARY_NOT_FOUND,
    9: REASON_DRIVER_NOT_LOADED,
    4: REASON_NO_PERMISSION,
}


def load_nvml() -> ModuleType | None:
    try:
        import pynvml
    except ImportError:
        return None
    return pynvml


def _text(value: Any) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


def _newer_else_older(newer: Callable[[], Any] | None, older: Callable[[], Any], nv: ModuleType) -> Any:
    """``newer()``, or ``older()`` where nvidia-ml-py (None) or the driver (FUNCTION_NOT_FOUND)
    lacks the newer entry point; any other NVML error is raised."""
    if newer is not None:
        try:
            return newer()
        except nv.NVMLError as exc:
            if getattr(exc, "value", None) != FUNCTION_NOT_FOUND:
                raise
    return older()


def memory_info(nv: ModuleType, handle: Any) -> Any:
    """The device's memory as dcgm-exporter's ``DCGM_FI_DEV_FB_USED`` reads it:
    ``nvmlDeviceGetMemoryInfo_v2``, whose ``used`` leaves out the driver's reserved memory (the v1
    call's includes it); v1 where the driver or nvidia-ml-py has no v2."""
    version = getattr(nv, "nvmlMemory_v2", None)
    newer = None if version is None else lambda: nv.nvmlDeviceGetMemoryInfo(handle, version=version)
    return _newer_else_older(newer, lambda: nv.nvmlDeviceGetMemoryInfo(handle), nv)


def gpu_temperature(nv: ModuleType, handle: Any) -> int:
    """The GPU die's temperature (C) by ``nvmlDeviceGetTemperatureV``: nvidia-ml-py deprecates
    ``nvmlDeviceGetTemperature`` ("will be removed in CUDA 14.0"), used where V is missing."""
    get_v = getattr(nv, "nvmlDeviceGetTemperatureV", None)
    newer = None if get_v is None else lambda: get_v(handle, nv.NVML_TEMPERATURE_GPU)
    return int(_newer_else_older(newer, lambda: nv.nvmlDeviceGetTemperature(handle, nv.NVML_TEMPERATURE_GPU), nv))


class GpuCollector:
    """Samples every GPU NVML sees; one instance per process (``llmsla gpu`` or a worker)."""

    def __init__(self, cfg: Config, *, registry: CollectorRegistry | None = None,
                 spool: EventSink | None = None, nvml: ModuleType | None | bool = True) -> None:
        self.cfg = cfg
        self.registry = registry
        self.spool = spool
        self.node = cfg.gpu.node or socket.gethostname()
        self.nvml: ModuleType | None = load_nvml() if nvml is True else (nvml or None)
        self.up = Gauge(names.GPU_COLLECTOR_UP, "1 if NVML answered the last sample, else 0 with the reason.",
                        (names.L_REASON,), registry=registry, multiprocess_mode="mostrecent")
        self.recorder: GpuRecorder | None = None
        self.signals: SignalRecorder | None = None
        self.xid: XidWatcher | None = None
        #: per GPU, the signals already logged as not supported (each is logged once)
        self._unsupported: dict[int, set[str]] = {}
        self._uuids: list[str] = []
        self._failing: set[tuple[int, str]] = set()  # (gpu, signal) whose read fails: logged once
        #: the last round's health signals per GPU index (``llmsla gpu --once`` prints them)
        self.last_signals: dict[int, DeviceSignals] = {}
        self.reason = REASON_INIT_FAILED
        self._handles: list[Any] = []
        self._names: list[str] = []
        self._initialised = False

    # -- lifecycle -------------------------------------------------------------------------------
    def start(self) -> bool:
        """Initialise NVML; False (and ``up 0{reason}``) when it is not usable on this host."""
        nv = self.nvml
        if nv is None:
            return self._down(REASON_MODULE_MISSING)
        try:
            nv.nvmlInit()
            self._initialised = True
            count = nv.nvmlDeviceGetCount()
            self._handles = [nv.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
            self._names = [_text(nv.nvmlDeviceGetName(h)) for h in self._handles]
        except Exception as exc:  # NVMLError and anything a broken driver raises
            return self._down(self._reason(exc), exc)
        self.recorder = GpuRecorder(self.cfg, registry=self.registry, spool=self.spool)
        self.signals = SignalRecorder(self.recorder.metrics)
        self._uuids = [""] * len(self._handles)
        self.xid = XidWatcher(nv, self._handles, self._count_xid)
        if not self.xid.start():
            self.xid = None
        self._set_up(REASON_OK)
        return True

    def close(self) -> None:
        if self.xid is not None:
            self.xid.stop()
            self.xid = None
        if self._initialised and self.nvml is not None:
            with contextlib.suppress(Exception):
                self.nvml.nvmlShutdown()
            self._initialised = False

    def _reason(self, exc: BaseException) -> str:
        return _NVML_REASONS.get(getattr(exc, "value", None), REASON_INIT_FAILED)  # type: ignore[arg-type]  # NVMLError.value: an int

    def _set_up(self, reason: str) -> None:
        self.reason = reason
        self.up.clear()
        self.up.labels(reason).set(1 if reason == REASON_OK else 0)

    def _down(self, reason: str, exc: BaseException | None = None) -> bool:
        if exc is not None:
            log.warning("GPU collector down (%s): %s", reason, exc)
        self._set_up(reason)
        return False

    # -- sampling --------------------------------------------------------------------------------
    def sample(self) -> list[GpuSample]:
        """One sample per GPU -> gauges + spool. A device that fails mid-way marks the collector
        down for this round (``sample_failed``) but keeps the others' samples."""
        if self.recorder is None or self.nvml is None:
            return []
        nv = self.nvml
        out: list[GpuSample] = []
        failed = False
        ts = time.time_ns() // 1_000_000
        for i, (h, model_name) in enumerate(zip(self._handles, self._names, strict=True)):
            try:
                mem = memory_info(nv, h)
                uuid = _text(nv.nvmlDeviceGetUUID(h))
                temp = float(gpu_temperature(nv, h))
            except Exception as exc:
                log.warning("GPU %d: NVML sample failed: %s", i, exc)
                failed = True
                continue
            try:
                signals = read_signals(nv, h)
            except GpuLost as exc:
                log.warning("GPU %d: NVML sample failed: %s", i, exc)
                failed = True
                continue
            self._uuids[i] = uuid
            self.last_signals[i] = signals
            self._log_unsupported(i, uuid, signals.unsupported, signals.failed)
            util = self._optional(lambda h=h: nv.nvmlDeviceGetUtilizationRates(h).gpu / 100.0)
            power = self._optional(lambda h=h: nv.nvmlDeviceGetPowerUsage(h) / 1000.0)  # mW -> W
            s = GpuSample(ts_ms=ts, node=self.node, gpu=i, uuid=uuid, mem_used_bytes=int(mem.used),
                          mem_total_bytes=int(mem.total), util=min(1.0, max(0.0, util)), temp_c=temp,
                          power_w=max(0.0, power))
            self.recorder.record(s, model_name=model_name, free_bytes=int(mem.free))
            if self.signals is not None:
                self.signals.record((str(i), uuid, model_name), signals)
            out.append(s)
        self._set_up(REASON_SAMPLE_FAILED if failed else REASON_OK)
        self._torch()
        return out

    def _log_unsupported(self, gpu: int, uuid: str, unsupported: set[str], failed: dict[str, str]) -> None:
        """One line per GPU for the signals it does not support (once); a signal that fails to
        read for another reason is logged when it starts failing, not every round."""
        seen = self._unsupported.setdefault(gpu, set())
        new = unsupported - seen
        if new:
            seen |= new
            log.info("GPU %d (%s): %d signal(s) not supported, left out: %s", gpu, uuid, len(new),
                     ", ".join(sorted(new)))
        failing = {(gpu, name) for name in failed}
        for _, name in sorted(failing - self._failing):
            log.warning("GPU %d (%s): %s could not be read: %s", gpu, uuid, name, failed[name])
        self._failing = {k for k in self._failing if k[0] != gpu} | failing

    def _count_xid(self, gpu: int, xid: int) -> None:
        """XidWatcher's callback (its own thread): one more XID ``xid`` on GPU ``gpu``."""
        log.warning("GPU %d (%s): XID %d", gpu, self._uuids[gpu], xid)
        if self.recorder is not None:
            labels = (str(gpu), self._uuids[gpu] or self._uuid_of(gpu), self._names[gpu], str(xid))
            self.recorder.metrics.xid.labels(*labels).inc()

    def _uuid_of(self, gpu: int) -> str:
        """The UUID of a GPU not sampled yet (an XID before the first sample)."""
        try:
            self._uuids[gpu] = _text(self.nvml.nvmlDeviceGetUUID(self._handles[gpu]))  # type: ignore[union-attr]  # start() succeeded: nvml is set
        except Exception:
            return ""
        return self._uuids[gpu]

    @staticmethod
    def _optional(read: Any) -> float:
        """Utilisation and power are 'not supported' on some boards (MIG, vGPU): report 0."""
        try:
            return float(read())
        except Exception:
            return 0.0

    def _torch(self) -> None:
        torch = sys.modules.get("torch")
        if torch is None:
            return
        try:
            cuda = torch.cuda
            if not cuda.is_available() or not cuda.is_initialized():
                return
            m = gpu_metrics(self.registry)
            for i in range(cuda.device_count()):
                alloc, reserved = int(cuda.memory_allocated(i)), int(cuda.memory_reserved(i))
                m.torch_allocated.labels(str(i)).set(alloc)
                m.torch_reserved.labels(str(i)).set(reserved)
                m.torch_frag.labels(str(i)).set(max(0, reserved - alloc))
        except Exception as exc:  # never let the allocator probe break NVML sampling
            log.warning("torch CUDA allocator probe failed: %s", exc)

    async def run(self, stop: asyncio.Event) -> None:
        """Sample every ``cfg.gpu.interval_s`` until ``stop`` is set (NVML calls in a thread)."""
        if not self.start():
            await stop.wait()
            return
        try:
            while not stop.is_set():
                await asyncio.to_thread(self.sample)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), self.cfg.gpu.interval_s)
        finally:
            self.close()
