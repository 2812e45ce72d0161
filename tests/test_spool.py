"""Spool: several writer processes and a concurrent reader lose nothing and never see a partial
line; rotation, the disk bound, recovery and corrupt-line reporting."""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import re
import threading
import time
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

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


def test_disk_bound_is_retried_then_dropped_and_counted(tmp_path: Path) -> None:
    """Past ``max_total_bytes`` a write is retried for ``retry_s`` and only then dropped, every
    dropped event counted (the counter, ``dropped``, the drop record): written + dropped = sent."""
    registry = CollectorRegistry()
    w = spool.SpoolWriter(tmp_path, names.SPOOL_REQUESTS, max_segment_bytes=4096, max_total_bytes=20_000,
                          retry_s=0.2, registry=registry)
    sent = 200
    for i in range(sent):
        w.write(make_event(0, i))  # never raises: the bound is an accounted drop, not a crash
    time.sleep(0.5)
    w.close()
    read = sum(1 for p in spool.published_segments(tmp_path, names.SPOOL_REQUESTS)
               for _ in spool.read_segment(p, names.SPOOL_REQUESTS))
    dropped = w.dropped[names.SPOOL_DROP_LIMIT]
    assert read > 0 and dropped > 0 and read + dropped == sent
    counted = registry.get_sample_value(f"{names.SPOOL_DROPPED}_total",
                                        {names.L_KIND: names.SPOOL_REQUESTS, names.L_REASON: names.SPOOL_DROP_LIMIT})
    assert counted == dropped
    (record,) = spool.drop_records(tmp_path)
    assert record["dropped"][names.SPOOL_DROP_LIMIT] == dropped and "is full" in record["last_error"]
    # after the consumer prunes, writing works again
    assert spool.prune(tmp_path, names.SPOOL_REQUESTS, older_than_s=-1) > 0
    with spool.SpoolWriter(tmp_path, names.SPOOL_REQUESTS, max_total_bytes=20_000) as w2:
        w2.write(make_event(0, 0))
    assert w2.dropped == dict.fromkeys(names.SPOOL_DROP_REASONS, 0)


def test_disk_bound_cleared_within_the_retry_window_loses_nothing(tmp_path: Path) -> None:
    w = spool.SpoolWriter(tmp_path, names.SPOOL_REQUESTS, max_segment_bytes=4096, max_total_bytes=20_000,
                          retry_s=30, registry=CollectorRegistry())
    sent = 0
    while w._failing_since is None:  # up to the bound, then 20 more: held and retried
        w.write(make_event(0, sent))
        sent += 1
    for _ in range(20):
        w.write(make_event(0, sent))
        sent += 1
    first = spool.published_segments(tmp_path, names.SPOOL_REQUESTS)
    kept = [e for p in first for e in spool.read_segment(p, names.SPOOL_REQUESTS)]
    for p in first:  # the consumer catches up
        p.unlink()
    time.sleep(1.5)
    w.close()
    later = [e for p in spool.published_segments(tmp_path, names.SPOOL_REQUESTS)
             for e in spool.read_segment(p, names.SPOOL_REQUESTS)]
    assert sum(w.dropped.values()) == 0
    assert sorted(e.ts_ms for e in kept + later) == [make_event(0, i).ts_ms for i in range(sent)]


def test_start_up_refuses_a_spool_over_its_bound(tmp_path: Path) -> None:
    d = tmp_path / names.SPOOL_REQUESTS
    d.mkdir()
    (d / "0000000000001-h-1-abcd-000000.jsonl").write_bytes(b"x" * 30_000)
    with pytest.raises(spool.SpoolFullError, match="is full: 30000 bytes used of spool.max_total_bytes = 20000"):
        spool.SpoolWriter(tmp_path, names.SPOOL_REQUESTS, max_total_bytes=20_000)


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


