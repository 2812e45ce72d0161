"""The official ``openai`` SDK as a client of the gateway (and, behind it, the reference worker),
everything real on loopback: usage only when asked and then in OpenAI's final chunk with empty
``choices``; a ``max_tokens`` the replica cannot serve is the replica's 400, passed through;
``GET /v1/models/{id}``; OpenAI-shaped errors on every path; ``x-request-id`` (the trace id) on
every response; the Prometheus histograms see TTFT and TPOT only where a first token streamed; a
failure naming a served model counts under its name before any success."""

from __future__ import annotations

import asyncio
import copy
from pathlib import Path
from typing import Any

import openai
import pytest
from prometheus_client import CollectorRegistry

from llmsla import names
from llmsla.app import wiring
from llmsla.worker.server import WorkerThread
from tests.worker._worker_util import MODEL, worker_cfg

MESSAGES = [{"role": "user", "content": "Four score and seven"}]


def _sample(reg: CollectorRegistry, name: str, **labels: str) -> float:
    return sum(s.value for m in reg.collect() for s in m.samples
               if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()))


async def _recorded(reg: CollectorRegistry, ok_requests: int) -> None:
    """Until the gateway has recorded ``ok_requests`` successful requests. It records a request
    after its last byte is written, and the client runs in the same loop: it can have the whole
    stream before the gateway's handler has taken its next step."""
    async with asyncio.timeout(5):
        while _sample(reg, f"{names.REQUESTS}_total", model=MODEL, status=names.STATUS_OK) < ok_requests:
            await asyncio.sleep(0.01)


def test_the_openai_sdk_sees_openais_api(tmp_path: Path) -> None:
    cfg = worker_cfg(tmp_path)
    with WorkerThread(cfg) as wt:
        g = copy.deepcopy(cfg)
        g.gateway.upstreams = [wt.url]
        reg = CollectorRegistry()

        async def main() -> dict[str, Any]:
            out: dict[str, Any] = {}
            async with wiring.serve_gateway(g, "127.0.0.1", 0, registry=reg) as gw:
                client = openai.AsyncOpenAI(base_url=gw.url + "/v1", api_key="unused", max_retries=0)
                # a failure before any success, for a model a replica lists: its own label
                for _ in range(100):
                    if MODEL in gw.gateway.served_models:
                        break
                    await asyncio.sleep(0.05)
                with pytest.raises(openai.BadRequestError) as too_many:
                    await client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=100000)
                out["too_many"] = too_many.value
                out["rejected_served"] = _sample(reg, f"{names.REQUESTS}_total", model=MODEL,
                                                 status=names.STATUS_REJECTED)

                # streamed, usage not asked: none reaches the client, though the gateway asked
                stream = await client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=8,
                                                              stream=True, extra_body={"ignore_eos": True})
                out["unasked"] = [c async for c in stream]
                # streamed, usage asked: OpenAI's final chunk, empty choices
                stream = await client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=8,
                                                              stream=True, stream_options={"include_usage": True},
                                                              extra_body={"ignore_eos": True})
                out["asked"] = [c async for c in stream]
                await _recorded(reg, 2)
                ttft_streamed = _sample(reg, f"{names.REQUEST_TTFT_SECONDS}_count")
                tpot_streamed = _sample(reg, f"{names.REQUEST_TPOT_SECONDS}_count")
                # not streamed: usage in the body, the request id in a header; no TTFT, no TPOT
                raw = await client.chat.completions.with_raw_response.create(model=MODEL, messages=MESSAGES,
                                                                             max_tokens=5)
                out["plain"], out["plain_headers"] = raw.parse(), raw.headers
                await _recorded(reg, 3)
                out["ttft"] = (ttft_streamed, _sample(reg, f"{names.REQUEST_TTFT_SECONDS}_count"))
                out["tpot"] = (tpot_streamed, _sample(reg, f"{names.REQUEST_TPOT_SECONDS}_count"))
                out["model"] = await client.models.retrieve(MODEL)
                with pytest.raises(openai.NotFoundError) as missing_model:
                    await client.models.retrieve("no-such-model")
                out["missing_model"] = missing_model.value
                with pytest.raises(openai.NotFoundError) as missing_path:
                    await client.get("/no/such/path", cast_to=object)
                out["missing_path"] = missing_path.value
                with pytest.raises(openai.NotFoundError) as unknown:  # the replica's answer, as OpenAI's
                    await client.completions.create(model="no-such-model", prompt="hi")
                out["unknown"] = unknown.value
                out["rejected_other"] = _sample(reg, f"{names.REQUESTS}_total", model=names.LABEL_OVERFLOW_VALUE,
                                                status=names.STATUS_REJECTED)
                await client.close()
            return out

        out = asyncio.run(main())

    e = out["too_many"]  # the worker's answer, as OpenAI's
    assert e.status_code == 400 and e.code == "invalid_value" and e.param == "max_tokens", e.body
    assert "100000" in e.message and e.request_id  # x-request-id on an error too
    assert out["rejected_served"] == 1.0

    unasked = out["unasked"]
    assert unasked and all(c.usage is None and c.choices for c in unasked)
    assert "".join(c.choices[0].delta.content or "" for c in unasked)
    asked = out["asked"]
    assert all(c.usage is None and c.choices for c in asked[:-1])
    assert asked[-1].choices == [] and asked[-1].usage.completion_tokens == 8
    assert asked[-1].usage.total_tokens == asked[-1].usage.prompt_tokens + 8

    plain, headers = out["plain"], out["plain_headers"]
    assert plain.usage.completion_tokens <= 5 and plain.choices[0].message.content is not None
    assert headers["x-request-id"] == headers["traceparent"].split("-")[1] == plain._request_id
    assert out["ttft"] == (2.0, 2.0) and out["tpot"] == (2.0, 2.0)  # the two streams, once each

    assert out["model"].id == MODEL and out["model"].object == "model"
    m = out["missing_model"]
    assert m.code == "model_not_found" and m.param == "model" and m.request_id
    p = out["missing_path"]
    assert p.status_code == 404 and p.code == "unknown_url" and "/no/such/path" in p.message and p.request_id
    assert out["unknown"].code == "model_not_found" and out["unknown"].request_id
    assert out["rejected_other"] == 1.0  # a name no replica serves folds into 'other'
