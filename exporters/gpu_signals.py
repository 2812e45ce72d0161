"""NVML health signals of one GPU beyond memory, utilisation, temperature and power.

What dcgm-exporter exports by default, read through NVML itself (``pynvml``): SM and memory
clocks, clock event (throttle) reasons, ECC error counts, remapped rows, PCIe throughput and
replays, NVLink bytes and errors. docs/gpu-collector.md maps each to its DCGM field.

A signal the device does not support (``NVML_ERROR_NOT_SUPPORTED``, or a call the driver lacks)
is *absent* from :class:`DeviceSignals` - no 0 that a dashboard would read as healthy - and the
collector logs it once per GPU. A lost GPU raises :class:`GpuLost` so the collector skips that
device for the round; any other error leaves just that signal out of this round.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from types import ModuleType
from typing import Any

from llmsla.exporters.metrics import GpuMetrics

log = logging.getLogger(__name__)

# NVML return codes (stable across NVML versions; the same in pynvml and the test shim)
NOT_SUPPORTED = 3
FUNCTION_NOT_FOUND = 13
GPU_IS_LOST = 15
_ABSENT = (NOT_SUPPORTED, FUNCTION_NOT_FOUND)

#: nvmlClocksEventReason* / nvmlClocksThrottleReason* bits -> the ``reason`` label (the NVML
#: constant's name in snake case). Bits not named here are reported as ``other``.
THROTTLE_REASONS: tuple[tuple[int, str], ...] = (
    (0x001, "gpu_idle"),
    (0x002, "applications_clocks_setting"),
    (0x004, "sw_power_cap"),
    (0x008, "hw_slowdown"),
    (0x010, "sync_boost"),
    (0x020, "sw_thermal_slowdown"),
    (0x040, "hw_thermal_slowdown"),
    (0x080, "hw_power_brake_slowdown"),
    (0x100, "display_clock_setting"),
    (0x200, "board_limit"),
    (0x400, "reliability"),
)
THROTTLE_OTHER = "other"
_NAMED_BITS = sum(bit for bit, _ in THROTTLE_REASONS)

# nvmlDeviceGetTotalEccErrors(handle, errorType, counterType) arguments
_ECC_ERRORS = ((0, "corrected"), (1, "uncorrected"))  # NVML_MEMORY_ERROR_TYPE_*
_ECC_COUNTERS = ((0, "volatile"), (1, "aggregate"))  # NVML_VOLATILE_ECC, NVML_AGGREGATE_ECC
# nvmlDeviceGetPcieThroughput counters: KB/s over a 20 ms sample
_PCIE = ((0, "tx"), (1, "rx"))  # NVML_PCIE_UTIL_TX_BYTES, NVML_PCIE_UTIL_RX_BYTES
#: NVML field ids read in one nvmlDeviceGetFieldValues call. The throughput fields take the link
#: in scopeId; UINT_MAX asks for the sum over all links (nvml.h). Values are cumulative.
ALL_LINKS = 0xFFFFFFFF
NVLINK_BYTES_FIELDS = ((138, "tx"), (139, "rx"))  # NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX/RX, KiB
NVLINK_ERROR_FIELDS = (  # NVML_FI_DEV_NVLINK_*_TOTAL: summed over lanes by NVML
    (38, "crc_flit"), (45, "crc_data"), (52, "replay"), (59, "recovery"),
)
# c_nvmlValue_t members by NVML_VALUE_TYPE_*
_VALUE_MEMBER = {0: "dVal", 1: "uiVal", 2: "ulVal", 3: "ullVal", 4: "sllVal", 5: "siVal", 6: "usVal"}


class GpuLost(Exception):
    """NVML says the GPU fell off the bus: the whole device is skipped this round."""


@dataclass
class DeviceSignals:
    """One round of a GPU's health signals; ``None`` / missing key = not available this round."""

    sm_clock_hz: float | None = None
    mem_clock_hz: float | None = None
    throttle_mask: int | None = None
    ecc: dict[tuple[str, str], int] = field(default_factory=dict)  # (error, counter) -> count
    remapped_rows: dict[str, int] = field(default_factory=dict)  # error -> rows
    remap_pending: bool | None = None
    remap_failed: bool | None = None
    pcie_bytes_per_s: dict[str, float] = field(default_factory=dict)  # direction -> bytes/s
    pcie_replays: int | None = None
    nvlink_bytes: dict[str, int] = field(default_factory=dict)  # direction -> bytes
    nvlink_errors: dict[str, int] = field(default_factory=dict)  # error -> count
    #: signals the device does not support (absent above), by name
    unsupported: set[str] = field(default_factory=set)
    #: signals that failed this round for another reason: name -> error
    failed: dict[str, str] = field(default_factory=dict)


    def to_dict(self) -> dict[str, Any]:
        """JSON-ready (``llmsla gpu --once``): absent signals left out, active throttle reasons named."""
        out: dict[str, Any] = {}
        for name in ("sm_clock_hz", "mem_clock_hz", "remap_pending", "remap_failed", "pcie_replays"):
            value = getattr(self, name)
            if value is not None:
                out[name] = value
        if self.throttle_mask is not None:
            out["throttle_mask"] = self.throttle_mask
            out["throttle_reasons"] = sorted(r for r, on in throttle_reasons(self.throttle_mask).items() if on)
        for name in ("remapped_rows", "pcie_bytes_per_s", "nvlink_bytes", "nvlink_errors"):
            if getattr(self, name):
                out[name] = dict(getattr(self, name))
        if self.ecc:
            out["ecc"] = {f"{err}.{counter}": n for (err, counter), n in self.ecc.items()}
        if self.unsupported:
            out["unsupported"] = sorted(self.unsupported)
        if self.failed:
            out["failed"] = dict(self.failed)
        return out


