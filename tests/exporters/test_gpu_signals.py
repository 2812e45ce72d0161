"""GPU health signals at dcgm-exporter parity: clocks, throttle reasons, ECC, remapped rows, PCIe,
NVLink and XIDs, against the NVML shim (tests/exporters/fake_nvml.py), read back from the
collector's own /metrics over HTTP."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from pathlib import Path

import aiohttp
import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from llmsla import config as config_mod
from llmsla import names
from llmsla.exporters import gpu as gpu_mod
from llmsla.exporters import gpu_signals
from llmsla.httpkit import Limits, serve_exporter
from llmsla.services import free_port

from . import fake_nvml

H100 = {"gpu": "0", "uuid": "GPU-aaaa", "model_name": "NVIDIA H100 80GB HBM3"}
A100 = {"gpu": "1", "uuid": "GPU-bbbb", "model_name": "NVIDIA A100-SXM4-40GB"}


@pytest.fixture()
def nvml():
    fake_nvml.reset([
        fake_nvml.Device(uuid="GPU-aaaa", clock_reasons=0x4 | 0x8 | 0x1000),  # power cap, HW slowdown, unnamed
        fake_nvml.Device(name="NVIDIA A100-SXM4-40GB", uuid="GPU-bbbb", sm_clock_mhz=1410, mem_clock_mhz=1215,
                         pcie_tx_kbps=7, pcie_rx_kbps=9, remapped_rows=(0, 3, 1, 1)),
    ])
    yield fake_nvml
    fake_nvml.reset()


def _cfg(tmp_path: Path) -> config_mod.Config:
    c = config_mod.load(env={})
    c.spool.dir = str(tmp_path / "spool")
    c.gpu.node = "node-a"
    c.gpu.interval_s = 0.05
    return c


def _scraped(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for fam in text_string_to_metric_families(text) for s in fam.samples}


def _get(samples: dict, name: str, labels: dict[str, str]) -> float | None:
    return samples.get((name, tuple(sorted(labels.items()))))


def _wait(cond, timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.01)


def test_every_signal_on_the_collectors_metrics_over_http(tmp_path: Path, nvml) -> None:
    """The collector as ``llmsla gpu`` serves it (serve_exporter + run loop), scraped over HTTP;
    an XID the driver reports meanwhile is counted by code."""
    cfg = _cfg(tmp_path)
    reg = CollectorRegistry()
    col = gpu_mod.GpuCollector(cfg, registry=reg, nvml=nvml)
    port = free_port()

    async def main() -> str:
        async def run(stop: asyncio.Event) -> None:
            task = asyncio.create_task(col.run(stop))
            try:
                await asyncio.to_thread(_wait, lambda: fake_nvml.waits > 0)  # the XID thread waits
                nvml.emit_xid(1, 79)
                nvml.emit_xid(1, 79)
                nvml.emit_xid(0, 13)
                await asyncio.to_thread(_wait, lambda: reg.get_sample_value(
                    f"{names.GPU_XID_ERRORS}_total", {**A100, "xid": "79"}) == 2)
                async with aiohttp.ClientSession() as s, s.get(f"http://127.0.0.1:{port}/metrics") as r:
                    assert r.status == 200
                    body = await r.text()
            finally:
                stop.set()
                await task
            return body

        box: list[str] = []

        async def keep(stop: asyncio.Event) -> None:
            box.append(await run(stop))

        await serve_exporter(reg, "127.0.0.1", port, Limits.from_config(cfg), keep, banner=lambda url: url)
        return box[0]

    m = _scraped(asyncio.run(main()))
    assert _get(m, names.GPU_SM_CLOCK_HERTZ, H100) == 1980e6
    assert _get(m, names.GPU_MEMORY_CLOCK_HERTZ, H100) == 2619e6
    assert _get(m, names.GPU_SM_CLOCK_HERTZ, A100) == 1410e6
    active = {dict(lbl)["reason"] for (n, lbl), v in m.items()
              if n == names.GPU_CLOCK_THROTTLE_REASON and dict(lbl)["gpu"] == "0" and v == 1}
    assert active == {"sw_power_cap", "hw_slowdown", "other"}
    assert _get(m, names.GPU_CLOCK_THROTTLE_REASON, {**H100, "reason": "hw_thermal_slowdown"}) == 0
    assert _get(m, names.GPU_CLOCK_THROTTLE_REASON, {**A100, "reason": "sw_power_cap"}) == 0
    ecc = f"{names.GPU_ECC_ERRORS}_total"
    assert _get(m, ecc, {**H100, "error": "corrected", "counter": "volatile"}) == 3
    assert _get(m, ecc, {**H100, "error": "uncorrected", "counter": "volatile"}) == 0
    assert _get(m, ecc, {**H100, "error": "corrected", "counter": "aggregate"}) == 12
    assert _get(m, ecc, {**H100, "error": "uncorrected", "counter": "aggregate"}) == 1
    rows = f"{names.GPU_REMAPPED_ROWS}_total"
    assert _get(m, rows, {**H100, "error": "correctable"}) == 2
    assert _get(m, rows, {**A100, "error": "uncorrectable"}) == 3
    assert (_get(m, names.GPU_ROW_REMAP_PENDING, H100), _get(m, names.GPU_ROW_REMAP_FAILED, H100)) == (0, 0)
    assert (_get(m, names.GPU_ROW_REMAP_PENDING, A100), _get(m, names.GPU_ROW_REMAP_FAILED, A100)) == (1, 1)
    assert _get(m, names.GPU_PCIE_THROUGHPUT_BYTES, {**H100, "direction": "tx"}) == 1000 * 1024
    assert _get(m, names.GPU_PCIE_THROUGHPUT_BYTES, {**A100, "direction": "rx"}) == 9 * 1024
    assert _get(m, f"{names.GPU_PCIE_REPLAYS}_total", H100) == 4
    assert _get(m, f"{names.GPU_NVLINK_BYTES}_total", {**H100, "direction": "tx"}) == 100 * 1024
    assert _get(m, f"{names.GPU_NVLINK_BYTES}_total", {**H100, "direction": "rx"}) == 200 * 1024
    nvl = f"{names.GPU_NVLINK_ERRORS}_total"
    assert {e: _get(m, nvl, {**H100, "error": e}) for e in ("crc_flit", "crc_data", "replay", "recovery")} == {
        "crc_flit": 1, "crc_data": 0, "replay": 2, "recovery": 0}
    xid = f"{names.GPU_XID_ERRORS}_total"
    assert _get(m, xid, {**A100, "xid": "79"}) == 2
    assert _get(m, xid, {**H100, "xid": "13"}) == 1
    assert _get(m, names.GPU_COLLECTOR_UP, {"reason": ""}) == 1
    # the event set was freed before NVML shut down
    assert nvml.EVENT_SETS and all(es.freed for es in nvml.EVENT_SETS) and nvml.shutdowns == 1


ALL_SIGNALS = {"clocks", "clock_event_reasons", "clock_throttle_reasons", "ecc", "remapped_rows", "pcie",
               "pcie_replay", "nvlink", "xid"}
SIGNAL_SERIES = (names.GPU_SM_CLOCK_HERTZ, names.GPU_MEMORY_CLOCK_HERTZ, names.GPU_CLOCK_THROTTLE_REASON,
                 f"{names.GPU_ECC_ERRORS}_total", f"{names.GPU_REMAPPED_ROWS}_total", names.GPU_ROW_REMAP_PENDING,
                 names.GPU_ROW_REMAP_FAILED, names.GPU_PCIE_THROUGHPUT_BYTES, f"{names.GPU_PCIE_REPLAYS}_total",
                 f"{names.GPU_NVLINK_BYTES}_total", f"{names.GPU_NVLINK_ERRORS}_total", f"{names.GPU_XID_ERRORS}_total")


def _series_of(reg: CollectorRegistry, gpu: str) -> set[str]:
    return {s.name for fam in reg.collect() for s in fam.samples if s.labels.get("gpu") == gpu}


def test_unsupported_signals_are_absent_not_zero_and_logged_once(tmp_path: Path, nvml, caplog) -> None:
    nvml.DEVICES[1].unsupported |= ALL_SIGNALS
    reg = CollectorRegistry()
    col = gpu_mod.GpuCollector(_cfg(tmp_path), registry=reg, nvml=nvml)
    with caplog.at_level(logging.INFO, logger="llmsla.exporters"):
        assert col.start()
        try:
            nvml.emit_xid(1, 79)  # not registered for GPU 1: never delivered
            for _ in range(3):
                assert len(col.sample()) == 2
        finally:
            col.close()
    assert set(SIGNAL_SERIES) - {f"{names.GPU_XID_ERRORS}_total"} <= _series_of(reg, "0")
    assert _series_of(reg, "1") & set(SIGNAL_SERIES) == set()  # no series at all, not zeros
    assert reg.get_sample_value(names.GPU_MEMORY_USED_BYTES, A100) == nvml.DEVICES[1].used  # the basics still are
    lines = [r.getMessage() for r in caplog.records if "not supported, left out" in r.getMessage()]
    assert len(lines) == 1 and lines[0].startswith("GPU 1 (GPU-bbbb): 17 signal(s) not supported")
    for name in ("sm_clock", "clock_throttle_reasons", "ecc.uncorrected.aggregate", "remapped_rows",
                 "pcie_throughput.rx", "pcie_replays", "nvlink_bytes.tx", "nvlink_errors.recovery"):
        assert name in lines[0]
    assert any("XID events: not watched on GPU 1 (not supported)" in r.getMessage() for r in caplog.records)


def test_one_nvlink_field_unsupported_leaves_the_others(tmp_path: Path, nvml) -> None:
    """nvmlDeviceGetFieldValues answers per field: a board without NVLink throughput still
    reports its error counters (and the other way round)."""
    del nvml.DEVICES[0].fields[139]
    reg = CollectorRegistry()
    col = gpu_mod.GpuCollector(_cfg(tmp_path), registry=reg, nvml=nvml)
    assert col.start()
    col.sample()
    col.close()
    assert reg.get_sample_value(f"{names.GPU_NVLINK_BYTES}_total", {**H100, "direction": "rx"}) is None
    assert reg.get_sample_value(f"{names.GPU_NVLINK_BYTES}_total", {**H100, "direction": "tx"}) == 100 * 1024
    assert reg.get_sample_value(f"{names.GPU_NVLINK_ERRORS}_total", {**H100, "error": "replay"}) == 2


def test_throttle_reasons_fall_back_to_the_older_call(tmp_path: Path, nvml) -> None:
    """Drivers before nvmlDeviceGetCurrentClocksEventReasons answer the ...ThrottleReasons call."""
    nvml.DEVICES[0].unsupported.add("clock_event_reasons")
    nvml.DEVICES[0].clock_reasons = 0x40  # HW thermal slowdown
    reg = CollectorRegistry()
    col = gpu_mod.GpuCollector(_cfg(tmp_path), registry=reg, nvml=nvml)
    assert col.start()
    col.sample()
    col.close()
    g = reg.get_sample_value
    assert g(names.GPU_CLOCK_THROTTLE_REASON, {**H100, "reason": "hw_thermal_slowdown"}) == 1
    assert g(names.GPU_CLOCK_THROTTLE_REASON, {**H100, "reason": "sw_power_cap"}) == 0


def test_counters_follow_nvml_and_survive_a_reset(tmp_path: Path, nvml) -> None:
    reg = CollectorRegistry()
    col = gpu_mod.GpuCollector(_cfg(tmp_path), registry=reg, nvml=nvml)
    assert col.start()
    lbl = {**H100, "error": "corrected", "counter": "volatile"}
    name = f"{names.GPU_ECC_ERRORS}_total"
    col.sample()
    assert reg.get_sample_value(name, lbl) == 3
    nvml.DEVICES[0].ecc[(0, 0)] = 5
    nvml.DEVICES[0].pcie_replay = 10
    col.sample()
    assert reg.get_sample_value(name, lbl) == 5
    assert reg.get_sample_value(f"{names.GPU_PCIE_REPLAYS}_total", H100) == 10
    nvml.DEVICES[0].ecc[(0, 0)] = 1  # driver reloaded: the volatile count restarts
    col.sample()
    assert reg.get_sample_value(name, lbl) == 6  # never goes down: 5, then 1 more
    col.close()


def test_a_gpu_that_raises_mid_scrape_does_not_stop_the_others(tmp_path: Path, nvml, caplog) -> None:
    reg = CollectorRegistry()
    col = gpu_mod.GpuCollector(_cfg(tmp_path), registry=reg, nvml=nvml)
    assert col.start()
    col.sample()
    assert reg.get_sample_value(names.GPU_PCIE_THROUGHPUT_BYTES, {**A100, "direction": "tx"}) == 7 * 1024
    nvml.DEVICES[0].raises["ecc"] = fake_nvml.NVML_ERROR_GPU_IS_LOST  # falls off the bus mid-way
    nvml.DEVICES[1].raises["pcie"] = 999  # one call broken, the rest of the GPU fine
    with caplog.at_level(logging.WARNING, logger="llmsla.exporters"):
        samples = col.sample()
        col.sample()
    assert [s.gpu for s in samples] == [1]
    assert reg.get_sample_value(names.GPU_COLLECTOR_UP, {"reason": gpu_mod.REASON_SAMPLE_FAILED}) == 0
    g = reg.get_sample_value
    assert g(names.GPU_PCIE_THROUGHPUT_BYTES, {**A100, "direction": "tx"}) is None  # dropped, not stale
    assert g(names.GPU_SM_CLOCK_HERTZ, A100) == 1410e6
    assert g(f"{names.GPU_PCIE_REPLAYS}_total", A100) == 4
    failing = [r.getMessage() for r in caplog.records if "could not be read" in r.getMessage()]
    assert len(failing) == 2  # tx and rx, once each over two rounds
    nvml.DEVICES[0].raises.clear()
    assert len(col.sample()) == 2
    assert reg.get_sample_value(names.GPU_COLLECTOR_UP, {"reason": ""}) == 1
    col.close()


def test_xid_watcher_survives_wait_errors_and_stops_promptly(tmp_path: Path, nvml) -> None:
    reg = CollectorRegistry()
    col = gpu_mod.GpuCollector(_cfg(tmp_path), registry=reg, nvml=nvml)
    assert col.start()
    assert col.xid is not None and col.xid.watched == [0, 1]
    _wait(lambda: fake_nvml.waits > 0)
    nvml.emit_xid(0, 48)
    name = f"{names.GPU_XID_ERRORS}_total"
    _wait(lambda: reg.get_sample_value(name, {**H100, "xid": "48"}) == 1)  # before any sample: uuid looked up
    t0 = time.monotonic()
    col.close()
    assert time.monotonic() - t0 < 2.0
    assert nvml.EVENT_SETS[0].freed


def test_throttle_reason_bits_are_pynvmls() -> None:
    """The reason table is NVML's bitmask, checked against the real nvidia-ml-py constants."""
    import pynvml  # nvidia-ml-py: in the gpu extra, installed by the dev setup
    for bit, name in gpu_signals.THROTTLE_REASONS:
        camel = "".join(p.capitalize() for p in name.split("_"))  # sw_power_cap -> SwPowerCap
        assert getattr(pynvml, f"nvmlClocksThrottleReason{camel}") == bit, name
    assert gpu_signals.throttle_reasons(0x4 | 0x800)["sw_power_cap"] == 1
    assert gpu_signals.throttle_reasons(0x800)[gpu_signals.THROTTLE_OTHER] == 1
    assert pynvml.nvmlEventTypeXidCriticalError == 0x8
    fields = {f"THROUGHPUT_DATA_{d.upper()}": fid for fid, d in gpu_signals.NVLINK_BYTES_FIELDS}
    fields |= {f"{e.upper()}_ERROR_COUNT_TOTAL": fid for fid, e in gpu_signals.NVLINK_ERROR_FIELDS}
    for suffix, fid in fields.items():
        assert getattr(pynvml, f"NVML_FI_DEV_NVLINK_{suffix}") == fid, suffix
    assert (pynvml.NVML_CLOCK_SM, pynvml.NVML_CLOCK_MEM) == (fake_nvml.NVML_CLOCK_SM, fake_nvml.NVML_CLOCK_MEM)


def test_once_json_names_each_signal_and_what_is_missing(tmp_path: Path, nvml) -> None:
    """What ``llmsla gpu --once`` prints beside the samples: the check to run on a GPU node."""
    nvml.DEVICES[1].unsupported |= {"ecc", "nvlink"}
    col = gpu_mod.GpuCollector(_cfg(tmp_path), registry=CollectorRegistry(), nvml=nvml)
    assert col.start()
    col.sample()
    col.close()
    h100, a100 = col.last_signals[0].to_dict(), col.last_signals[1].to_dict()
    assert h100["sm_clock_hz"] == 1980e6 and h100["throttle_reasons"] == ["hw_slowdown", "other", "sw_power_cap"]
    assert h100["ecc"] == {"corrected.volatile": 3, "corrected.aggregate": 12, "uncorrected.volatile": 0,
                           "uncorrected.aggregate": 1}
    assert h100["nvlink_bytes"] == {"tx": 100 * 1024, "rx": 200 * 1024} and "unsupported" not in h100
    assert "ecc" not in a100 and "nvlink_errors" not in a100
    assert "ecc.corrected.volatile" in a100["unsupported"] and "nvlink_bytes.tx" in a100["unsupported"]
    assert json.loads(json.dumps(a100)) == a100
