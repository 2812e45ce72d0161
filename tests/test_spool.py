"""Spool: several writer processes and a concurrent reader lose nothing and never see a partial
line; rotation, the disk bound, recovery and corrupt-line reporting."""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import re
import time
from pathlib import Path

import pytest

from llmsla import names, spool
from llmsla.events import RequestEvent

N_WRITERS = 4
PER_WRITER = 3000


def make_event(writer: int, i: int) -> RequestEvent:
    return RequestEvent(
        ts_ms=1_700_000_000_000 + i, trace_id=f"{writer:02d}{i:030d}", model="m", pool="p",
        replica=f"r{writer}", arm="default", policy="constant", prompt_tokens=i % 50,
        output_tokens=1 + i % 7, queue_ms=0.0, ttft_ms=1.0, itl_ms=[1.0] * (i % 7), e2e_ms=10.0, status="ok",
    )


def _writer(root: str, writer: int) -> None:
    # small segments and a short age so files rotate and publish constantly under the reader
    w = spool.SpoolWriter(root, names.SPOOL_REQUESTS, max_segment_bytes=20_000, max_segment_age_s=0.05)
    for i in range(PER_WRITER):
        w.write(make_event(writer, i))
        if i % 500 == 0:
            time.sleep(0.01)
    w.close()


def test_four_writer_processes_and_concurrent_reader_lose_nothing(tmp_path: Path) -> None:
    root = str(tmp_path)
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=_writer, args=(root, w)) for w in range(N_WRITERS)]
    for p in procs:
        p.start()
    reader = spool.SpoolReader(root, names.SPOOL_REQUESTS)
    seen: list[str] = []
    bad: list[spool.BadLine] = []
    segments = 0
    while any(p.is_alive() for p in procs):
        for path in reader.poll():
            segments += 1
            for item in spool.read_segment(path, names.SPOOL_REQUESTS):
                (bad if isinstance(item, spool.BadLine) else seen).append(item if isinstance(item, spool.BadLine) else item.trace_id)
        time.sleep(0.005)
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    for item in reader.read_new():
        (bad if isinstance(item, spool.BadLine) else seen).append(item if isinstance(item, spool.BadLine) else item.trace_id)
    assert bad == []
    assert len(seen) == N_WRITERS * PER_WRITER
    assert len(set(seen)) == len(seen)  # nothing read twice
    expected = {make_event(w, i).trace_id for w in range(N_WRITERS) for i in range(PER_WRITER)}
    assert set(seen) == expected
    assert segments > N_WRITERS * 2  # rotation really happened while we were reading
    assert not list((tmp_path / names.SPOOL_REQUESTS / spool.INPROGRESS).iterdir())


def test_rotation_by_age_publishes_without_new_writes(tmp_path: Path) -> None:
    w = spool.SpoolWriter(tmp_path, names.SPOOL_REQUESTS, max_segment_age_s=0.1)
    w.write(make_event(0, 1))
    assert spool.published_segments(tmp_path, names.SPOOL_REQUESTS) == []
    deadline = time.monotonic() + 5
    while not spool.published_segments(tmp_path, names.SPOOL_REQUESTS) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert len(spool.published_segments(tmp_path, names.SPOOL_REQUESTS)) == 1
    w.close()


def test_rotation_by_size(tmp_path: Path) -> None:
    with spool.SpoolWriter(tmp_path, names.SPOOL_REQUESTS, max_segment_bytes=2000, max_segment_age_s=3600) as w:
        for i in range(100):
            w.write(make_event(0, i))
    segs = spool.published_segments(tmp_path, names.SPOOL_REQUESTS)
    assert len(segs) > 5
    assert all(p.stat().st_size <= 2000 for p in segs)
    assert sum(1 for p in segs for _ in spool.read_segment(p, names.SPOOL_REQUESTS)) == 100


def test_segment_names_say_which_writer_wrote_them(tmp_path: Path) -> None:
    """``<ms>-<host>-<pid>-<tag>-<seq>.jsonl``: every segment of one writer carries the same
    ``<host>-<pid>-<tag>`` (the stream job reads each writer's segments in order, and its source
    parses the name with this pattern); two writers differ even in one process."""
    pattern = re.compile(r"^\d+-(.+-\d+-[0-9A-Za-z]+)-\d+\.jsonl$")  # streaming/java SpoolFiles.NAME
    writers = {}
    for k in range(2):
        with spool.SpoolWriter(tmp_path, names.SPOOL_REQUESTS, max_segment_bytes=2000, max_segment_age_s=3600) as w:
            for i in range(30):
                w.write(make_event(k, i))
        segs = [p for p in spool.published_segments(tmp_path, names.SPOOL_REQUESTS) if p.name not in writers]
        assert len(segs) > 2
        for p in segs:
            m = pattern.match(p.name)
            assert m is not None, p.name
            writers[p.name] = m.group(1)
    assert len(set(writers.values())) == 2


