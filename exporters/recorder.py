"""Finished requests and GPU samples -> Prometheus metrics + one spool line each.

The gateway, the ASGI middleware and the fleet simulator all end a request by handing a
``RequestEvent`` to :class:`RequestRecorder`, so simulated and real traffic produce identical
series and identical spool records downstream (Flink windows, dashboards, forecasts).
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import replace

from prometheus_client import CollectorRegistry

from llmsla import names
from llmsla.config import Config
from llmsla.events import GpuSample, ItlSummary, RequestEvent
from llmsla.exporters.metrics import gpu_metrics, request_metrics
from llmsla.seams import EventSink


class RequestRecorder:
    """One place that turns a finished request into metrics + a spool line, so simulated and
    real traffic look identical downstream."""

    def __init__(self, cfg: Config, *, registry: CollectorRegistry | None = None,
                 spool: EventSink | None = None) -> None:
        self.metrics = request_metrics(cfg, registry)
        self.spool = spool
        self.recorded = 0

    def record(self, event: RequestEvent, *, itl_gaps_ms: Sequence[float] | None = None,
               validate: bool = True, first_token: bool = True, admit: bool | None = None) -> None:
        """Validate ``event`` (an invalid one raises ``EventError`` and counts nowhere), update
        the metrics, append it to the spool.

        ``itl_gaps_ms``: the raw inter-chunk gaps when the caller has them (the gateway), so the
        histogram sees each gap; without them the event's summary is used (simulator).
        ``first_token``: a first token was seen; False for a non-streamed response, whose event
        still carries TTFT = E2E (the event contract wants a TTFT on every ok request with
        output) but which makes no TTFT observation. ``admit``: see ``RequestMetrics.observe``.
        ``validate=False`` is for callers that built the event from already-checked values.
        """
        if validate:
            event.validate()
        itl = event.itl_ms
        model = self.metrics.observe(
            model=event.model, pool=event.pool, replica=event.replica, arm=event.arm,
            tenant=event.tenant, class_=event.class_, status=event.status, queue_s=event.queue_ms / 1000.0,
            ttft_s=None if event.ttft_ms is None or not first_token else event.ttft_ms / 1000.0,
            e2e_s=event.e2e_ms / 1000.0, prompt_tokens=event.prompt_tokens,
            output_tokens=event.output_tokens,
            itl_gaps_s=[g / 1000.0 for g in itl_gaps_ms] if itl_gaps_ms else (),
            itl_mean_s=itl.mean / 1000.0, itl_n=0 if itl_gaps_ms else itl.n, admit=admit,
        )
        self.recorded += 1
        if self.spool is not None:
            if model != event.model:
                event = replace(event, model=model)
            self.spool.write_line(event.to_json())


class GpuRecorder:
    """One GPU sample -> the NVML gauges (labels gpu, uuid, model_name) + a spool line."""

    def __init__(self, cfg: Config, *, registry: CollectorRegistry | None = None,
                 spool: EventSink | None = None) -> None:
        self.cfg = cfg
        self.metrics = gpu_metrics(registry)
        self.spool = spool

    def record(self, sample: GpuSample, *, model_name: str = "", free_bytes: int | None = None) -> None:
        """``free_bytes``: NVML's own free memory where the collector read it (the driver's
        reservation is neither used nor free there, as in DCGM's ``FB_FREE``); else total - used."""
        sample.validate()
        m = self.metrics
        labels = (str(sample.gpu), sample.uuid, model_name)
        m.mem_used.labels(*labels).set(sample.mem_used_bytes)
        m.mem_total.labels(*labels).set(sample.mem_total_bytes)
        m.mem_free.labels(*labels).set(sample.mem_total_bytes - sample.mem_used_bytes if free_bytes is None
                                       else free_bytes)
        m.util.labels(*labels).set(sample.util)
        m.temp.labels(*labels).set(sample.temp_c)
        m.power.labels(*labels).set(sample.power_w)
        if self.spool is not None:
            self.spool.write_line(sample.to_json())


