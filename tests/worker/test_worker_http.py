"""The reference worker over real HTTP on 127.0.0.1: OpenAI API, SSE, batching, errors, disconnects."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest
import torch

from llmsla import names
from llmsla.worker import model as lm
from llmsla.worker.server import WorkerThread

from ._worker_util import MODEL, metric_samples, parse_sse, post, worker_cfg


@pytest.fixture()
def worker(tmp_path: Path) -> Iterator[WorkerThread]:
    wt = WorkerThread(worker_cfg(tmp_path))
    wt.start()
    yield wt
    wt.stop()


def test_completions_stream_and_non_stream_agree(worker: WorkerThread) -> None:
    url = worker.url

    async def go() -> None:
        async with aiohttp.ClientSession() as s:
            body = {"model": MODEL, "prompt": "We hold these truths", "max_tokens": 20, "seed": 7, "temperature": 0.9,
                    "ignore_eos": True}
            st, plain = await post(s, url, "/v1/completions", body)
            assert st == 200, plain
            assert plain["object"] == "text_completion" and plain["model"] == MODEL
            ch = plain["choices"][0]
            assert ch["finish_reason"] == "length"
            assert plain["usage"] == {"prompt_tokens": len(lm.encode("We hold these truths")), "completion_tokens": 20,
                                      "total_tokens": 21 + 20}
            ext = plain["llmsla"]
            assert ext["prompt_tokens"] == 21 and ext["output_tokens"] == 20
            assert 0 <= ext["worker_queue_ms"] <= ext["worker_ttft_ms"]
            # the same request streamed: same seed -> same tokens, one chunk per token
            st, chunks = await post(s, url, "/v1/completions", {**body, "stream": True})
            assert st == 200
            assert len(chunks) == 21  # 20 token chunks + the final one
            assert all(c["choices"][0]["finish_reason"] is None for c in chunks[:-1])
            last = chunks[-1]
            assert last["choices"][0]["finish_reason"] == "length"
            # usage only when asked, as OpenAI: a last chunk with empty choices
            assert all("usage" not in c for c in chunks) and last["llmsla"]["output_tokens"] == 20
            assert "llmsla" not in chunks[0]
            st, asked = await post(s, url, "/v1/completions",
                                   {**body, "stream": True, "stream_options": {"include_usage": True}})
            assert st == 200 and len(asked) == 22 and all("usage" not in c for c in asked[:-1])
            assert asked[-1]["choices"] == [] and asked[-1]["usage"] == plain["usage"]
            assert "".join(c["choices"][0]["text"] for c in chunks) == ch["text"]
            # a different seed samples differently (the seed is really used)
            st, other = await post(s, url, "/v1/completions", {**body, "seed": 8})
            assert other["choices"][0]["text"] != ch["text"]

    asyncio.run(go())


def test_chat_completions_stream_and_non_stream(worker: WorkerThread) -> None:
    url = worker.url
    msgs = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hello"}]

    async def go() -> None:
        async with aiohttp.ClientSession() as s:
            body = {"model": MODEL, "messages": msgs, "max_tokens": 12, "temperature": 0, "ignore_eos": True}
            st, plain = await post(s, url, "/v1/chat/completions", body)
            assert st == 200, plain
            assert plain["object"] == "chat.completion"
            msg = plain["choices"][0]["message"]
            assert msg["role"] == "assistant" and plain["usage"]["completion_tokens"] == 12
            prompt = "system: be brief\nuser: hello\nassistant: "
            assert plain["usage"]["prompt_tokens"] == len(lm.encode(prompt))
            st, chunks = await post(s, url, "/v1/chat/completions", {**body, "stream": True})
            assert st == 200 and len(chunks) == 13
            assert all(c["object"] == "chat.completion.chunk" for c in chunks)
            assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
            assert "role" not in chunks[1]["choices"][0]["delta"]
            text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks)
            assert text == msg["content"]  # greedy: identical
            assert chunks[-1]["choices"][0]["finish_reason"] == "length" and chunks[-1]["llmsla"]["output_tokens"] == 12

    asyncio.run(go())


def test_models_healthz_metrics(worker: WorkerThread) -> None:
    async def go() -> None:
        async with aiohttp.ClientSession() as s:
            async with s.get(worker.url + "/v1/models") as r:
                assert r.status == 200 and (await r.json())["data"][0]["id"] == MODEL
            async with s.get(worker.url + "/healthz") as r:
                h = await r.json()
                assert r.status == 200 and h["status"] == "ok" and h["running"] == 0
            await post(s, worker.url, "/v1/completions", {"model": MODEL, "prompt": "a", "max_tokens": 5, "ignore_eos": True})
            async with s.get(worker.url + "/metrics") as r:
                text = await r.text()
            assert metric_samples(text, names.WORKER_GENERATED_TOKENS + "_total") == {f'{{model="{MODEL}"}}': 5.0}
            assert metric_samples(text, names.WORKER_MEMORY_BYTES)[f'{{model="{MODEL}"}}'] > 10 << 20
            assert metric_samples(text, names.WORKER_FIRST_TOKEN_SECONDS + "_count")[f'{{model="{MODEL}"}}'] == 1
            for n in (names.WORKER_QUEUE_LENGTH, names.WORKER_RUNNING_REQUESTS, names.WORKER_TOKENS_PER_SECOND):
                assert f'{{model="{MODEL}"}}' in metric_samples(text, n)

    asyncio.run(go())


def _greedy_reference(seed: int, prompt: str, max_tokens: int) -> str:
    """Independent reference: greedy decoding by full recompute, no KV cache, no batching."""
    import codecs

    model = lm.build_model(seed, spec=lm.ModelSpec(max_ctx=256 + 64 + 1))
    toks = lm.encode(prompt)
    out = bytearray()
    with torch.inference_mode():
        for _ in range(max_tokens):
            nxt = int(model(torch.tensor([toks]))[0, -1].argmax())
            if nxt == lm.EOS:
                break
            toks.append(nxt)
            out.append(nxt)
    return codecs.decode(bytes(out), "utf-8", "replace")


def test_continuous_batching_is_exact_under_greedy_decoding(worker: WorkerThread) -> None:
    """16 concurrent requests of different lengths produce exactly what each produces alone."""
    url = worker.url
    prompts = [f"{i}: " + "Four score and seven years ago"[: 3 + 2 * i] for i in range(16)]

    def body(p: str, i: int) -> dict:
        return {"model": MODEL, "prompt": p, "max_tokens": 24 + i, "temperature": 0, "stream": i % 2 == 0}

    def text(status: int, resp) -> str:
        assert status == 200, resp
        if isinstance(resp, list):
            return "".join(c["choices"][0]["text"] for c in resp)
        return resp["choices"][0]["text"]

    async def go() -> tuple[list[str], list[str]]:
        async with aiohttp.ClientSession() as s:
            alone = [text(*await post(s, url, "/v1/completions", body(p, i))) for i, p in enumerate(prompts)]
            together = await asyncio.gather(*(post(s, url, "/v1/completions", body(p, i)) for i, p in enumerate(prompts)))
            async with s.get(url + "/metrics") as r:
                metrics = await r.text()
            return alone, [text(*r) for r in together], metrics

    alone, together, metrics = asyncio.run(go())
    assert together == alone
    for i in (0, 9, 15):
        assert alone[i] == _greedy_reference(0, prompts[i], 24 + i)
    buckets = metric_samples(metrics, names.WORKER_BATCH_SIZE + "_bucket")
    le1 = buckets[f'{{le="1.0",model="{MODEL}"}}']
    total = buckets[f'{{le="+Inf",model="{MODEL}"}}']
    assert total - le1 > 0, "no decode step ever ran more than one request"
    stats = worker.running.engine.stats()
    assert stats["max_batch_seen"] >= 8, stats


def test_bad_requests_get_4xx_and_good_ones_around_them_complete(worker: WorkerThread) -> None:
    url = worker.url
    good = {"model": MODEL, "prompt": "ok", "max_tokens": 10, "ignore_eos": True}
    bad_cases = [
        (b"{not json", 400, "not valid JSON"),
        ([1, 2], 400, "JSON object"),
        ({"prompt": "x"}, 400, "missing field 'model'"),
        ({"model": "gpt-9", "prompt": "x"}, 404, "not found"),
        ({"model": MODEL}, 400, "missing field 'prompt'"),
        ({"model": MODEL, "prompt": "x" * 300}, 400, "max_prompt_tokens=256"),
        ({"model": MODEL, "prompt": "x", "max_tokens": -1}, 400, "'max_tokens' must be >= 1"),
        ({"model": MODEL, "prompt": "x", "max_tokens": "3"}, 400, "'max_tokens' must be an integer"),
        ({"model": MODEL, "prompt": "x", "temperature": 9}, 400, "'temperature'"),
        ({"model": MODEL, "prompt": "x", "n": 2}, 400, "n=1"),
        ({"model": MODEL, "prompt": "x", "stop": 5}, 400, "'stop'"),
        ({"model": MODEL, "prompt": "x", "stream": "yes"}, 400, "'stream'"),
        ({"model": MODEL, "prompt": [1, 999]}, 400, "vocabulary"),
        ({"model": MODEL, "prompt": "x", "llmsla_policy": "chaos"}, 400, "llmsla_policy"),
    ]

    async def go() -> None:
        async with aiohttp.ClientSession() as s:
            tasks = []
            for i, (b, _, _) in enumerate(bad_cases):
                tasks.append(post(s, url, "/v1/completions", {**good, "stream": i % 2 == 0}))
                tasks.append(post(s, url, "/v1/completions", b))
            tasks.append(post(s, url, "/v1/chat/completions", {"model": MODEL, "messages": []}))
            tasks.append(post(s, url, "/v1/chat/completions", {"model": MODEL, "messages": [{"role": "x", "content": "a"}]}))
            res = await asyncio.gather(*tasks)
            for i, (_, status, reason) in enumerate(bad_cases):
                ok_status, ok_body = res[2 * i]
                assert ok_status == 200
                n_out = (ok_body[-1]["llmsla"]["output_tokens"] if isinstance(ok_body, list)
                         else ok_body["usage"]["completion_tokens"])
                assert n_out == 10
                st, err = res[2 * i + 1]
                assert st == status, (bad_cases[i], err)
                assert reason in err["error"]["message"], (reason, err)
            for st, err in res[-2:]:
                assert st == 400 and "messages" in err["error"]["message"]
            async with s.get(url + "/healthz") as r:
                h = await r.json()
            assert h["running"] == 0 and h["waiting"] == 0 and h["free_slots"] == 16

    asyncio.run(go())


def test_client_disconnect_mid_stream_frees_the_slot(tmp_path: Path) -> None:
    cfg = worker_cfg(tmp_path, max_tokens=20000, max_prompt_tokens=32, max_batch=2)
    with WorkerThread(cfg) as wt:
        engine = wt.running.engine

        async def go() -> None:
            async with aiohttp.ClientSession() as s:
                body = {"model": MODEL, "prompt": "go", "max_tokens": 20000, "stream": True, "ignore_eos": True}
                resp = await s.post(wt.url + "/v1/completions", json=body)
                assert resp.status == 200
                for _ in range(5):
                    line = await resp.content.readline()
                    assert line.startswith(b"data: ") or line == b"\n"
                assert engine.stats()["running"] == 1
                resp.close()  # drop the connection mid-stream
            deadline = time.monotonic() + 10
            while engine.stats()["running"] and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
            stats = engine.stats()
            assert stats["running"] == 0 and stats["free_slots"] == 2
            assert stats["generated_tokens"] < 20000  # it stopped early, not at max_tokens
            async with aiohttp.ClientSession() as s:
                async with s.get(wt.url + "/metrics") as r:
                    text = await r.text()
                assert metric_samples(text, names.WORKER_RUNNING_REQUESTS) == {f'{{model="{MODEL}"}}': 0.0}
                st, body2 = await post(s, wt.url, "/v1/completions", {"model": MODEL, "prompt": "a", "max_tokens": 4, "ignore_eos": True})
                assert st == 200 and body2["usage"]["completion_tokens"] == 4

        asyncio.run(go())


def test_stop_sequences_and_eos_end_generation(worker: WorkerThread) -> None:
    async def go() -> None:
        async with aiohttp.ClientSession() as s:
            base = {"model": MODEL, "prompt": "Liberty", "max_tokens": 40, "temperature": 0}
            st, free = await post(s, worker.url, "/v1/completions", {**base, "ignore_eos": True})
            text = free["choices"][0]["text"]
            idx = next(i for i, c in enumerate(text) if i >= 2 and c.isascii())
            stop = text[idx]  # one ASCII byte; generation must end at its first occurrence
            st, stopped = await post(s, worker.url, "/v1/completions", {**base, "ignore_eos": True, "stop": ["\x00\x01", stop]})
            assert st == 200 and stopped["choices"][0]["finish_reason"] == "stop"
            assert stopped["choices"][0]["text"] == text[: text.index(stop) + 1]

    asyncio.run(go())


def test_sse_parser_rejects_bad_framing() -> None:
    with pytest.raises(AssertionError):
        parse_sse(b"data: {}\n\ndata: {}\n\n")  # no [DONE]
    with pytest.raises(AssertionError):
        parse_sse(b"data: {}\nx\n\ndata: [DONE]\n\n")


def test_cli_worker_serves_and_stops_cleanly(tmp_path: Path) -> None:
    """``llmsla worker --host 127.0.0.1 --port P`` as a real process; SIGTERM exits 0."""
    import os
    import signal
    import subprocess
    import sys

    from llmsla.services import free_port, wait_http

    port = free_port()
    env = {**os.environ, "LLMSLA_SPOOL_DIR": str(tmp_path / "spool"), "LLMSLA_WORKER_MAX_BATCH": "4"}
    log = tmp_path / "worker.log"
    with open(log, "w") as fh:
        proc = subprocess.Popen([sys.executable, "-m", "llmsla", "worker", "--host", "127.0.0.1", "--port", str(port),
                                 "--model", "cli-model"], stdout=fh, stderr=subprocess.STDOUT, env=env)
    try:
        wait_http(f"http://127.0.0.1:{port}/healthz", timeout_s=60, proc=proc, log=log)

        async def go() -> None:
            async with aiohttp.ClientSession() as s:
                st, body = await post(s, f"http://127.0.0.1:{port}", "/v1/completions",
                                      {"model": "cli-model", "prompt": "hi", "max_tokens": 3, "ignore_eos": True})
                assert st == 200 and body["usage"]["completion_tokens"] == 3
                async with s.get(f"http://127.0.0.1:{port}/healthz") as r:
                    assert (await r.json())["free_slots"] == 4  # --max-batch from the environment

        asyncio.run(go())
    finally:
        proc.send_signal(signal.SIGTERM)
        rc = proc.wait(30)
    assert rc == 0, log.read_text()
    assert "serving cli-model" in log.read_text()


def test_measure_tokens_per_second_counts_what_the_server_generated(worker: WorkerThread) -> None:
    from llmsla.worker.load import measure_tokens_per_second

    before = worker.running.engine.stats()["generated_tokens"]
    r = asyncio.run(measure_tokens_per_second(worker.url, concurrency=4, max_tokens=8, rounds=2))
    assert r["requests"] == 8 and r["output_tokens"] == 64 and r["tokens_per_s"] > 0
    assert worker.running.engine.stats()["generated_tokens"] - before == 64


def test_a_queued_request_whose_client_leaves_leaves_the_queue(tmp_path: Path) -> None:
    cfg = worker_cfg(tmp_path, max_tokens=20000, max_prompt_tokens=32, max_batch=1)
    with WorkerThread(cfg) as wt:
        engine = wt.running.engine

        async def until(cond, what: str) -> None:
            deadline = time.monotonic() + 10
            while not cond(engine.stats()):
                assert time.monotonic() < deadline, f"timed out waiting for {what}: {engine.stats()}"
                await asyncio.sleep(0.02)

        async def go() -> None:
            long = {"model": MODEL, "prompt": "a", "max_tokens": 20000, "stream": True, "ignore_eos": True}
            async with aiohttp.ClientSession() as s1, aiohttp.ClientSession() as s2:
                a = await s1.post(wt.url + "/v1/completions", json=long)
                await a.content.readline()
                b = asyncio.create_task(post(s2, wt.url, "/v1/completions", {**long, "stream": False}))
                await until(lambda st: st["waiting"] == 1 and st["running"] == 1, "B queued behind A")
                b.cancel()
                await until(lambda st: st["waiting"] == 0, "B to leave the queue")
                assert engine.stats()["running"] == 1  # A is unaffected
                a.close()
                await until(lambda st: st["running"] == 0 and st["free_slots"] == 1, "A's slot to be freed")
                async with s1.get(wt.url + "/metrics") as r:
                    text = await r.text()
                assert metric_samples(text, names.WORKER_QUEUE_LENGTH) == {f'{{model="{MODEL}"}}': 0.0}

        asyncio.run(go())
