"""Where simulated events go: the gateway's recorders, so metrics and spool lines are identical
to real traffic (same metric families, same label guard, same spool format)."""

from __future__ import annotations

from pathlib import Path

from prometheus_client import CollectorRegistry

from llmsla import names
from llmsla.config import Config
from llmsla.events import GpuSample, RequestEvent
from llmsla.exporters.recorder import GpuRecorder, RequestRecorder
from llmsla.seams import MetricsSink
from llmsla.spool import SpoolWriter


class RecorderSink:
    """RequestRecorder + GpuRecorder writing to ``spool_dir`` (default ``cfg.spool_dir()``).

    Writers publish by size and by ``spool.segment_max_age_s`` like the gateway's, so a live
    streaming job picks simulated events up while the simulation runs.
    """

    def __init__(self, cfg: Config, *, spool_dir: str | Path | None = None,
                 registry: CollectorRegistry | None = None, validate: bool = True) -> None:
        root = Path(spool_dir) if spool_dir else cfg.spool_dir()
        self.root = root
        self.registry = registry if registry is not None else CollectorRegistry()
        self.req_spool = SpoolWriter.from_config(cfg, names.SPOOL_REQUESTS, root=root, registry=self.registry)
        self.gpu_spool = SpoolWriter.from_config(cfg, names.SPOOL_GPU, root=root, registry=self.registry)
        self.requests: MetricsSink = RequestRecorder(cfg, registry=self.registry, spool=self.req_spool)
        self.gpus = GpuRecorder(cfg, registry=self.registry, spool=self.gpu_spool)
        self.validate = validate
        self.n_requests = 0
        self.n_gpu = 0

    def request(self, event: RequestEvent) -> None:
        self.requests.record(event, validate=self.validate)
        self.n_requests += 1

    def gpu(self, sample: GpuSample, model_name: str) -> None:
        self.gpus.record(sample, model_name=model_name)
        self.n_gpu += 1

    def close(self) -> None:
        self.req_spool.close()
        self.gpu_spool.close()

    def __enter__(self) -> RecorderSink:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