#: A chunk that may carry usage / the worker extension / an error / a finish reason is decoded in
#: full; the per-token chunks in between (``"finish_reason":null``) are classified by these two
#: searches (a JSON decode per token was the largest Python cost of proxying a stream).
_TAIL_KEYS = re.compile(rb'"(?:usage|llmsla|error)"\s*:\s*[{\[]|"finish_reason"\s*:\s*"')
_NON_EMPTY_TEXT = re.compile(rb'"(?:text|content)"\s*:\s*"(?!")')
#: Finish reasons kept per request (one per choice; bounds what a broken upstream can make us hold).
_MAX_FINISH_REASONS = 16


def _token_count(obj: dict) -> int:
    """Tokens carried by one OpenAI stream chunk (completions ``text`` or chat ``delta``)."""
    n = 0
    for choice in obj.get("choices") or ():
        if not isinstance(choice, dict):
            continue
        text = choice.get("text")
        if text is None:
            delta = choice.get("delta")
            text = delta.get("content") if isinstance(delta, dict) else None
        if text:
            n += 1
    return n


class StreamTimer:
    """Times one proxied request from the bytes the upstream sends back.

    Shared by the gateway and the ASGI middleware so both measure the same way: ``arrival`` and
    ``dispatch`` are ``perf_counter`` stamps; :meth:`feed` takes raw response bytes as they
    arrive (SSE or a JSON body), stamps the first token-carrying chunk (TTFT) and the gaps
    between token chunks (ITL), and keeps ``usage`` and the worker's ``llmsla`` extension from
    the last chunk. Chunks may split SSE lines anywhere; a partial line is buffered. From the
    chunks it decodes anyway it also keeps what a GenAI span reports: the response's ``model``
    and ``id`` and each choice's ``finish_reason``.
    """

    __slots__ = ("arrival", "dispatch", "first_token", "last_token", "gaps_ms", "chunks_with_tokens",
                 "usage", "ext", "_buf", "streaming", "_body", "model", "response_id", "finish_reasons", "ended")

    def __init__(self, arrival: float, *, streaming: bool) -> None:
        self.arrival = arrival
        self.dispatch: float | None = None
        self.first_token: float | None = None
        self.last_token: float | None = None
        self.gaps_ms: list[float] = []
        self.chunks_with_tokens = 0
        self.usage: dict | None = None
        self.ext: dict | None = None
        self.model: str | None = None
        self.response_id: str | None = None
        self.finish_reasons: list[str] = []
        #: the stream's ``data: [DONE]`` has been fed: a client that has it has the whole answer
        #: (OpenAI's SDK closes the connection there, before the chunked body's end)
        self.ended = False
        self.streaming = streaming
        self._buf = b""
        self._body: list[bytes] = []

    def feed(self, data: bytes, now: float) -> None:
        if not self.streaming:
            self._body.append(data)
            return
        # the common case: the upstream flushed exactly one event, ``data: {...}\n\n``
        if not self._buf and data.startswith(b"data:") and data.endswith(b"\n\n") and data.count(b"\n") == 2:
            self._data(data[5:-2].strip(), now)
            return
        buf = self._buf + data if self._buf else data
        start = 0
        while True:
            nl = buf.find(b"\n", start)
            if nl < 0:
                break
            line = buf[start:nl]
            start = nl + 1
            if line.startswith(b"data:"):
                self._data(line[5:].strip(), now)
        self._buf = buf[start:]

    def _data(self, payload: bytes, now: float) -> None:
        if not payload:
            return
        if payload == b"[DONE]":
            self.ended = True
            return
        if _TAIL_KEYS.search(payload) is None:  # the common per-token chunk: no JSON decode
            if _NON_EMPTY_TEXT.search(payload) is not None:
                self._token(now)
            return
        try:
            obj = json.loads(payload)
        except ValueError:
            return
        if not isinstance(obj, dict):
            return
        if _token_count(obj):
            self._token(now)
        self._keep(obj)

    def _keep(self, obj: dict) -> None:
        """usage, the worker extension, model, id and finish reasons of a decoded chunk/body."""
        usage = obj.get("usage")
        if isinstance(usage, dict):
            self.usage = usage
        ext = obj.get("llmsla")
        if isinstance(ext, dict):
            self.ext = ext
        model, rid = obj.get("model"), obj.get("id")
        if isinstance(model, str):
            self.model = model
        if isinstance(rid, str):
            self.response_id = rid
        choices = obj.get("choices")
        if isinstance(choices, list):
            reasons = self.finish_reasons
            for choice in choices:
                reason = choice.get("finish_reason") if isinstance(choice, dict) else None
                if isinstance(reason, str) and len(reasons) < _MAX_FINISH_REASONS:
                    reasons.append(reason)

    def _token(self, now: float) -> None:
        self.chunks_with_tokens += 1
        if self.first_token is None:
            self.first_token = now
        else:
            self.gaps_ms.append((now - self.last_token) * 1000.0)  # type: ignore[operator]  # set with first_token; per token: no check
        self.last_token = now

    def finish_body(self, now: float) -> None:
        """Non-streaming: the whole body arrived at ``now``. No first-token time is known (the
        replica sent nothing until it was done), so ``first_token`` stays None and no TTFT is
        observed; the event's TTFT is E2E (:meth:`event`), as its contract asks."""
        if self.streaming:
            return
        try:
            obj = json.loads(b"".join(self._body))
        except ValueError:
            return
        if not isinstance(obj, dict):
            return
        self._keep(obj)
        if _token_count(obj) or (self.usage or {}).get("completion_tokens"):
            self.chunks_with_tokens = 1

    def reported_usage(self) -> tuple[int | None, int | None]:
        """``(prompt, completion)`` tokens as the upstream's ``usage`` reported them (None for
        each it did not): the only counts the GenAI conventions' ``gen_ai.usage.*`` may carry."""
        u = self.usage or {}
        prompt, output = u.get("prompt_tokens"), u.get("completion_tokens")
        ok = [isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in (prompt, output)]
        return (prompt if ok[0] else None), (output if ok[1] else None)

    def tokens(self, prompt_estimate: int) -> tuple[int, int]:
        """``(prompt, output)``: from ``usage`` when the upstream sent it, else counted."""
        u = self.usage or {}
        prompt, output = u.get("prompt_tokens"), u.get("completion_tokens")
        if not isinstance(prompt, int) or isinstance(prompt, bool) or prompt < 0:
            prompt = prompt_estimate
        if not isinstance(output, int) or isinstance(output, bool) or output < 0:
            output = self.chunks_with_tokens
        return prompt, output

    def event(self, *, end: float, ts_ms: int, trace_id: str, model: str, pool: str, replica: str,
              arm: str, policy: str, status: str, prompt_estimate: int, tenant: str = names.DEFAULT_TENANT,
              class_: str = names.DEFAULT_CLASS) -> RequestEvent:
        """The finished request; times relative to ``arrival`` in ms, clamped so queue <= TTFT
        <= E2E holds even when stamps coincide."""
        e2e = max(0.0, (end - self.arrival) * 1000.0)
        dispatch = self.dispatch if self.dispatch is not None else end
        queue = min(e2e, max(0.0, (dispatch - self.arrival) * 1000.0))
        ttft = None if self.first_token is None else min(e2e, (self.first_token - self.arrival) * 1000.0)
        prompt, output = self.tokens(prompt_estimate)
        if ttft is None and status == names.STATUS_OK and output:
            ttft = e2e  # tokens reported by usage only: the client had them at the end
        return RequestEvent(
            ts_ms=ts_ms, trace_id=trace_id, model=model, pool=pool, replica=replica, arm=arm,
            policy=policy, prompt_tokens=prompt, output_tokens=output, queue_ms=queue, ttft_ms=ttft,
            itl_ms=ItlSummary.from_gaps(self.gaps_ms), e2e_ms=e2e, status=status, tenant=tenant, class_=class_,
        )
