"""The receiver's class rule against a real control API and the real store: a class page sheds
the classes below it step by step while it fires, and steps back down after the hold-down; the
protected class is never shed; a page it cannot act on is audited. The clock is the test's."""

from __future__ import annotations

import asyncio

import pytest

from llmsla.alerting import policy
from llmsla.yamlsrc import SourceError, load_docs

from .harness import alert, harness, migrated, note

POLICY = """\
apiVersion: llmsla/v1
kind: ReceiverPolicy
timing:
  hold_down_s: 10
  max_hold_down_s: 40
  backoff_reset_s: 100
safety:
  rate_limit: {actions: 20, per_s: 60}
rules:
  - name: class-burn
    match: {scope: pool, severity: page, source: burn_rate}
    target: class
    shed: {step: 0.25, max_share: 0.75, step_s: 5}
  - name: pool-forecast
    match: {scope: pool, source: forecaster}
    target: class
    shed: {step: 0.5, max_share: 0.5, step_s: 5, protect: interactive}
"""


def _page(status: str = "firing", cls: str | None = "interactive", **kw: str) -> dict:
    labels = {"class": cls} if cls is not None else {}
    return alert(status, replica=None, scope="pool", severity="page", **labels, **kw)


def _shed_rows(h) -> list[tuple]:
    return [(r["decision"], r["outcome"], r["params"]["request"]["classes"])
            for r in h.rows("source = 'alert_receiver' AND action = 'set_shed'")]


def test_a_class_page_sheds_the_classes_below_it_step_by_step_and_back(pg_dsn: str) -> None:
    async def main() -> None:
        async with harness(migrated(pg_dsn), policy_text=POLICY) as h:
            page = _page()
            status, body = await h.post(note(page))
            assert status == 200, body
            (res,) = body["results"]
            assert (res["decision"], res["target"]) == ("act", "class:default/interactive")
            share = lambda c: h.shed.share("default", c)  # noqa: E731
            assert (share("interactive"), share("batch"), share("sheddable")) == (0.0, 0.25, 0.25)
            assert await h.tick(4.9) == 0  # step_s = 5
            assert await h.tick(0.2) == 1 and share("batch") == 0.5
            status, body = await h.post(note(page))  # Alertmanager's repeat: a duplicate
            assert body["results"][0]["decision"] == "duplicate" and share("batch") == 0.5
            assert await h.tick(5.1) == 1 and share("batch") == 0.75
            assert await h.tick(5.1) == 0 and share("batch") == 0.75  # max_share
            assert share("interactive") == 0.0
            # resolved: hold-down 10 s (hysteresis), then a step down every 5 s
            status, body = await h.post(note(_page("resolved")))
            assert body["results"][0]["decision"] == "resolved"
            assert await h.tick(9.0) == 0 and share("batch") == 0.75
            assert await h.tick(1.5) == 1 and share("batch") == 0.5 and share("sheddable") == 0.5
            assert await h.tick(2.0) == 0
            assert await h.tick(3.1) == 1 and share("batch") == 0.25
            assert await h.tick(5.1) == 1 and share("batch") == 0.0 and not h.shed.active
            assert await h.tick(60) == 0
            states = await h.engine.journal.states()
            assert states["class:default/interactive"]["stage"] == "normal"
            both = lambda x: {"batch": x, "sheddable": x}  # noqa: E731
            assert _shed_rows(h) == [
                ("shed", "applied", both(0.25)), ("shed", "applied", both(0.5)), ("shed", "applied", both(0.75)),
                ("unshed", "applied", both(0.5)), ("unshed", "applied", both(0.25)), ("unshed", "applied", both(0.0)),
            ]
            assert "TtftErrorBudgetBurn/page" in h.rows("source = 'alert_receiver' AND action = 'set_shed'")[0]["reason"]
        # the control API audited the same six changes, with the receiver as actor
        assert h.shed.audit.flush(10)
        ctl = h.rows("source = 'control_api' AND action = 'set_shed'")
        assert [(r["actor"], r["outcome"], r["target"]) for r in ctl] == [("alert-receiver", "applied", "default")] * 6
        assert [r["params"]["after"] for r in ctl][-1] == {}  # stepped all the way back down

    asyncio.run(main())


def test_pages_that_cannot_shed_are_audited_and_change_nothing(pg_dsn: str) -> None:
    async def main() -> None:
        async with harness(migrated(pg_dsn), policy_text=POLICY) as h:
            # a page without a class label: the class rule has no target (unroutable), no shed
            status, body = await h.post(note(_page(cls=None)))
            assert body["results"][0]["decision"] == "unroutable"
            assert "no 'class' label" in body["results"][0]["reason"]
            # the least protected class: nothing below it to shed, refused for good
            status, body = await h.post(note(_page(cls="sheddable", slo="e2e")))
            assert body["results"][0]["decision"] == "act" and body["results"][0]["actions"] == []
            # a class the control API does not know
            status, body = await h.post(note(_page(cls="gold", slo="avail")))
            assert body["results"][0]["actions"] == []
            assert not h.shed.active
            await h.tick(30)
            assert not h.shed.active
            refused = [(r["target"], r["outcome"], r["reason"])
                       for r in h.rows("source = 'alert_receiver' AND action = 'set_shed'")]
            assert [(t, o) for t, o, _ in refused] == [("class:default/sheddable", "refused"),
                                                      ("class:default/gold", "refused")]
            assert "no class below it" in refused[0][2] and "not one of the control API's classes" in refused[1][2]
            # a batch page sheds only sheddable: never interactive, never batch itself
            status, body = await h.post(note(_page(cls="batch", slo="ttft-batch")))
            assert [a["action"] for a in body["results"][0]["actions"]] == ["set_shed"]
            assert h.shed.snapshot()["pools"]["default"] == {"sheddable": 0.25}

    asyncio.run(main())


def test_a_forecaster_warning_for_a_pool_sheds_below_the_protected_class(pg_dsn: str) -> None:
    async def main() -> None:
        async with harness(migrated(pg_dsn), policy_text=POLICY) as h:
            fc = alert("firing", replica=None, scope="pool", severity="ticket", source="forecaster",
                       alertname="SloBreachForecast")
            status, body = await h.post(note(fc))
            assert body["results"][0]["target"] == "class:default/interactive"
            assert h.shed.snapshot()["pools"]["default"] == {"batch": 0.5, "sheddable": 0.5}
            await h.tick(30)  # max_share reached: no more steps
            assert h.shed.share("default", "batch") == 0.5

    asyncio.run(main())


@pytest.mark.parametrize(("old", "new", "message"), [
    ("    shed: {step: 0.25, max_share: 0.75, step_s: 5}\n", "",
     "x.yaml:10: rules[0]: a class rule needs shed"),
    ("step: 0.25, max_share", "step: 0, max_share", "x.yaml:13: rules[0].shed.step: must be a number in (0, 1]"),
    ("max_share: 0.75", "max_share: 1.5", "rules[0].shed.max_share: must be a number in (0, 1]"),
    ("step_s: 5}\n  - name: pool-forecast", "step_s: 5, protect: 'a b'}\n  - name: pool-forecast",
     "rules[0].shed.protect: a class name"),
    ("    target: class\n    shed: {step: 0.25", "    target: pool\n    shed: {step: 0.25",
     "rules[0].shed: not a field of a pool rule"),
])
def test_class_rule_errors_name_file_line_and_field(old: str, new: str, message: str) -> None:
    assert old in POLICY
    with pytest.raises(SourceError) as exc:
        policy.parse(next(load_docs(POLICY.replace(old, new), "x.yaml")))
    assert message in str(exc.value)
