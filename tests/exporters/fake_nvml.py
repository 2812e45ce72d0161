"""A shim with NVML's (``pynvml``) API for the GPU collector tests: the only fake allowed.

State lives in module globals so a test configures it before handing the module to
``GpuCollector(nvml=fake_nvml)``: ``reset(devices=[...])``, ``FAIL_INIT = code``,
``FAIL_SAMPLE = {index}``, ``NOT_SUPPORTED = {"power", "util"}`` (every device) or
``Device.unsupported`` (one device; names: power, util, clocks, clock_event_reasons,
clock_throttle_reasons, ecc, remapped_rows, pcie, pcie_replay, nvlink, xid, memory_v2,
temperature_v: a driver without that entry point), ``Device.raises``
(signal name -> NVML code raised by that one call) and ``emit_xid(index, xid)``, which the event
set's ``nvmlEventSetWait`` delivers like the driver does. Return values, argument order, constants
and the field-value structure follow pynvml (nvidia-ml-py).
"""

from __future__ import annotations

import queue
import threading
from dataclasses import dataclass, field

NVML_TEMPERATURE_GPU = 0
nvmlMemory_v2 = 0x02000028
nvmlTemperature_v1 = 0x100000C
NVML_CLOCK_SM = 1
NVML_CLOCK_MEM = 2
NVML_MEMORY_ERROR_TYPE_CORRECTED = 0
NVML_MEMORY_ERROR_TYPE_UNCORRECTED = 1
NVML_VOLATILE_ECC = 0
NVML_AGGREGATE_ECC = 1
NVML_PCIE_UTIL_TX_BYTES = 0
NVML_PCIE_UTIL_RX_BYTES = 1
NVML_VALUE_TYPE_UNSIGNED_LONG_LONG = 3
NVML_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL = 38
NVML_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL = 45
NVML_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL = 52
NVML_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL = 59
NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX = 138
NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX = 139
nvmlEventTypeXidCriticalError = 0x0000000000000008
nvmlEventTypeSingleBitEccError = 0x0000000000000001
nvmlClocksEventReasonGpuIdle = 0x1
nvmlClocksEventReasonSwPowerCap = 0x4
nvmlClocksEventReasonHwSlowdown = 0x8
nvmlClocksEventReasonSwThermalSlowdown = 0x20
NVML_ERROR_TIMEOUT = 10
NVML_ERROR_FUNCTION_NOT_FOUND = 13
NVML_ERROR_NO_PERMISSION = 4
NVML_ERROR_DRIVER_NOT_LOADED = 9
NVML_ERROR_LIBRARY_NOT_FOUND = 12
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_GPU_IS_LOST = 15


class NVMLError(Exception):
    """Same shape as pynvml's: the NVML return code in ``value``."""

    def __init__(self, value: int) -> None:
        super().__init__(f"NVML error {value}")
        self.value = value


@dataclass
class Device:
    name: str = "NVIDIA H100 80GB HBM3"
    uuid: str = "GPU-00000000-0000-0000-0000-000000000000"
    used: int = 10 << 30  # what nvmlDeviceGetMemoryInfo_v2 reports used: the driver's reservation left out
    total: int = 80 << 30
    reserved: int = 600 << 20  # v1's used includes it
    util_pct: int = 42
    temp_c: int = 55
    power_mw: int = 250_000
    sm_clock_mhz: int = 1980
    mem_clock_mhz: int = 2619
    clock_reasons: int = 0
    #: (NVML_MEMORY_ERROR_TYPE_*, NVML_*_ECC) -> count
    ecc: dict = field(default_factory=lambda: {(0, 0): 3, (1, 0): 0, (0, 1): 12, (1, 1): 1})
    remapped_rows: tuple = (2, 1, 0, 0)  # correctable, uncorrectable, pending, failure
    pcie_tx_kbps: int = 1000
    pcie_rx_kbps: int = 2000
    pcie_replay: int = 4
    #: NVML_FI_* id -> value (NVLink throughput in KiB, error totals)
    fields: dict = field(default_factory=lambda: {138: 100, 139: 200, 38: 1, 45: 0, 52: 2, 59: 0})
    unsupported: set = field(default_factory=set)
    raises: dict = field(default_factory=dict)
    extra: dict = field(default_factory=dict)


@dataclass
class _Mem:
    total: int
    free: int
    used: int
    reserved: int = 0  # c_nvmlMemory_v2_t only


@dataclass
class _Util:
    gpu: int
    memory: int