def test_writer_thread_survives_an_error_and_keeps_publishing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A bug in the background publish is caught and counted; the thread goes on."""
    w = spool.SpoolWriter(tmp_path, names.SPOOL_REQUESTS, max_segment_age_s=0.1, registry=CollectorRegistry())
    real = w._drain_locked
    calls = {"n": 0}

    def flaky(now: float, *, publish: bool = False) -> None:
        if threading.current_thread() is w._thread:
            calls["n"] += 1
            if calls["n"] == 1:
                raise RuntimeError("boom")
        real(now, publish=publish)

    monkeypatch.setattr(w, "_drain_locked", flaky)
    w.write(make_event(0, 1))
    deadline = time.time() + 5
    while time.time() < deadline and not spool.published_segments(tmp_path, names.SPOOL_REQUESTS):
        time.sleep(0.05)
    assert w.tick_errors >= 1 and w._thread is not None and w._thread.is_alive()
    assert len(spool.published_segments(tmp_path, names.SPOOL_REQUESTS)) == 1
    w.close()


def _read_ids(root: Path) -> list[str]:
    out = []
    for p in spool.published_segments(root, names.SPOOL_REQUESTS):
        for item in spool.read_segment(p, names.SPOOL_REQUESTS):
            assert not isinstance(item, spool.BadLine), item
            out.append(item.trace_id)
    return out


def _hammer(w: spool.SpoolWriter, threads: int, per: int) -> None:
    def body(t: int) -> None:
        for i in range(per):
            w.write(make_event(t, i))

    ts = [threading.Thread(target=body, args=(t,)) for t in range(threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()


def test_many_threads_one_writer_every_line_once_and_whole(tmp_path: Path) -> None:
    """Eight threads share a writer with small segments while its background thread publishes
    by age: every line is published exactly once and whole; the smallest pending bound (one
    write buffer) drops nothing while writes succeed."""
    registry = CollectorRegistry()
    w = spool.SpoolWriter(tmp_path, names.SPOOL_REQUESTS, max_segment_bytes=16_384, max_segment_age_s=0.02,
                          max_pending_bytes=1 << 16, registry=registry)
    _hammer(w, 8, 2000)
    w.close()
    ids = _read_ids(tmp_path)
    assert sorted(ids) == sorted(make_event(t, i).trace_id for t in range(8) for i in range(2000))
    assert w.dropped == dict.fromkeys(names.SPOOL_DROP_REASONS, 0) and w.tick_errors == 0
    assert not list((tmp_path / names.SPOOL_REQUESTS / spool.INPROGRESS).iterdir())
    assert all(p.stat().st_size <= 16_384 for p in spool.published_segments(tmp_path, names.SPOOL_REQUESTS))
    assert spool.drop_records(tmp_path) == [] and not list((tmp_path / names.SPOOL_REQUESTS / spool.DROPPED).iterdir())


def test_the_smallest_pending_bound_drops_nothing_while_writes_work(tmp_path: Path) -> None:
    """``max_pending_bytes`` bounds what is held while writes fail, never the write buffer of a
    healthy writer (at its minimum, one buffer, a line must not tip it over)."""
    with spool.SpoolWriter(tmp_path, names.SPOOL_REQUESTS, max_segment_age_s=3600, max_pending_bytes=1 << 16,
                           registry=CollectorRegistry()) as w:
        for i in range(2000):
            w.write(make_event(0, i))
    assert w.dropped == dict.fromkeys(names.SPOOL_DROP_REASONS, 0)
    assert len(_read_ids(tmp_path)) == 2000


def test_many_threads_past_the_bound_published_plus_dropped_is_sent(tmp_path: Path) -> None:
    registry = CollectorRegistry()
    w = spool.SpoolWriter(tmp_path, names.SPOOL_REQUESTS, max_segment_bytes=8192, max_segment_age_s=0.02,
                          max_total_bytes=100_000, retry_s=0.1, max_pending_bytes=1 << 16, registry=registry)
    _hammer(w, 8, 1000)
    w.close()
    ids = _read_ids(tmp_path)
    assert len(ids) == len(set(ids)) > 0
    dropped = w.dropped[names.SPOOL_DROP_LIMIT]
    assert dropped > 0 and len(ids) + dropped == 8000
    assert registry.get_sample_value(f"{names.SPOOL_DROPPED}_total", {
        names.L_KIND: names.SPOOL_REQUESTS, names.L_REASON: names.SPOOL_DROP_LIMIT}) == dropped
    (record,) = spool.drop_records(tmp_path)
    assert record["dropped"] == w.dropped


def test_a_segment_that_cannot_be_published_is_counted_at_close(tmp_path: Path) -> None:
    """A rename that fails to the end (here: a directory holds the segment's name) leaves the
    segment in .inprogress, its lines counted as dropped; ``spool recover`` still publishes it,
    under a fresh name."""
    w = spool.SpoolWriter(tmp_path, names.SPOOL_REQUESTS, max_segment_age_s=3600, background=False,
                          retry_s=0.2, registry=CollectorRegistry())
    for i in range(7):
        w.write(make_event(0, i))
    w._drain_locked(time.monotonic())  # written into the open segment, not published
    assert w._path is not None
    name = w._path.name
    (tmp_path / names.SPOOL_REQUESTS / name).mkdir()
    w.close()
    assert w.dropped[names.SPOOL_DROP_IO_ERROR] == 7
    assert (tmp_path / names.SPOOL_REQUESTS / spool.INPROGRESS / name).is_file()
    (record,) = spool.drop_records(tmp_path)
    assert record["dropped"][names.SPOOL_DROP_IO_ERROR] == 7
    assert spool.recover(tmp_path, names.SPOOL_REQUESTS, older_than_s=0) == 1
    (tmp_path / names.SPOOL_REQUESTS / name).rmdir()  # the blocker (not a segment: item 8's business)
    assert sorted(_read_ids(tmp_path)) == sorted(make_event(0, i).trace_id for i in range(7))


def test_a_forked_child_never_writes_the_parents_lines(tmp_path: Path) -> None:
    """Lines the parent buffered before a fork are the parent's: a child that writes and closes
    publishes only its own, under its own writer name."""
    w = spool.SpoolWriter(tmp_path, names.SPOOL_REQUESTS, max_segment_age_s=3600, background=False)
    for i in range(5):
        w.write(make_event(0, i))  # buffered in memory, not yet written
    pid = os.fork()
    if pid == 0:  # the child
        code = 0
        try:
            w.write(make_event(1, 0))
            w.close()
        except BaseException:  # noqa: BLE001 - report through the exit status
            code = 1
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    w.close()
    ids = _read_ids(tmp_path)
    assert sorted(ids) == sorted([make_event(0, i).trace_id for i in range(5)] + [make_event(1, 0).trace_id])
    pattern = re.compile(r"^\d+-(.+-\d+-[0-9A-Za-z]+)-\d+\.jsonl$")
    assert len({pattern.match(p.name).group(1) for p in spool.published_segments(tmp_path, names.SPOOL_REQUESTS)}) == 2


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
    w._flush_pending_locked()
    path = w._path
    assert path is not None
    with open(path, "ab") as fh:
        fh.write(b'{"partial')  # a writer killed mid-line
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
