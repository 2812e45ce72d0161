"""The ``EngineSample`` contract: its JSON Schema (an independent validator) and ours agree, the
histogram and list fields are checked, the spool takes the kind, the stream job does not."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from prometheus_client import CollectorRegistry

from llmsla import events, names, spool
from llmsla.events import EngineSample, EventError

ROOT = Path(__file__).resolve().parents[2]


def good() -> dict[str, Any]:
    return {
        "v": 1, "ts_ms": 1700000000000, "replica": "r0", "pool": "default", "engine": "vllm",
        "waiting": 3.0, "running": 5.0, "kv_usage": 0.5, "kv_blocks_total": 2000, "kv_block_size": 16,
        "kv_capacity_tokens": 32000, "preemptions_total": 5.0, "prefix_cache_hits_total": 500.0,
        "prefix_cache_queries_total": 2000.0, "prefix_cache_hit_rate": 0.25, "lora_adapters": ["a", 'b"\\'],
        "counter_reset": 0,
        "ttft": {"le": [0.1, 0.5, 1.0], "counts": [1, 3, 4], "sum": 1.25, "count": 5},
        "itl": None, "e2e": None, "queue": {"le": [], "counts": [], "sum": 0.0, "count": 0},
    }


def test_schema_on_disk_is_current_and_agrees() -> None:
    schema = events.json_schema(EngineSample)
    path = ROOT / "deploy" / "schemas" / "EngineSample.v1.json"
    assert json.loads(path.read_text()) == schema
    jsonschema.validate(good(), schema)
    ev = EngineSample.from_dict(good())
    assert EngineSample.from_json(ev.to_json()) == ev
    nulls = {f.name: None for f in EngineSample.FIELDS if f.nullable}
    jsonschema.validate({**good(), **nulls}, schema)
    EngineSample.from_dict({**good(), **nulls})


@pytest.mark.parametrize("field, value", [
    ("engine", "tgi"),
    ("kv_usage", 1.5),
    ("waiting", -1),
    ("counter_reset", 2),
    ("lora_adapters", "a,b"),
    ("lora_adapters", [""]),
    ("lora_adapters", ["x" * 300]),
    ("ttft", {"le": [0.1, 0.5], "counts": [1], "sum": 1.0, "count": 1}),  # lengths differ (ours only)
    ("ttft", {"le": [0.5, 0.1], "counts": [1, 2], "sum": 1.0, "count": 2}),  # bounds not increasing (ours)
    ("ttft", {"le": [0.1, 0.5], "counts": [2, 1], "sum": 1.0, "count": 2}),  # not cumulative (ours)
    ("ttft", {"le": [0.1], "counts": [3], "sum": 1.0, "count": 2}),  # count below the last bucket (ours)
    ("ttft", {"le": [0.1], "counts": [-1], "sum": 1.0, "count": 2}),
    ("ttft", {"le": [0.1], "counts": [1], "sum": 1.0}),
    ("ttft", {"le": [0.1], "counts": [1], "sum": 1.0, "count": 1, "extra": 1}),
    ("ttft", [1, 2]),
    ("replica", ""),
])
def test_bad_values_are_refused(field: str, value: Any) -> None:
    with pytest.raises(EventError) as err:
        EngineSample.from_dict({**good(), field: value})
    assert err.value.field.startswith(field)
    schema_only_misses = field == "ttft" and isinstance(value, dict) and set(value) == set(events.HIST_KEYS) \
        and all(isinstance(x, int | float) and x >= 0 for x in value["counts"])
    if not schema_only_misses:  # cross-item rules are ours only; the rest the schema states too
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate({**good(), field: value}, events.json_schema(EngineSample))


def test_spool_takes_engine_samples_and_the_stream_job_windows_them(tmp_path: Path) -> None:
    assert names.SPOOL_ENGINE in names.SPOOL_ALL_KINDS and names.SPOOL_ENGINE not in names.SPOOL_KINDS
    assert events.ALL_EVENT_TYPES[names.SPOOL_ENGINE] is EngineSample  # the job's columns derive from it
    assert names.SPOOL_ENGINE not in events.EVENT_TYPES  # the forecaster's in-memory windows do not read it
    w = spool.SpoolWriter(tmp_path, names.SPOOL_ENGINE, registry=CollectorRegistry())
    w.write_line(EngineSample.from_dict(good()).to_json())
    w.close()
    [seg] = spool.published_segments(tmp_path, names.SPOOL_ENGINE)
    [ev] = list(spool.read_segment(seg, names.SPOOL_ENGINE))
    assert ev == EngineSample.from_dict(good())
    # the job's SQL builds for every kind, the engine samples' included
    from llmsla import config as config_mod
    from llmsla.streaming import sql

    job = sql.build(config_mod.Config(), bounded=True)
    assert any("spool_engine" in d for d in job.ddl)  # windowed into engine_windows
