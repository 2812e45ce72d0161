"""A shim with NVML's (``pynvml``) API for the GPU collector tests: the only fake allowed.

State lives in module globals so a test configures it before handing the module to
``GpuCollector(nvml=fake_nvml)``: ``reset(devices=[...])``, ``FAIL_INIT = code``,
``FAIL_SAMPLE = {index}``, ``NOT_SUPPORTED = {"power", "util"}``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

NVML_TEMPERATURE_GPU = 0
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
    used: int = 10 << 30
    total: int = 80 << 30
    util_pct: int = 42
    temp_c: int = 55
    power_mw: int = 250_000
    extra: dict = field(default_factory=dict)


@dataclass
class _Mem:
    total: int
    free: int
    used: int


@dataclass
class _Util:
    gpu: int
    memory: int


DEVICES: list[Device] = []
FAIL_INIT: int | None = None
FAIL_SAMPLE: set[int] = set()
NOT_SUPPORTED: set[str] = set()
initialised = 0
shutdowns = 0


def reset(devices: list[Device] | None = None) -> None:
    global DEVICES, FAIL_INIT, FAIL_SAMPLE, NOT_SUPPORTED, initialised, shutdowns
    DEVICES = list(devices or [])
    FAIL_INIT, FAIL_SAMPLE, NOT_SUPPORTED = None, set(), set()
    initialised = shutdowns = 0


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


def nvmlDeviceGetName(handle: int) -> str:
    return _dev(handle).name


def nvmlDeviceGetUUID(handle: int) -> str:
    return _dev(handle).uuid


def nvmlDeviceGetMemoryInfo(handle: int, version: int | None = None) -> _Mem:
    d = _dev(handle)
    return _Mem(total=d.total, free=d.total - d.used, used=d.used)


def nvmlDeviceGetUtilizationRates(handle: int) -> _Util:
    d = _dev(handle)
    if "util" in NOT_SUPPORTED:
        raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
    return _Util(gpu=d.util_pct, memory=0)


def nvmlDeviceGetTemperature(handle: int, sensor: int) -> int:
    if sensor != NVML_TEMPERATURE_GPU:
        raise NVMLError(2)
    return _dev(handle).temp_c


def nvmlDeviceGetPowerUsage(handle: int) -> int:
    d = _dev(handle)
    if "power" in NOT_SUPPORTED:
        raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
    return d.power_mw