def throttle_reasons(mask: int) -> dict[str, int]:
    """Every named reason 0/1 from a reasons bitmask, plus ``other`` for bits NVML added later."""
    out = {name: 1 if mask & bit else 0 for bit, name in THROTTLE_REASONS}
    out[THROTTLE_OTHER] = 1 if mask & ~_NAMED_BITS else 0
    return out


def _code(exc: BaseException) -> int | None:
    value = getattr(exc, "value", None)
    return value if isinstance(value, int) else None


def _field_value(fv: Any) -> float:
    member = _VALUE_MEMBER.get(int(fv.valueType))
    if member is None:
        raise ValueError(f"unknown NVML value type {fv.valueType}")
    return float(getattr(fv.value, member))


class _Reader:
    """Calls NVML for one device, sorting each outcome into a value, absent or failed."""

    def __init__(self, nv: ModuleType, handle: Any, out: DeviceSignals) -> None:
        self.nv, self.handle, self.out = nv, handle, out

    def call(self, name: str, read: Callable[[], Any]) -> Any:
        try:
            return read()
        except AttributeError:  # an older pynvml without this function: as if not supported
            self.out.unsupported.add(name)
        except Exception as exc:  # NVMLError and whatever a broken driver raises
            code = _code(exc)
            if code == GPU_IS_LOST:
                raise GpuLost(str(exc)) from exc
            if code in _ABSENT:
                self.out.unsupported.add(name)
            else:
                self.out.failed[name] = str(exc) or type(exc).__name__
        return None

    def throttle(self) -> None:
        """nvmlDeviceGetCurrentClocksEventReasons (NVML >= 12.2), else the older ...ThrottleReasons."""
        nv, h = self.nv, self.handle
        probe = DeviceSignals()
        mask = _Reader(nv, h, probe).call("clock_event_reasons", lambda: nv.nvmlDeviceGetCurrentClocksEventReasons(h))
        if mask is None and "clock_event_reasons" in probe.unsupported:
            mask = self.call("clock_throttle_reasons", lambda: nv.nvmlDeviceGetCurrentClocksThrottleReasons(h))
        elif mask is None:
            self.out.failed.update(probe.failed)
        self.out.throttle_mask = None if mask is None else int(mask)

    def field_values(self) -> None:
        nv, h, out = self.nv, self.handle, self.out
        ids = [(fid, ALL_LINKS) for fid, _ in NVLINK_BYTES_FIELDS] + [fid for fid, _ in NVLINK_ERROR_FIELDS]
        values = self.call("nvlink", lambda: nv.nvmlDeviceGetFieldValues(h, ids))
        if values is None:
            return
        targets = [(out.nvlink_bytes, d, "nvlink_bytes", 1024) for _, d in NVLINK_BYTES_FIELDS] + \
                  [(out.nvlink_errors, e, "nvlink_errors", 1) for _, e in NVLINK_ERROR_FIELDS]
        for fv, (store, key, name, scale) in zip(values, targets, strict=True):
            ret = int(fv.nvmlReturn)
            if ret == 0:
                try:
                    store[key] = int(_field_value(fv)) * scale
                except ValueError as exc:
                    out.failed[f"{name}.{key}"] = str(exc)
            elif ret in _ABSENT:
                out.unsupported.add(f"{name}.{key}")
            elif ret == GPU_IS_LOST:
                raise GpuLost(f"NVML field {fv.fieldId}: GPU is lost")
            else:
                out.failed[f"{name}.{key}"] = f"NVML error {ret}"


