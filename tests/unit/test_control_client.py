"""The control API client as its callers configure it (no network)."""

from __future__ import annotations

from llmsla.control_client import ControlClient


def test_the_timeout_and_actor_are_the_callers() -> None:
    """ab report must not borrow the receiver's settings: both are per client."""
    c = ControlClient(["http://c"], "t" * 16, timeout_s=7.5, actor="llmsla ab report")
    assert (c.timeout_s, c.actor, ControlClient(["http://c"], "t").actor) == (7.5, "llmsla ab report", "alert-receiver")