def test_disk_bound_raises_clear_error_and_keeps_written_data(tmp_path: Path) -> None:
    w = spool.SpoolWriter(tmp_path, names.SPOOL_REQUESTS, max_segment_bytes=4096, max_total_bytes=20_000)
    written = 0
    with pytest.raises(spool.SpoolFullError, match="is full: .* bytes used of 20000"):
        for i in range(10_000):
            w.write(make_event(0, i))
            written += 1
    w.close()
    read = sum(1 for p in spool.published_segments(tmp_path, names.SPOOL_REQUESTS)
               for _ in spool.read_segment(p, names.SPOOL_REQUESTS))
    assert read == written > 0
    # after the consumer prunes, writing works again
    assert spool.prune(tmp_path, names.SPOOL_REQUESTS, older_than_s=-1) > 0
    with spool.SpoolWriter(tmp_path, names.SPOOL_REQUESTS, max_total_bytes=20_000) as w2:
        w2.write(make_event(0, 0))


def test_recover_never_overwrites_a_published_segment(tmp_path: Path) -> None:
    d = tmp_path / names.SPOOL_REQUESTS
    (d / spool.INPROGRESS).mkdir(parents=True)
    name = "0000000000001-host-7-abcd-000003.jsonl"
    published = [make_event(0, i).to_json() for i in range(5)]
    (d / name).write_text("\n".join(published) + "\n")
    left = [make_event(1, i).to_json() for i in range(3)]
    stale = d / spool.INPROGRESS / name
    stale.write_text("\n".join(left) + "\n")
    old = time.time() - 120
    os.utime(stale, (old, old))
    assert spool.recover(tmp_path, names.SPOOL_REQUESTS, older_than_s=60) == 1
    segs = spool.published_segments(tmp_path, names.SPOOL_REQUESTS)
    assert [p.name for p in segs] == [name, "0000000000001-host-7-abcd-000003001.jsonl"]
    lines = [e.to_json() for p in segs for e in spool.read_segment(p, names.SPOOL_REQUESTS)]
    assert lines == published + left  # nothing lost
    pattern = re.compile(r"^\d+-(.+-\d+-[0-9A-Za-z]+)-\d+\.jsonl$")  # the stream job's writer pattern
    assert {pattern.match(p.name).group(1) for p in segs} == {"host-7-abcd"}


def test_corrupt_lines_reported_with_file_and_line(tmp_path: Path) -> None:
    d = tmp_path / names.SPOOL_REQUESTS
    d.mkdir()
    good = make_event(0, 1).to_json()
    seg = d / "0000000000001-host-1-abcd-000000.jsonl"
    bad_type = json.loads(good)
    bad_type["ttft_ms"] = "fast"
    lines = [good, "{not json", json.dumps(bad_type), good, "\ufeff" + good, " \t\r", "\x1c" + good]
    seg.write_bytes("\n".join(lines).encode() + b"\n" + good.encode()[:-1] + b"\xff}\n" + good[:20].encode())
    items = list(spool.read_segment(seg, names.SPOOL_REQUESTS))
    bad = [i for i in items if isinstance(i, spool.BadLine)]
    assert [b.line_no for b in bad] == [2, 3, 5, 7, 8, 9]  # line 6 is blank
    assert str(bad[0]).startswith(f"{seg}:2: RequestEvent.<record>: not valid JSON")
    assert "RequestEvent.ttft_ms: expected number" in bad[1].reason
    assert "byte-order mark" in bad[2].reason
    assert "not valid JSON" in bad[3].reason  # U+001C is whitespace to Python's str.strip, not to JSON
    assert "not valid UTF-8" in bad[4].reason and bad[4].raw.endswith("\ufffd}")
    assert "truncated" in bad[5].reason
    assert sum(1 for i in items if isinstance(i, RequestEvent)) == 2


def test_recover_publishes_abandoned_segment_without_partial_line(tmp_path: Path) -> None:
    w = spool.SpoolWriter(tmp_path, names.SPOOL_REQUESTS, max_segment_age_s=3600, background=False)
    w.write(make_event(0, 1))
    w.write(make_event(0, 2))
    w._file.flush()
    w._file.write(b'{"partial')  # a writer killed mid-line
    w._file.flush()
    path = w._path
    assert path is not None
    old = time.time() - 120
    os.utime(path, (old, old))
    assert spool.recover(tmp_path, names.SPOOL_REQUESTS, older_than_s=60) == 1
    items = [i for p in spool.published_segments(tmp_path, names.SPOOL_REQUESTS) for i in spool.read_segment(p, names.SPOOL_REQUESTS)]
    assert [i.ts_ms for i in items] == [1_700_000_000_001, 1_700_000_000_002]


def test_invalid_event_is_refused_before_writing(tmp_path: Path) -> None:
    import dataclasses

    from llmsla.events import EventError

    with spool.SpoolWriter(tmp_path, names.SPOOL_REQUESTS) as w:
        with pytest.raises(EventError, match="ttft_ms"):
            w.write(dataclasses.replace(make_event(0, 1), ttft_ms=99.0))
        w.write(make_event(0, 2))
    items = [i for p in spool.published_segments(tmp_path, names.SPOOL_REQUESTS) for i in spool.read_segment(p, names.SPOOL_REQUESTS)]
    assert len(items) == 1