@dataclass
class _Value:
    """c_nvmlValue_t: one member per NVML_VALUE_TYPE_*."""

    dVal: float = 0.0
    uiVal: int = 0
    ulVal: int = 0
    ullVal: int = 0
    sllVal: int = 0
    siVal: int = 0
    usVal: int = 0


@dataclass
class _FieldValue:
    """c_nvmlFieldValue_t."""

    fieldId: int
    scopeId: int = 0
    timestamp: int = 0
    latencyUsec: int = 0
    valueType: int = NVML_VALUE_TYPE_UNSIGNED_LONG_LONG
    nvmlReturn: int = 0
    value: _Value = field(default_factory=_Value)


@dataclass
class _EventData:
    """c_nvmlEventData_t."""

    device: int
    eventType: int
    eventData: int
    gpuInstanceId: int = 0xFFFFFFFF
    computeInstanceId: int = 0xFFFFFFFF


class _EventSet:
    def __init__(self) -> None:
        self.devices: dict[int, int] = {}  # handle -> registered event types
        self.events: queue.Queue[_EventData] = queue.Queue()
        self.freed = False


DEVICES: list[Device] = []
FAIL_INIT: int | None = None
FAIL_SAMPLE: set[int] = set()
NOT_SUPPORTED: set[str] = set()
initialised = 0
shutdowns = 0
EVENT_SETS: list[_EventSet] = []
#: nvmlEventSetWait calls so far (a test waits for the watcher to be waiting)
waits = 0
_lock = threading.Lock()


def reset(devices: list[Device] | None = None) -> None:
    global DEVICES, FAIL_INIT, FAIL_SAMPLE, NOT_SUPPORTED, initialised, shutdowns, EVENT_SETS, waits
    DEVICES = list(devices or [])
    FAIL_INIT, FAIL_SAMPLE, NOT_SUPPORTED = None, set(), set()
    initialised = shutdowns = waits = 0
    EVENT_SETS = []


def _check() -> None:
    if not initialised:
        raise NVMLError(1)  # NVML_ERROR_UNINITIALIZED


def nvmlInit() -> None:
    global initialised
    if FAIL_INIT is not None:
        raise NVMLError(FAIL_INIT)
    initialised += 1


def nvmlShutdown() -> None:
    global initialised, shutdowns
    _check()
    initialised -= 1
    shutdowns += 1


def nvmlDeviceGetCount() -> int:
    _check()
    return len(DEVICES)


def nvmlDeviceGetHandleByIndex(index: int) -> int:
    _check()
    if not 0 <= index < len(DEVICES):
        raise NVMLError(2)  # INVALID_ARGUMENT
    return index


def _dev(handle: int) -> Device:
    _check()
    if handle in FAIL_SAMPLE:
        raise NVMLError(NVML_ERROR_GPU_IS_LOST)
    return DEVICES[handle]


def _signal(handle: int, name: str) -> Device:
    """The device, unless it does not support signal ``name`` or a test made that call raise."""
    d = _dev(handle)
    if name in d.unsupported or name in NOT_SUPPORTED:
        raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
    if name in d.raises:
        raise NVMLError(d.raises[name])
    return d


def nvmlDeviceGetName(handle: int) -> str:
    return _dev(handle).name


def nvmlDeviceGetUUID(handle: int) -> str:
    return _dev(handle).uuid


def nvmlDeviceGetMemoryInfo(handle: int, version: int | None = None) -> _Mem:
    """v1 (``nvmlDeviceGetMemoryInfo``): used includes the driver's reservation; v2
    (``version=nvmlMemory_v2``, ``nvmlDeviceGetMemoryInfo_v2``) reports it apart."""
    d = _dev(handle)
    if not version:
        return _Mem(total=d.total, free=d.total - d.used - d.reserved, used=d.used + d.reserved)
    if version != nvmlMemory_v2:
        raise NVMLError(25)  # NVML_ERROR_ARGUMENT_VERSION_MISMATCH
    if "memory_v2" in d.unsupported:
        raise NVMLError(NVML_ERROR_FUNCTION_NOT_FOUND)
    return _Mem(total=d.total, free=d.total - d.used - d.reserved, used=d.used, reserved=d.reserved)


def nvmlDeviceGetUtilizationRates(handle: int) -> _Util:
    d = _signal(handle, "util")
    return _Util(gpu=d.util_pct, memory=0)


def nvmlDeviceGetTemperature(handle: int, sensor: int) -> int:
    """Deprecated in nvidia-ml-py ("will be removed in CUDA 14.0"): nvmlDeviceGetTemperatureV."""
    if sensor != NVML_TEMPERATURE_GPU:
        raise NVMLError(2)
    return _dev(handle).temp_c


