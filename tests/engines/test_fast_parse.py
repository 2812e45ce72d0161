"""The fast sample reader gives exactly what prometheus-client's parsers give on every engine's
exposition in both formats, and hands every shape it does not accept back to them (so a bad
body is still refused, and an unusual but valid one is still read)."""

from __future__ import annotations

import pytest

from llmsla.engines.adapt import READS, snapshot
from llmsla.engines.parse import (
    OPENMETRICS_TYPE,
    ParseError,
    _parse,
    fast_samples,
    kept_runs,
    parse,
    same_kept,
    select,
)

from . import expositions as ex

OM = f"{OPENMETRICS_TYPE}; version=1.0.0; charset=utf-8"
TEXT = "text/plain; version=0.0.4; charset=utf-8"
BODIES = {"vllm": ex.vllm(), "sglang": ex.sglang(), "trtllm": ex.trtllm()}


@pytest.mark.parametrize("engine", sorted(BODIES))
@pytest.mark.parametrize("fmt", ["text", "openmetrics"])
def test_same_samples_as_prometheus_client(engine: str, fmt: str) -> None:
    body = getattr(BODIES[engine], fmt)
    ctype = OM if fmt == "openmetrics" else TEXT
    fast = fast_samples(body, fmt == "openmetrics", READS)
    slow = _parse(select(body, READS), ctype)
    assert fast is not None  # the plain shape: read without prometheus-client
    assert dict(fast.samples) == dict(slow.samples)
    assert snapshot(fast, engine, replica="r0", pool="p", ts=1.0) == snapshot(slow, engine, replica="r0", pool="p",
                                                                                ts=1.0)


def test_triton_text() -> None:
    fast = fast_samples(ex.TRITON, False, READS)
    assert fast is not None and dict(fast.samples) == dict(_parse(select(ex.TRITON, READS), TEXT).samples)


@pytest.mark.parametrize("body", [
    'vllm:num_requests_waiting{model_name="a\\"b",engine="0"} 1\n',  # an escaped quote
    'vllm:num_requests_waiting{model_name="a",engine="0"} 1 # {trace_id="x"} 1\n',  # an exemplar
    'vllm:num_requests_waiting{model_name="a" engine="0"} 1\n',  # no comma
    'vllm:num_requests_waiting{model_name="a",engine="0"} one\n',  # not a number
])
def test_other_shapes_go_to_prometheus_client(body: str) -> None:
    assert fast_samples(body, False, READS) is None
    try:
        read = parse(body, TEXT, READS)
    except ParseError:
        return  # refused
    assert read.kept is None  # read by prometheus-client: not a function of the kept runs alone


@pytest.mark.parametrize("fmt", ["text", "openmetrics"])
def test_the_kept_runs_are_all_the_fast_reader_reads(fmt: str) -> None:
    body = getattr(BODIES["vllm"], fmt)
    om = fmt == "openmetrics"
    runs = kept_runs(body, om, READS)
    assert runs and all(r.startswith("vllm:") for r in runs)
    expo = parse(body, OM if om else TEXT, READS)
    assert expo.kept == runs
    # other families and comments moved: the same runs, the same samples
    moved = body.replace("# HELP vllm:num_requests_waiting", "# HELP vllm:num_requests_waiting (moved)")
    moved = moved.replace("# EOF", "process_cpu_seconds_total 1.5\n# EOF") if om else moved + "process_cpu_seconds 1.5\n"
    assert moved != body and kept_runs(moved, om, READS) == runs
    assert dict(parse(moved, OM if om else TEXT, READS).samples) == dict(expo.samples)
    if om:  # cut before the end marker: nothing to compare, the strict parser decides
        assert kept_runs(body.replace("# EOF", ""), om, READS) is None


def test_truncated_openmetrics_is_still_refused() -> None:
    body = BODIES["vllm"].openmetrics
    cut = body[: body.index("# EOF")]
    assert fast_samples(cut, True, READS) is None
    with pytest.raises(ParseError):
        parse(cut, OM, READS)
    assert parse(body, OM, READS).samples  # the whole one is read


def test_garbage_is_still_refused() -> None:
    with pytest.raises(ParseError):
        parse("<html><body>oops</body></html>", "text/html", READS)


