"""The receiver's policy file: the built-in one loads, every mistake names file, line and field."""

from __future__ import annotations

from pathlib import Path

import pytest

from llmsla.alerting import policy
from llmsla.app.cli import main
from llmsla.yamlsrc import SourceError, load_docs

from .harness import POLICY


def test_builtin_and_test_policies_load() -> None:
    p = policy.load()
    assert [r.name for r in p.rules] == ["replica-page", "class-burn", "pool-burn", "replica-forecast-long",
                                         "pool-forecast-long", "replica-forecast", "pool-forecast"]
    page = {"scope": "replica", "severity": "page", "source": "burn_rate", "pool": "p", "replica": "r1"}
    assert p.match(page).target_key(page) == "replica:p/r1"
    assert p.match({**page, "scope": "pool"}).name == "pool-burn"  # no class label: the pool's rule
    cls = p.match({**page, "scope": "pool", "class": "batch"})
    assert cls.name == "class-burn" and cls.target_key({**page, "class": "batch"}) == "class:p/batch"
    assert cls.shed.step == 0.25 and cls.shed.max_share == 1.0
    assert p.match({**page, "scope": "pool", "class": ""}).name == "pool-burn"  # "*" needs a value
    assert p.match({**page, "scope": "pool", "severity": "ticket"}) is None  # tickets are for people
    assert p.match({"scope": "pool", "source": "forecaster", "severity": "ticket"}).name == "pool-forecast"
    fc = p.match({"scope": "replica", "source": "forecaster", "severity": "ticket"})
    assert fc.name == "replica-forecast" and fc.deweight_to == 0.5 and fc.drain_after_s is None  # never drains
    assert p.hold_down(1) == 600 and p.hold_down(2) == 1200 and p.hold_down(9) == 3600
    # a forecast minutes ahead takes the slower action (student share of the pool), one seconds
    # ahead (or from a one-horizon model) the routing rule
    for h in ("2m", "5m", "10m"):
        rep = {"scope": "replica", "source": "forecaster", "severity": "ticket", "pool": "p", "replica": "r1",
               "horizon": h}
        long = p.match(rep)
        assert long.name == "replica-forecast-long" and long.target_key(rep) == "pool:p"
        assert long.student_share.max_pct == 20 and long.deweight_to is None
        assert p.match({**rep, "scope": "pool"}).name == "pool-forecast-long"
    for h in ("30s", "25s"):
        rep = {"scope": "replica", "source": "forecaster", "severity": "ticket", "horizon": h}
        assert p.match(rep).name == "replica-forecast" and p.match({**rep, "scope": "pool"}).name == "pool-forecast"
    assert policy.parse(next(load_docs(POLICY, "x"))).rules[1].student_share.max_pct == 20


@pytest.mark.parametrize(("old", "new", "message"), [
    ("    deweight_to: 0.25", "    deweight_to: 1.5", "x.yaml:14: rules[0].deweight_to: must be a number in (0, 1]"),
    ("    target: replica", "    target: node", "x.yaml:13: rules[0].target: expected 'replica', 'pool' or 'class'"),
    ("    restore_weights: [0.25, 0.5, 1.0]", "    restore_weights: [0.5, 0.25]",
     "x.yaml:16: rules[0].restore_weights: strictly increasing fractions"),
    ("  hold_down_s: 10", "  hold_down: 10", "x.yaml:4: timing.hold_down: unknown field"),
    ("    student_share: {step_pct: 10, max_pct: 20, step_s: 5}", "    student_share: {step_pct: 10}",
     "x.yaml:21: rules[1].student_share: missing field 'max_pct'"),
    ("    deweight_to: 0.25", "    student_share: {step_pct: 1, max_pct: 2}",
     "x.yaml:14: rules[0].student_share: not a field of a replica rule"),
    ("  - name: pool-burn", "  - name: replica-page", "x.yaml:18: rules[1].name: duplicate rule name"),
    ("  max_drained_fraction: 0.5", "  max_drained_fraction: 2", "x.yaml:8: safety.max_drained_fraction: must be"),
    ("kind: ReceiverPolicy", "kind: Policy", "x.yaml:2: kind: expected 'ReceiverPolicy'"),
])
def test_policy_errors_name_file_line_and_field(old: str, new: str, message: str) -> None:
    assert old in POLICY
    with pytest.raises(SourceError) as exc:
        policy.parse(next(load_docs(POLICY.replace(old, new), "x.yaml")))
    assert message in str(exc.value)


def test_check_policy_cli(tmp_path: Path, capsys) -> None:
    good = tmp_path / "p.yaml"
    good.write_text(POLICY)
    assert main(["receiver", "--action-policy", str(good), "--check-policy"]) == 0
    assert "OK, 2 rules (replica-page, pool-burn)" in capsys.readouterr().out
    good.write_text(POLICY.replace("drain_after_s: 5", "drain_after_s: soon"))
    assert main(["receiver", "--action-policy", str(good), "--check-policy"]) == 2
    assert f"{good}:15: rules[0].drain_after_s: expected int or float, got str 'soon'" in capsys.readouterr().err
