"""OpenAPI documents: committed = served, and schemathesis fuzzes both APIs over real HTTP.

Checks on every generated request (valid and invalid by the schema, with and without the token):
no 5xx at all, every 4xx is JSON with a non-empty ``error`` reason, and the receiver's audit log
only holds rows of posts it answered 200.
"""

from __future__ import annotations

import asyncio
import json
import threading
from pathlib import Path

import requests
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode

from llmsla.alerting import openapi as receiver_openapi
from llmsla.control import openapi as control_openapi

from .harness import AUTH, CONTROL_TOKEN, harness, migrated

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = 15


class Served:
    """The harness (receiver + control API) running on its own event loop in a thread."""

    def __init__(self, dsn: str) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self._cm = harness(dsn)
        self.h = asyncio.run_coroutine_threadsafe(self._cm.__aenter__(), self.loop).result(30)

    def close(self) -> None:
        asyncio.run_coroutine_threadsafe(self._cm.__aexit__(None, None, None), self.loop).result(30)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


def test_served_documents_are_the_rendered_ones(pg_dsn: str) -> None:
    """(The committed copies equal the render: tests/test_generated.py.)"""
    srv = Served(migrated(pg_dsn))
    try:
        assert requests.get(srv.h.url + "/openapi.json", timeout=5).json() == receiver_openapi.document()
        assert requests.get(srv.h.control_url + "/openapi.json", timeout=5).json() == control_openapi.document()
    finally:
        srv.close()


def _check(resp: requests.Response, where: str) -> None:
    assert resp.status_code < 500, f"{where}: {resp.status_code} {resp.text[:300]}"
    if 400 <= resp.status_code < 500:
        body = resp.json()
        err = body.get("error") if isinstance(body, dict) else None
        assert isinstance(err, dict) and isinstance(err.get("message"), str) and err["message"].strip(), \
            f"{where}: {resp.status_code} without a reason: {resp.text[:300]}"


def _run(strategy, mode: GenerationMode, base_url: str, session: requests.Session,
         token_header: dict[str, str]) -> int:
    """``EXAMPLES`` generated requests for one operation and mode; the number sent."""
    calls = 0

    @settings(max_examples=EXAMPLES, deadline=None, database=None, derandomize=True,
              suppress_health_check=list(HealthCheck))
    @given(case=strategy, auth=st.booleans())
    def run(case, auth: bool) -> None:  # noqa: ANN001 - a schemathesis Case
        nonlocal calls
        resp = case.call(base_url=base_url, session=session, headers=token_header if auth else {}, timeout=10)
        calls += 1
        _check(resp, f"{case.method} {case.formatted_path} ({mode.name}, auth={auth})")

    run()
    return calls


def _fuzz(doc: dict, base_url: str, token_header: dict[str, str]) -> int:
    schema = schemathesis.openapi.from_dict(doc)
    session = requests.Session()
    calls = 0
    for result in schema.get_all_operations():
        op = result.ok()
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
            try:
                calls += _run(op.as_strategy(generation_mode=mode), mode, base_url, session, token_header)
            except Unsatisfiable:
                # nothing in this operation can be made invalid (no parameters, no body)
                assert mode is GenerationMode.NEGATIVE, op.label
    return calls


def test_fuzz_receiver_and_control_api(pg_dsn: str) -> None:
    srv = Served(migrated(pg_dsn))
    try:
        n_recv = _fuzz(receiver_openapi.document(), srv.h.url, AUTH)
        n_ctl = _fuzz(control_openapi.document(), srv.h.control_url, {"Authorization": f"Bearer {CONTROL_TOKEN}"})
        assert n_recv >= 60 and n_ctl >= 200
        # the audit log holds alert rows only for posts that were answered 200 (each alert once per
        # delivery), and every action row belongs to a target an accepted alert pointed at
        rows = srv.h.rows()
        targets = {r["target"] for r in rows if r["action"] == "alert"}
        assert all(r["target"] in targets for r in rows if r["action"] != "alert")
        assert all(r["dedupe_key"] for r in rows if r["action"] == "alert")
        print(json.dumps({"receiver_calls": n_recv, "control_calls": n_ctl, "audit_rows": len(rows)}))
    finally:
        srv.close()
