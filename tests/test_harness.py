"""The test harness itself: with several test processes (``TEST_WORKERS``), a test marked
``exclusive`` runs with no other test beside it (tests/conftest.py), and without the marker
tests do run side by side, so the check below can fail."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

INNER = """
import json, os, time

import pytest

def _stamp(name, seconds):
    t0 = time.time()
    time.sleep(seconds)
    with open({log!r}, "a") as f:
        f.write(json.dumps([name, t0, time.time()]) + "\\n")

@pytest.mark.parametrize("i", range(9))
def test_shared(i):
    _stamp(f"shared{{i}}", 0.4)

{marker}
@pytest.mark.parametrize("i", range(2))
def test_alone(i):
    _stamp(f"alone{{i}}", 0.8)
"""


def _overlaps(tmp_path: Path, marker: str) -> list[tuple[str, str]]:
    """Run the inner tests in two processes; the pairs (a test of ``test_alone``, another
    test) whose run times overlapped."""
    inner = tmp_path / ("marked" if marker else "plain")
    inner.mkdir()
    (inner / "conftest.py").write_text((Path(__file__).parent / "conftest.py").read_text())
    log = inner / "stamps.jsonl"
    (inner / "test_inner.py").write_text(INNER.format(log=str(log), marker=marker))
    out = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "2",
                          "--dist", "worksteal", "-W", "ignore::pytest.PytestUnknownMarkWarning"],
                         cwd=inner, capture_output=True, text=True, timeout=180)
    assert out.returncode == 0 and "11 passed" in out.stdout, out.stdout + out.stderr
    rows = [json.loads(line) for line in log.read_text().splitlines()]
    assert len(rows) == 11
    return [(a[0], b[0]) for a in rows if a[0].startswith("alone") for b in rows
            if b is not a and b[1] < a[2] and a[1] < b[2]]


def test_an_exclusive_test_runs_alone_among_several_processes(tmp_path: Path) -> None:
    assert _overlaps(tmp_path, "@pytest.mark.exclusive") == []
    assert _overlaps(tmp_path, "") != []  # the same tests unmarked share the machine
