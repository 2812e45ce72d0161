"""GPU collector against the NVML shim (tests/exporters/fake_nvml.py) and the real pynvml."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from llmsla import config as config_mod
from llmsla import names
from llmsla.exporters import gpu as gpu_mod
from llmsla.spool import SpoolWriter, published_segments, read_segment

from . import fake_nvml


@pytest.fixture()
def nvml():
    fake_nvml.reset([
        fake_nvml.Device(uuid="GPU-aaaa", used=10 << 30, total=80 << 30, util_pct=42, temp_c=55, power_mw=250_500),
        fake_nvml.Device(name=b"NVIDIA A100-SXM4-40GB", uuid="GPU-bbbb", used=1 << 30, total=40 << 30,
                         util_pct=100, temp_c=71, power_mw=400_000),
    ])
    yield fake_nvml
    fake_nvml.reset()


def _cfg(tmp_path: Path) -> config_mod.Config:
    c = config_mod.load(env={})
    c.spool.dir = str(tmp_path / "spool")
    c.gpu.node = "node-a"
    return c


def _samples_text(reg: CollectorRegistry) -> str:
    return generate_latest(reg).decode()


def test_samples_gauges_and_spool(tmp_path: Path, nvml) -> None:
    cfg = _cfg(tmp_path)
    reg = CollectorRegistry()
    spool = SpoolWriter(cfg.spool_dir(), names.SPOOL_GPU, background=False)
    col = gpu_mod.GpuCollector(cfg, registry=reg, spool=spool, nvml=nvml)
    assert col.start()
    samples = col.sample()
    col.close()
    spool.close()
    assert nvml.shutdowns == 1
    g = reg.get_sample_value
    a = {"gpu": "0", "uuid": "GPU-aaaa", "model_name": "NVIDIA H100 80GB HBM3"}
    b = {"gpu": "1", "uuid": "GPU-bbbb", "model_name": "NVIDIA A100-SXM4-40GB"}  # bytes name decoded
    assert g(names.GPU_MEMORY_USED_BYTES, a) == 10 << 30
    assert g(names.GPU_MEMORY_TOTAL_BYTES, a) == 80 << 30
    assert g(names.GPU_MEMORY_FREE_BYTES, a) == (70 << 30) - nvml.DEVICES[0].reserved  # NVML's: reservation not free
    assert g(names.GPU_UTILIZATION_RATIO, a) == 0.42
    assert g(names.GPU_TEMPERATURE_CELSIUS, a) == 55
    assert g(names.GPU_POWER_WATTS, a) == 250.5
    assert g(names.GPU_UTILIZATION_RATIO, b) == 1.0
    assert g(names.GPU_COLLECTOR_UP, {"reason": ""}) == 1
    spooled = [e for seg in published_segments(cfg.spool_dir(), names.SPOOL_GPU)
               for e in read_segment(seg, names.SPOOL_GPU)]
    assert spooled == samples
    assert [(s.node, s.gpu, s.uuid, s.mem_used_bytes) for s in samples] == [
        ("node-a", 0, "GPU-aaaa", 10 << 30), ("node-a", 1, "GPU-bbbb", 1 << 30)]


def test_memory_as_dcgm_reads_it_and_the_calls_a_driver_lacks(tmp_path: Path, nvml) -> None:
    """Used memory leaves the driver's reservation out (nvmlDeviceGetMemoryInfo_v2, what
    DCGM_FI_DEV_FB_USED reads) and the temperature comes from nvmlDeviceGetTemperatureV; a driver
    without either is read with the older call (v1's used includes the reservation)."""
    old = fake_nvml.Device(uuid="GPU-old", used=4 << 30, reserved=512 << 20, temp_c=61,
                           unsupported={"memory_v2", "temperature_v"})
    nvml.DEVICES.append(old)
    reg = CollectorRegistry()
    col = gpu_mod.GpuCollector(_cfg(tmp_path), registry=reg, nvml=nvml)
    assert col.start()
    samples = {s.uuid: s for s in col.sample()}
    col.close()
    assert nvml.DEVICES[0].reserved > 0 and samples["GPU-aaaa"].mem_used_bytes == 10 << 30  # v2: reservation out
    for uuid, d in (("GPU-aaaa", nvml.DEVICES[0]), ("GPU-old", old)):  # free is NVML's: the reservation is neither
        assert reg.get_sample_value(names.GPU_MEMORY_FREE_BYTES, {"uuid": uuid, "gpu": str(nvml.DEVICES.index(d)),
                                                                  "model_name": d.name}) == d.total - d.used - d.reserved
    assert (samples["GPU-aaaa"].temp_c, samples["GPU-bbbb"].temp_c) == (55, 71)
    assert samples["GPU-old"].mem_used_bytes == (4 << 30) + (512 << 20)  # v1: reservation in
    assert samples["GPU-old"].temp_c == 61


def test_unsupported_fields_and_lost_gpu(tmp_path: Path, nvml) -> None:
    cfg = _cfg(tmp_path)
    reg = CollectorRegistry()
    col = gpu_mod.GpuCollector(cfg, registry=reg, nvml=nvml)
    assert col.start()
    nvml.NOT_SUPPORTED.update({"power", "util"})
    nvml.FAIL_SAMPLE.add(1)
    samples = col.sample()
    assert [s.gpu for s in samples] == [0]  # GPU 1 is lost; GPU 0 still reported
    assert samples[0].power_w == 0.0 and samples[0].util == 0.0
    assert reg.get_sample_value(names.GPU_COLLECTOR_UP, {"reason": gpu_mod.REASON_SAMPLE_FAILED}) == 0
    assert reg.get_sample_value(names.GPU_COLLECTOR_UP, {"reason": ""}) is None
    nvml.FAIL_SAMPLE.clear()
    assert len(col.sample()) == 2
    assert reg.get_sample_value(names.GPU_COLLECTOR_UP, {"reason": ""}) == 1
    col.close()


@pytest.mark.parametrize(("code", "reason"), [
    (fake_nvml.NVML_ERROR_LIBRARY_NOT_FOUND, gpu_mod.REASON_LIBRARY_NOT_FOUND),
    (fake_nvml.NVML_ERROR_DRIVER_NOT_LOADED, gpu_mod.REASON_DRIVER_NOT_LOADED),
    (fake_nvml.NVML_ERROR_NO_PERMISSION, gpu_mod.REASON_NO_PERMISSION),
    (999, gpu_mod.REASON_INIT_FAILED),
])
def test_without_nvml_only_up_zero_is_exported(tmp_path: Path, nvml, code: int, reason: str) -> None:
    nvml.FAIL_INIT = code
    reg = CollectorRegistry()
    col = gpu_mod.GpuCollector(_cfg(tmp_path), registry=reg, nvml=nvml)
    assert not col.start()
    assert col.sample() == []
    text = _samples_text(reg)
    lines = [ln for ln in text.splitlines() if ln and not ln.startswith("#")]
    assert lines == [f'{names.GPU_COLLECTOR_UP}{{reason="{reason}"}} 0.0']
    assert names.GPU_MEMORY_USED_BYTES not in text  # not even HELP/TYPE of device series


def test_module_missing_and_real_pynvml_on_this_host(tmp_path: Path) -> None:
    reg = CollectorRegistry()
    col = gpu_mod.GpuCollector(_cfg(tmp_path), registry=reg, nvml=None)
    assert not col.start()
    assert reg.get_sample_value(names.GPU_COLLECTOR_UP, {"reason": gpu_mod.REASON_MODULE_MISSING}) == 0
    # the real nvidia-ml-py: this CI host has no GPU driver, so the collector reports why
    reg2 = CollectorRegistry()
    real = gpu_mod.GpuCollector(_cfg(tmp_path), registry=reg2)
    if real.start():  # a GPU host: samples are real and consistent
        s = real.sample()
        real.close()
        assert s and all(x.mem_used_bytes <= x.mem_total_bytes for x in s)
    else:
        assert real.reason in (gpu_mod.REASON_LIBRARY_NOT_FOUND, gpu_mod.REASON_DRIVER_NOT_LOADED,
                               gpu_mod.REASON_NO_PERMISSION, gpu_mod.REASON_INIT_FAILED)
        assert reg2.get_sample_value(names.GPU_COLLECTOR_UP, {"reason": real.reason}) == 0


def test_run_loop_samples_periodically(tmp_path: Path, nvml) -> None:
    cfg = _cfg(tmp_path)
    cfg.gpu.interval_s = 0.1
    reg = CollectorRegistry()
    col = gpu_mod.GpuCollector(cfg, registry=reg, nvml=nvml)

    async def main() -> None:
        stop = asyncio.Event()
        task = asyncio.create_task(col.run(stop))
        await asyncio.sleep(0.35)
        nvml.DEVICES[0].temp_c = 80
        await asyncio.sleep(0.25)
        stop.set()
        await task

    asyncio.run(main())
    lbl = {"gpu": "0", "uuid": "GPU-aaaa", "model_name": "NVIDIA H100 80GB HBM3"}
    assert reg.get_sample_value(names.GPU_TEMPERATURE_CELSIUS, lbl) == 80
    assert nvml.shutdowns == 1


def test_cli_serves_healthz_and_metrics(tmp_path: Path) -> None:
    """`llmsla gpu` as deployed (deploy/k8s probes /healthz): both endpoints answer, on a host
    with or without NVML."""
    import os
    import signal
    import subprocess
    import sys
    import urllib.request

    from llmsla import services

    port = services.free_port()
    env = {**os.environ, "LLMSLA_SPOOL_DIR": str(tmp_path / "spool")}
    proc = subprocess.Popen([sys.executable, "-m", "llmsla", "gpu", "--port", str(port)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        services.wait_http(f"http://127.0.0.1:{port}/healthz", proc=proc, timeout_s=60)
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=5) as resp:
            assert b'"status": "ok"' in resp.read()
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
            assert names.GPU_COLLECTOR_UP.encode() in resp.read()
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)
