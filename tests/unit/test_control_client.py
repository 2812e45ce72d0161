"""The control API client's answer as a caller sees it (no network: Results by hand)."""

from __future__ import annotations

from llmsla.control_client import ControlClient, Result


def test_describe_names_status_url_and_the_servers_reason() -> None:
    res = Result(False, 409, {"error": "last healthy replica"}, 1, 3.0, "http://c/v1/replicas/r1/drain",
                 "last healthy replica", refused=True)
    assert res.describe() == "HTTP 409 from http://c/v1/replicas/r1/drain: last healthy replica"
    assert Result(False, 0, None, 3, 3.0, "http://c/x", "ClientConnectorError: refused").describe() == (
        "no answer from http://c/x: ClientConnectorError: refused")


def test_the_timeout_and_actor_are_the_callers() -> None:
    """ab report must not borrow the receiver's settings: both are per client."""
    c = ControlClient(["http://c"], "t" * 16, timeout_s=7.5, actor="llmsla ab report")
    assert (c.timeout_s, c.actor, ControlClient(["http://c"], "t").actor) == (7.5, "llmsla ab report", "alert-receiver")