def _moved(body: str, step: float) -> str:
    """``body`` with every sample's value moved by ``step`` (a busy replica's next scrape: the same
    lines, other values); comments and ``# EOF`` kept."""
    out = []
    for line in body.split("\n"):
        head, sep, value = line.rpartition(" ")
        if line and not line.startswith("#") and sep:
            line = f"{head} {float(value) + step!r}"
        out.append(line)
    return "\n".join(out)


@pytest.mark.parametrize("engine", sorted(BODIES))
@pytest.mark.parametrize("fmt", ["text", "openmetrics"])
def test_a_run_read_again_with_new_values_gives_prometheus_clients_samples(engine: str, fmt: str) -> None:
    body = getattr(BODIES[engine], fmt)
    ctype = OM if fmt == "openmetrics" else TEXT
    assert fast_samples(body, fmt == "openmetrics", READS) is not None  # the line heads are learnt
    for step in (1.0, 3.0, 1000.0):  # whole steps: OpenMetrics bucket values are integers
        moved = _moved(body, step)
        fast = fast_samples(moved, fmt == "openmetrics", READS)
        assert fast is not None
        assert dict(fast.samples) == dict(_parse(select(moved, READS), ctype).samples)


LAB = 'engine="0",model_name="a b"'  # a label value with a space: the value is the last token


def _run(waiting: str, running: str) -> str:
    return f"vllm:num_requests_waiting{{{LAB}}} {waiting}\nvllm:num_requests_running{{{LAB}}} {running}\n"


@pytest.mark.parametrize(("lines", "want"), [
    (_run("3", "4"), {"vllm:num_requests_waiting": 3.0, "vllm:num_requests_running": 4.0}),
    (_run("NaN", "+Inf"), {"vllm:num_requests_waiting": float("nan"), "vllm:num_requests_running": float("inf")}),
    (_run("5 1700000000000", "6"), {"vllm:num_requests_waiting": 5.0, "vllm:num_requests_running": 6.0}),  # a timestamp
    (_run("7", "8").replace("\n", "\r\n"), {"vllm:num_requests_waiting": 7.0, "vllm:num_requests_running": 8.0}),
    (_run("", "9"), None),  # a line that lost its value: refused, not read one line off
    (_run("1", "x"), None),  # not a number
    (f"vllm:num_requests_waiting{{{LAB}}}\nvllm:num_requests_running{{{LAB}}} 1 2\n", None),  # a value moved lines
])
def test_known_heads_read_each_line_or_refuse_the_run(lines: str, want: dict[str, float] | None) -> None:
    assert fast_samples(_run("1", "2"), False, READS) is not None  # the lines' heads are known
    got = fast_samples(lines, False, READS)
    if want is None:
        assert got is None  # prometheus-client decides: read as it reads, or refused
        return
    if "\r" in lines:
        assert got is None or {k: v[0][1] for k, v in got.samples.items()} == want
        return
    assert got is not None
    values = {name: rows[0][1] for name, rows in got.samples.items()}
    assert values.keys() == want.keys()
    assert all(v == w or (v != v and w != w) for v, w in ((values[k], want[k]) for k in want))
    assert all(rows[0][0] == {"engine": "0", "model_name": "a b"} for rows in got.samples.values())


def test_a_line_without_a_value_is_not_read_as_the_next_ones() -> None:
    plain = 'vllm:num_requests_waiting{engine="0"} 1\nvllm:num_requests_running{engine="0"} 2\n'
    assert fast_samples(plain, False, READS) is not None  # the lines' heads are known
    # a known head with no value after it: not read as the next line's
    lost = 'vllm:num_requests_waiting{engine="0"}\nvllm:num_requests_running{engine="0"} 2\n'
    assert fast_samples(lost, False, READS) is None
    with pytest.raises(ParseError):
        parse(lost, TEXT, READS)


def _kept_lines(body: bytes) -> list[str]:
    runs = kept_runs(body.decode(), False, READS)
    assert runs is not None
    return [line for run in runs for line in run.split("\n")]