def nvmlDeviceGetTemperatureV(handle: int, sensor: int, version: int = nvmlTemperature_v1) -> int:
    if sensor != NVML_TEMPERATURE_GPU or version != nvmlTemperature_v1:
        raise NVMLError(2)
    if "temperature_v" in _dev(handle).unsupported:
        raise NVMLError(NVML_ERROR_FUNCTION_NOT_FOUND)
    return _dev(handle).temp_c


def nvmlDeviceGetPowerUsage(handle: int) -> int:
    return _signal(handle, "power").power_mw


def nvmlDeviceGetIndex(handle: int) -> int:
    _dev(handle)
    return handle


def nvmlDeviceGetClockInfo(handle: int, type: int) -> int:  # noqa: A002 - pynvml's parameter name
    d = _signal(handle, "clocks")
    if type == NVML_CLOCK_SM:
        return d.sm_clock_mhz
    if type == NVML_CLOCK_MEM:
        return d.mem_clock_mhz
    raise NVMLError(2)


def nvmlDeviceGetCurrentClocksEventReasons(handle: int) -> int:
    return _signal(handle, "clock_event_reasons").clock_reasons


def nvmlDeviceGetCurrentClocksThrottleReasons(handle: int) -> int:
    return _signal(handle, "clock_throttle_reasons").clock_reasons


def nvmlDeviceGetTotalEccErrors(handle: int, errorType: int, counterType: int) -> int:  # noqa: N803 - pynvml's names
    d = _signal(handle, "ecc")
    if (errorType, counterType) not in d.ecc:
        raise NVMLError(2)
    return d.ecc[(errorType, counterType)]


def nvmlDeviceGetRemappedRows(device: int) -> tuple[int, int, int, int]:
    return _signal(device, "remapped_rows").remapped_rows


def nvmlDeviceGetPcieThroughput(device: int, counter: int) -> int:
    d = _signal(device, "pcie")
    if counter not in (NVML_PCIE_UTIL_TX_BYTES, NVML_PCIE_UTIL_RX_BYTES):
        raise NVMLError(2)
    return d.pcie_tx_kbps if counter == NVML_PCIE_UTIL_TX_BYTES else d.pcie_rx_kbps


def nvmlDeviceGetPcieReplayCounter(handle: int) -> int:
    return _signal(handle, "pcie_replay").pcie_replay


def nvmlDeviceGetFieldValues(handle: int, fieldIds: list) -> list[_FieldValue]:  # noqa: N803
    """As NVML: the call succeeds and each value carries its own return code."""
    d = _dev(handle)
    out = []
    for fid in fieldIds:
        fid, scope = fid if isinstance(fid, tuple) else (fid, 0)
        fv = _FieldValue(fieldId=fid, scopeId=scope)
        if "nvlink" in d.unsupported or fid not in d.fields:
            fv.nvmlReturn = NVML_ERROR_NOT_SUPPORTED
        else:
            fv.value.ullVal = d.fields[fid]
        out.append(fv)
    return out


def nvmlEventSetCreate() -> _EventSet:
    _check()
    es = _EventSet()
    EVENT_SETS.append(es)
    return es


def nvmlDeviceGetSupportedEventTypes(handle: int) -> int:
    d = _dev(handle)
    return nvmlEventTypeSingleBitEccError | (0 if "xid" in d.unsupported else nvmlEventTypeXidCriticalError)


def nvmlDeviceRegisterEvents(handle: int, eventTypes: int, eventSet: _EventSet) -> None:  # noqa: N803
    d = _dev(handle)
    if "xid" in d.unsupported and eventTypes & nvmlEventTypeXidCriticalError:
        raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
    eventSet.devices[handle] = eventSet.devices.get(handle, 0) | eventTypes


def nvmlEventSetWait(eventSet: _EventSet, timeoutms: int) -> _EventData:  # noqa: N803
    global waits
    _check()
    with _lock:
        waits += 1
    try:
        return eventSet.events.get(timeout=timeoutms / 1000)
    except queue.Empty:
        raise NVMLError(NVML_ERROR_TIMEOUT) from None


def nvmlEventSetFree(eventSet: _EventSet) -> None:
    _check()
    eventSet.freed = True


def emit_xid(index: int, xid: int) -> None:
    """The driver reports XID ``xid`` on GPU ``index``: every set that registered it gets it."""
    for es in EVENT_SETS:
        if es.devices.get(index, 0) & nvmlEventTypeXidCriticalError:
            es.events.put(_EventData(device=index, eventType=nvmlEventTypeXidCriticalError, eventData=xid))
