"""Property: whatever string a producer puts in any string field of any event kind, the job keeps
running and every line lands exactly once - in a window if ``llmsla.events`` accepts it, else as a
dead letter with the contract's own reason - on the default Java path and on the pure-SQL fallback.

Hypothesis draws the strings (any code point, lone surrogates, NUL and other tricky characters
weighted up, lengths around the 256-code-point limit in BMP and astral characters), plus a fixed
sweep of the known edge cases per field; every example becomes one line written through
``SpoolWriter.write_line`` (escaped or raw UTF-8), and ONE bounded Flink run per path judges them
all (a Flink run per example would take hours)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from llmsla import names
from llmsla.events import EVENT_TYPES, MAX_STRING_CHARS, EventError
from llmsla.spool import SpoolWriter
from llmsla.streaming import synth
from llmsla.streaming.store_sink import storable

from . import reference as ref
from .conftest import start_stream

STRING_FIELDS = {kind: [f.name for f in cls.FIELDS if f.type == "string"] for kind, cls in EVENT_TYPES.items()}
TRICKY = ["\x00", "\ud800", "\udbff", "\udc00", "\udfff", "\U0001f600", "\U0010ffff", "\ufeff", "\u2028",
          '"', "\\", "\n", "\r", "\t", "\x7f", "é", "\u0301", " "]
N = MAX_STRING_CHARS


def _sweep() -> list[str]:
    """Edge cases every string field gets, whatever Hypothesis draws."""
    astral = "\U0001f600"
    return ["", "x\x00y", "\ud800", "a\udfffb", "\ud83d\ude00", astral * (N // 2 + 1), astral * N,
            astral * (N + 1), "a" * N, "a" * (N + 1), "é" * N, "é" * (N + 1), "\ufeffok", "tab\there"]


def _strings() -> st.SearchStrategy[str]:
    chars = st.one_of(st.characters(exclude_categories=()), st.sampled_from(TRICKY))
    return st.one_of(
        st.text(chars, max_size=20),
        st.text(chars, min_size=N - 3, max_size=N + 3),
        st.tuples(st.integers(N // 2 - 2, N + 2), st.sampled_from(["\U0001f600", "a", "é"]),
                  st.text(chars, max_size=3)).map(lambda t: t[1] * t[0] + t[2]),
    )


def _examples(n: int) -> list[tuple[str, str, str, bool]]:
    """(kind, field, value, escaped) drawn by Hypothesis, then the fixed sweep."""
    drawn: list[tuple[str, str, str, bool]] = []

    @settings(max_examples=n, database=None, deadline=None, derandomize=True,
              suppress_health_check=list(HealthCheck))
    @given(kind=st.sampled_from(sorted(STRING_FIELDS)), data=st.data())
    def collect(kind: str, data: st.DataObject) -> None:
        field = data.draw(st.sampled_from(STRING_FIELDS[kind]))
        drawn.append((kind, field, data.draw(_strings()), data.draw(st.booleans())))

    collect()
    sweep = [(k, f, v, esc) for k, fs in STRING_FIELDS.items() for f in fs for v in _sweep() for esc in (True, False)]
    return drawn + sweep


def _bases(now: int) -> dict[str, dict]:
    cols = synth.request_columns(1, start_ms=now, span_ms=1, seed=1)
    return {
        names.SPOOL_REQUESTS: json.loads(next(iter(synth.request_lines(cols)))),
        names.SPOOL_POLICY: json.loads(synth.policy_lines(1, start_ms=now, span_ms=1)[0]),
        names.SPOOL_GPU: json.loads(synth.gpu_lines(1, start_ms=now, span_ms=1)[0]),
    }


def _line(base: dict, field: str, value: str, ts: int, escaped: bool) -> str:
    event = {**base, field: value, "ts_ms": ts}
    if not escaped:
        try:
            value.encode("utf-8")
            return json.dumps(event, ensure_ascii=False)
        except UnicodeEncodeError:  # a lone surrogate has no UTF-8 form: only its escape exists
            pass
    return json.dumps(event)


@pytest.mark.parametrize("java_parser", [True, False], ids=["java", "sql-fallback"])
def test_any_string_is_windowed_or_dead_lettered_once_like_the_contract(cfg, spool_dirs, tmp_path: Path,
                                                                      java_parser: bool) -> None:
    now = int(time.time() * 1000)
    start = now - 600_000
    bases = _bases(start)
    examples = _examples(400)
    lines: dict[str, list[str]] = {kind: [] for kind in STRING_FIELDS}
    seen: set[str] = set()
    for i, (kind, field, value, escaped) in enumerate(examples):
        line = _line(bases[kind], field, value, start + 20 * i, escaped)
        if line not in seen:  # identical lines would share one dead-letter fingerprint
            seen.add(line)
            lines[kind].append(line)
    # through the producers' writer: several segments per kind; one for the fallback, which cannot
    # order a backlog of segments (documented; its lines would be `late`, not what this tests)
    segment_bytes = 32 << 10 if java_parser else 1 << 30
    for kind, ls in lines.items():
        with SpoolWriter(cfg.spool_dir(), kind, max_segment_bytes=segment_bytes, max_segment_age_s=3600) as w:
            for line in ls:
                w.write_line(line)

    accepted: dict[str, list] = {kind: [] for kind in lines}
    want_dead = []
    for kind, ls in lines.items():
        for line in ls:
            try:
                accepted[kind].append(EVENT_TYPES[kind].from_json(line.encode()))
            except EventError as exc:
                category = "parse" if exc.field == "<record>" else "schema"
                want_dead.append((kind, storable(line), storable(f"{category}: {exc}")))
    assert all(accepted.values()) and len(want_dead) > 100, ({k: len(v) for k, v in accepted.items()}, len(want_dead))

    log = tmp_path / "stream.log"
    proc = start_stream(cfg, "--once", "--fresh", log=log, restart_attempts=0, java_parser=str(java_parser).lower())
    assert proc.wait(timeout=300) == 0, log.read_text()[-4000:]  # one failure = exit: it kept running

    want = {
        names.T_REQUEST_WINDOWS: ref.request_windows(accepted[names.SPOOL_REQUESTS], ttft_slo=cfg.slo.ttft_ms,
                                                     e2e_slo=cfg.slo.e2e_ms),
        names.T_POLICY_WINDOWS: ref.policy_windows(accepted[names.SPOOL_POLICY]),
        names.T_GPU_WINDOWS: ref.gpu_windows(accepted[names.SPOOL_GPU]),
    }
    with psycopg.connect(cfg.store.dsn) as conn:
        for table, df in want.items():
            got = ref.fetch(conn, table)
            if not java_parser and table == names.T_REQUEST_WINDOWS:
                # the latency histograms are the Java path's (Histogram.java): the fallback writes NULL
                hist = [c for c in ref.HIST_COLUMNS if c in got.columns]  # the request table's
                assert hist
                assert got[hist].isna().all().all(), got[hist].head()
                df = df.assign(**dict.fromkeys(hist))
            ref.assert_frames_equal(got, df, table)
        got_dead = conn.execute("SELECT source, raw, reason FROM dead_letters").fetchall()
    assert sorted(got_dead) == sorted(want_dead)