def test_same_kept_never_says_same_when_the_kept_lines_differ() -> None:
    """Random edits (lines added, dropped, cut, joined, a kept line slipped in) of bodies longer
    and shorter than the comparison's slack: whenever ``same_kept`` answers True, the kept
    sample lines are the same; and it does answer True when only other families moved."""
    import random

    lines = ['vllm:num_requests_waiting{engine="0"} 1.0', 'vllm:kv_cache_usage_perc{engine="0"} 0.5',
             "# HELP vllm:num_requests_waiting Waiting.", "process_cpu_seconds_total 0.5", "python_gc 3",
             'other{a="' + "z" * 300 + '"} 1', "# TYPE other gauge"]
    edits = ["\n", "", "7", " ", "vllm:", '\nvllm:num_requests_running{engine="0"} 9']
    rng = random.Random(7)
    said_same = 0
    for _ in range(3000):
        old = [rng.choice(lines) for _ in range(rng.randrange(1, 40))]
        new = list(old)
        for _ in range(rng.randrange(1, 4)):
            i = rng.randrange(len(new) + 1)
            op = rng.random()
            if op < 0.3 and new:
                new.pop(min(i, len(new) - 1))
            elif op < 0.6:
                new.insert(i, rng.choice(lines))
            elif new:
                j = min(i, len(new) - 1)
                k = rng.randrange(len(new[j]) + 1)
                new[j] = new[j][:k] + rng.choice(edits) + new[j][k + 1:]
        a = ("\n".join(old) + "\n").encode()
        b = ("\n".join(new) + ("\n" if rng.random() < 0.8 else "")).encode()
        if same_kept(a, b, False, READS):
            said_same += 1
            assert _kept_lines(a) == _kept_lines(b), (a, b)
    assert said_same > 100  # it is not a check that always says "read it again"


def _served(cpu_s: float, body: str) -> str:
    """``body`` as a serving process exposes it: its own collectors first (prometheus-client's
    default registry order), the engine's families after."""
    process = "".join(f"# HELP {n} {n}.\n# TYPE {n} gauge\n{n} {v}\n" for n, v in (
        ("process_virtual_memory_bytes", 3.38e9), ("process_resident_memory_bytes", 2.9e8),
        ("process_start_time_seconds", 1.79e9), ("process_cpu_seconds_total", cpu_s), ("process_open_fds", 61.0)))
    gc = "".join(f'python_gc_objects_collected_total{{generation="{g}"}} {100 * g}.0\n' for g in range(3))
    return process + gc + body


def test_same_kept_on_an_idle_engines_bodies(monkeypatch: pytest.MonkeyPatch) -> None:
    body = _served(0.5, BODIES["vllm"].text)
    moved = _served(1.25, BODIES["vllm"].text)  # the server's CPU seconds moved, nothing of the engine
    assert moved != body
    assert same_kept(body.encode(), moved.encode(), False, READS)
    assert same_kept(body.encode(), body.encode(), False, READS)
    waiting = next(line for line in body.split("\n") if line.startswith("vllm:num_requests_waiting{"))
    busier = moved.replace(waiting, waiting.rsplit(" ", 1)[0] + " 12.0")
    assert not same_kept(body.encode(), busier.encode(), False, READS)
    om = _served(0.5, BODIES["vllm"].openmetrics).encode()
    om_moved = _served(1.25, BODIES["vllm"].openmetrics).encode()
    assert same_kept(om, om_moved, True, READS)
    from llmsla.engines import parse as parse_mod

    monkeypatch.setattr(parse_mod, "_SLACK", 0)  # only the end marker's line differs: refused for that alone
    assert not same_kept(om, om.replace(b"# EOF", b""), True, READS)  # cut before the end marker
    assert not same_kept(body.encode(), moved.encode().replace(b"1.25", b"\xff"), False, READS)  # not UTF-8


@pytest.mark.parametrize("slack", [0, 256])
def test_same_kept_sees_a_kept_line_joined_to_the_line_before(monkeypatch: pytest.MonkeyPatch, slack: int) -> None:
    """The newline before a kept line replaced: the line is now part of another family's line,
    one kept line fewer, though the bytes after the change are the same in both bodies."""
    from llmsla.engines import parse as parse_mod

    monkeypatch.setattr(parse_mod, "_SLACK", slack)  # exact, and as it runs
    pad = "".join(f'other{{a="{"z" * 300}",i="{i}"}} 1\n' for i in range(4))
    kept = 'vllm:num_requests_waiting{engine="0"} 1.0'
    old = f"{pad}x 1\n{kept}\n{pad}".encode()
    new = f"{pad}x 1;{kept}\n{pad}".encode()
    assert len(_kept_lines(old)) == 1 and _kept_lines(new) == []
    assert not same_kept(old, new, False, READS)
    assert not same_kept(new, old, False, READS)
