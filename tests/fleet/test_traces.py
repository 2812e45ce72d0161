"""Trace replay: the real files load completely; malformed rows are skipped, counted and named
by line; time scaling and rate multipliers do what they say."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from llmsla.fleet import traces, workload

AZURE_BAD = """TIMESTAMP,ContextTokens,GeneratedTokens
2023-11-16 18:15:46.6805900,374,44
2023-11-16 18:15:47.0000000,12
2023-11-16 18:15:48.1000000,abc,5
not a time,10,10
2023-11-16 18:15:49.5000000,100,-3
2023-11-16 18:15:50.2500000,200,0
2023-11-16 18:15:51.0,300,30,extra
2023-11-16 18:15:52.7500000,400,40
"""

MOONCAKE_BAD = """{"timestamp": 0, "input_length": 10, "output_length": 5, "hash_ids": [0]}
{"timestamp": 100, "input_length": 20
[1, 2, 3]
{"timestamp": -5, "input_length": 10, "output_length": 5}

{"timestamp": 200, "input_length": "x", "output_length": 5}
{"timestamp": 300, "input_length": 30, "output_length": 7}
"""


def test_real_traces_load_completely() -> None:
    # row counts and span from the data README (measured on these files)
    for name, rows in (("azure_code", 8819), ("azure_conv", 19366), ("mooncake", 12031)):
        arrivals, rep = traces.load(name)
        assert rep.skipped == 0 and rep.loaded == rows == len(arrivals), rep.summary()
        assert arrivals[0].t == 0 and 3400 < arrivals[-1].t < 3600
        assert all(a.t <= b.t for a, b in zip(arrivals, arrivals[1:], strict=False))
    conv, _ = traces.load("azure_conv")
    assert 5.3 < len(conv) / conv[-1].t < 5.8  # README: 5.53 req/s
    assert 1100 < sum(a.prompt for a in conv) / len(conv) < 1210  # README: 1,155 prompt tokens


def test_malformed_azure_rows_are_skipped_with_line_numbers(tmp_path: Path) -> None:
    p = tmp_path / "azure.csv"
    p.write_text(AZURE_BAD)
    arrivals, rep = traces.load(str(p))
    assert rep.rows == 8 and rep.loaded == 3 and rep.skipped == 5
    assert [n for n, _ in rep.bad] == [3, 4, 5, 6, 8]
    reasons = dict(rep.bad)
    assert "expected 3 columns, got 2" in reasons[3]
    assert "ContextTokens" in reasons[4]
    assert "TIMESTAMP" in reasons[5]
    assert "GeneratedTokens: negative" in reasons[6]
    assert "line 3:" in rep.summary() and "5 malformed rows skipped" in rep.summary()
    # good rows around the bad ones survive, re-based and in order; 0 output -> 1 token
    assert [(round(a.t, 4), a.prompt, a.output) for a in arrivals] == [
        (0.0, 374, 44), (3.5694, 200, 1), (6.0694, 400, 40)]


def test_malformed_mooncake_rows_are_skipped_with_line_numbers(tmp_path: Path) -> None:
    p = tmp_path / "mc.jsonl"
    p.write_text(MOONCAKE_BAD)
    arrivals, rep = traces.load(str(p))
    assert rep.loaded == 2 and rep.skipped == 4
    assert [n for n, _ in rep.bad] == [2, 3, 4, 6]
    assert "timestamp" in dict(rep.bad)[4] and "input_length" in dict(rep.bad)[6]
    assert arrivals == [workload.Arrival(0.0, 10, 5), workload.Arrival(0.3, 30, 7)]


def test_many_bad_rows_keep_exact_count_and_first_lines(tmp_path: Path) -> None:
    p = tmp_path / "many.csv"
    p.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n" + "junk\n" * 500
                 + "2023-11-16 18:15:46.0,1,1\n")
    arrivals, rep = traces.load(str(p))
    assert rep.skipped == 500 and len(arrivals) == 1
    assert [n for n, _ in rep.bad] == list(range(2, 2 + traces.MAX_BAD_KEPT))


def test_wrong_header_and_missing_file_are_clear_errors(tmp_path: Path) -> None:
    p = tmp_path / "x.csv"
    p.write_text("a,b,c\n1,2,3\n")
    with pytest.raises(ValueError, match=r"x.csv:1: expected header"):
        traces.load(str(p))
    with pytest.raises(FileNotFoundError, match="short names"):
        traces.load(str(tmp_path / "nope.csv"))


def test_time_scale_and_rate_multiplier() -> None:
    conv, _ = traces.load("azure_conv")
    conv = workload.window(conv, duration_s=600)
    fast = workload.scale(conv, time_scale=0.5)
    assert len(fast) == len(conv) and fast[-1].t == pytest.approx(conv[-1].t / 2)
    for mult in (2.0, 4.0, 0.5, 2.5):
        out = workload.scale(conv, rate=mult, rng=random.Random(1))
        assert len(out) == pytest.approx(mult * len(conv), rel=0.03)
        assert out[0].t >= conv[0].t and out[-1].t <= conv[-1].t  # duration kept
        assert all(a.t <= b.t for a, b in zip(out, out[1:], strict=False))
    # token mix is preserved by the copies
    two = workload.scale(conv, rate=2.0, rng=random.Random(1))
    assert sum(a.prompt for a in two) == 2 * sum(a.prompt for a in conv)


def test_synthetic_loads_have_their_rates() -> None:
    rng = random.Random(3)
    td = workload.TokenDist(128)
    p = workload.poisson(20.0, 500.0, td, td, rng)
    assert len(p) / 500.0 == pytest.approx(20.0, rel=0.05)
    b = workload.bursty(20.0, 600.0, td, td, rng, burst_factor=8, period_s=30, on_s=3)
    assert len(b) / 600.0 == pytest.approx(20.0, rel=0.08)
    in_burst = sum(1 for a in b if a.t % 30 < 3)
    assert in_burst / len(b) == pytest.approx(8 * 3 / (8 * 3 + 27), rel=0.1)
    ln = workload.TokenDist(1000, 1.0)
    xs = [ln.sample(rng) for _ in range(20000)]
    assert sum(xs) / len(xs) == pytest.approx(1000, rel=0.06)


def test_mooncake_replay_runs_through_the_fleet() -> None:
    """Mooncake prompts are long (12k tokens average): admitted alone past the prefill budget,
    and only a request larger than the whole KV cache may fail."""
    from llmsla.fleet import engine

    arrivals, _ = traces.load("mooncake")
    arrivals = workload.window(arrivals, duration_s=120)
    res = engine.Simulator(engine.SimConfig(engine.fleet("6b:8"), policy="least_outstanding",
                                            timeout_s=600)).run(arrivals, start_ms=0)
    cap = engine.models.get("6b").kv_capacity_tokens
    assert len(res.rows) == len(arrivals) > 300
    for r in res.rows:
        assert r.status == "ok" or (r.status == "error" and r.prompt + r.output_tokens + 1 > cap), r
    assert sum(r.status == "ok" for r in res.rows) > 0.99 * len(res.rows)