def read_signals(nv: ModuleType, handle: Any) -> DeviceSignals:
    """Every health signal of one device (raises :class:`GpuLost` only)."""
    out = DeviceSignals()
    r = _Reader(nv, handle, out)
    sm = r.call("sm_clock", lambda: nv.nvmlDeviceGetClockInfo(handle, nv.NVML_CLOCK_SM))
    mem = r.call("mem_clock", lambda: nv.nvmlDeviceGetClockInfo(handle, nv.NVML_CLOCK_MEM))
    out.sm_clock_hz = None if sm is None else float(sm) * 1e6  # MHz
    out.mem_clock_hz = None if mem is None else float(mem) * 1e6
    r.throttle()
    for err_type, err in _ECC_ERRORS:
        for counter_type, counter in _ECC_COUNTERS:
            n = r.call(f"ecc.{err}.{counter}", partial(nv.nvmlDeviceGetTotalEccErrors, handle, err_type, counter_type))
            if n is not None:
                out.ecc[(err, counter)] = int(n)
    rows = r.call("remapped_rows", lambda: nv.nvmlDeviceGetRemappedRows(handle))
    if rows is not None:
        corr, unc, pending, failure = rows
        out.remapped_rows = {"correctable": int(corr), "uncorrectable": int(unc)}
        out.remap_pending, out.remap_failed = bool(pending), bool(failure)
    for counter_type, direction in _PCIE:
        kbps = r.call(f"pcie_throughput.{direction}", partial(nv.nvmlDeviceGetPcieThroughput, handle, counter_type))
        if kbps is not None:
            out.pcie_bytes_per_s[direction] = float(kbps) * 1024.0  # NVML's "KB" is 1024 bytes
    replays = r.call("pcie_replays", lambda: nv.nvmlDeviceGetPcieReplayCounter(handle))
    out.pcie_replays = None if replays is None else int(replays)
    r.field_values()
    return out


class SignalRecorder:
    """Puts :class:`DeviceSignals` on the GPU metrics. NVML's counters are cumulative; each is
    mirrored into a Prometheus counter by its increase since the previous round, so the series
    reads NVML's own value, and a source that went down (driver reload resets the volatile ECC
    count) counts on from its new value, as ``rate()`` would treat a reset."""

    def __init__(self, metrics: GpuMetrics) -> None:
        self.m = metrics
        self._last: dict[tuple[int, tuple[str, ...]], float] = {}

    def _count(self, counter: Any, labels: tuple[str, ...], value: float) -> None:
        key = (id(counter), labels)
        last = self._last.get(key)
        delta = value if last is None or value < last else value - last
        self._last[key] = value
        child = counter.labels(*labels)
        if delta > 0:
            child.inc(delta)

    @staticmethod
    def _gauge(gauge: Any, labels: tuple[str, ...], value: float | None) -> None:
        """Set a gauge, or drop its series when the signal was not read this round (a stale
        value would look current)."""
        if value is not None:
            gauge.labels(*labels).set(value)
            return
        with contextlib.suppress(KeyError):
            gauge.remove(*labels)

    def record(self, labels: tuple[str, str, str], s: DeviceSignals) -> None:
        m = self.m
        self._gauge(m.sm_clock, labels, s.sm_clock_hz)
        self._gauge(m.mem_clock, labels, s.mem_clock_hz)
        reasons = throttle_reasons(s.throttle_mask) if s.throttle_mask is not None else {}
        for _, reason in (*THROTTLE_REASONS, (0, THROTTLE_OTHER)):
            self._gauge(m.throttle, (*labels, reason), reasons.get(reason))
        for (err, counter), n in s.ecc.items():
            self._count(m.ecc, (*labels, err, counter), n)
        for err, n in s.remapped_rows.items():
            self._count(m.remapped_rows, (*labels, err), n)
        self._gauge(m.remap_pending, labels, None if s.remap_pending is None else int(s.remap_pending))
        self._gauge(m.remap_failed, labels, None if s.remap_failed is None else int(s.remap_failed))
        for _, direction in _PCIE:
            self._gauge(m.pcie_throughput, (*labels, direction), s.pcie_bytes_per_s.get(direction))
        if s.pcie_replays is not None:
            self._count(m.pcie_replays, labels, s.pcie_replays)
        for direction, n in s.nvlink_bytes.items():
            self._count(m.nvlink_bytes, (*labels, direction), n)
        for err, n in s.nvlink_errors.items():
            self._count(m.nvlink_errors, (*labels, err), n)
