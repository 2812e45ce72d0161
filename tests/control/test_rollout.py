"""Consistent-hash assignment (llmsla.control.rollout): uniform splits, monotonic ramps, independent
experiments, stability across strategy versions, forced units, rollbacks. scipy's chi-square is the
reference for the distribution claims."""

from __future__ import annotations

import collections

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats

from llmsla import experiments as E
from llmsla import names
from llmsla.control.rollout import (
    OUTSIDE,
    Rollout,
    UnknownExperiment,
    WeightTooLarge,
    hash_prefix,
    point,
)

POOL = "default"


def rollout(arms: dict[str, float], *, coverage: float = 1.0, seed: int = 0, key: str = "exp",
            forced: dict[str, str] | None = None, versions: dict[str, str] | None = None,
            pool: str = POOL) -> Rollout:
    body = {"seed": seed, "coverage": coverage, "pool": pool,
            "arms": {a: {"weight": w, **({"version": versions[a]} if versions and a in versions else {})}
                     for a, w in arms.items()},
            "forced": forced or {}}
    return Rollout(E.parse({key: body}))


def counts(r: Rollout, n: int, prefix: str = "u") -> collections.Counter[str]:
    return collections.Counter(r.assign(POOL, f"{prefix}{i}").label for i in range(n))


@pytest.mark.parametrize(("arms", "coverage"), [
    ({"a": 1, "b": 1}, 1.0),
    ({"control": 9, "treatment": 1}, 1.0),
    ({"a": 1, "b": 1, "c": 2}, 1.0),
    ({"a": 1, "b": 1}, 0.3),
])
def test_split_is_uniform_over_a_million_ids(arms: dict[str, float], coverage: float) -> None:
    n = 1_000_000
    got = counts(rollout(arms, coverage=coverage, seed=12345), n)
    total = sum(arms.values())
    expected = {f"exp:{a}": n * coverage * w / total for a, w in arms.items()}
    if coverage < 1:
        expected[names.DEFAULT_ARM] = n * (1 - coverage)
    assert set(got) == set(expected)
    keys = sorted(expected)
    chi2, p = stats.chisquare([got[k] for k in keys], [expected[k] for k in keys])
    assert p > 0.001, (got, expected, chi2)


@settings(max_examples=30, deadline=None)
@given(weights=st.lists(st.integers(1, 20), min_size=2, max_size=5),
       ramp=st.lists(st.floats(0, 1), min_size=2, max_size=5).map(sorted), seed=st.integers(0, 2**40))
def test_ramping_up_only_adds_units_to_their_own_arm(weights: list[int], ramp: list[float], seed: int) -> None:
    arms = {f"arm{i}": float(w) for i, w in enumerate(weights)}
    units = [f"user-{i}" for i in range(3000)]
    before = {u: names.DEFAULT_ARM for u in units}
    for coverage in ramp:
        r = rollout(arms, coverage=coverage, seed=seed)
        now = {u: r.assign(POOL, u).label for u in units}
        for u in units:
            if before[u] != names.DEFAULT_ARM:
                assert now[u] == before[u], (u, coverage)  # never moved, never dropped
        before = now


def test_two_experiments_are_independent() -> None:
    a = rollout({"a1": 1, "a2": 1}, seed=1, key="first")
    b = rollout({"b1": 1, "b2": 2, "b3": 1}, seed=1, key="second")  # same seed, other key
    table = collections.Counter((a.assign(POOL, f"u{i}").label, b.assign(POOL, f"u{i}").label) for i in range(300_000))
    rows, cols = sorted({k[0] for k in table}), sorted({k[1] for k in table})
    _, p, _, _ = stats.chi2_contingency([[table[(r, c)] for c in cols] for r in rows])
    assert p > 0.001, table
    # and a new seed of the same experiment reshuffles: agreement at chance level only
    c = rollout({"a1": 1, "a2": 1}, seed=2, key="first")
    same = sum(a.assign(POOL, f"u{i}").label == c.assign(POOL, f"u{i}").label for i in range(100_000))
    assert abs(same / 100_000 - 0.5) < 0.01


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2**40), coverage=st.floats(0, 1),
       policy=st.sampled_from(names.ROUTE_POLICIES), schedule=st.sampled_from(names.TEMPERATURE_POLICIES),
       version=st.text("abc123.", min_size=1, max_size=5))
def test_a_new_strategy_version_moves_nobody(seed: int, coverage: float, policy: str, schedule: str, version: str) -> None:
    old = rollout({"control": 1, "treatment": 1}, coverage=coverage, seed=seed, versions={"treatment": "1"})
    spec = {"exp": {"seed": seed, "coverage": coverage, "arms": {
        "control": {}, "treatment": {"version": version, "route_policy": policy,
                                     "schedule": {"name": schedule}, "student_share_pct": 30}}}}
    new = Rollout(E.parse(spec))
    for i in range(2000):
        before, after = old.assign(POOL, f"u{i}"), new.assign(POOL, f"u{i}")
        assert before.arm == after.arm
    t = next(new.assign(POOL, f"u{i}") for i in range(100) if new.assign(POOL, f"u{i}").arm == "treatment") if coverage > 0.1 else None
    if t is not None:
        assert t.version == version and t.strategy.route_policy == policy and t.strategy.schedule.name == schedule


def test_forced_units_and_their_label() -> None:
    r = rollout({"a": 1, "b": 1}, coverage=0.0, forced={"qa-1": "b"})
    got = r.assign(POOL, "qa-1")
    assert (got.arm, got.forced, got.label) == ("b", True, "exp:b:forced")
    assert E.parse_label(got.label) == ("exp", "b", True)
    assert r.assign(POOL, "someone") is OUTSIDE  # coverage 0: nobody else
    r.force("exp", "qa-2", "a")
    assert r.assign(POOL, "qa-2").label == "exp:a:forced"
    r.force("exp", "qa-2", None)
    assert r.assign(POOL, "qa-2") is OUTSIDE
    with pytest.raises(KeyError, match="no arm 'zz'"):
        r.force("exp", "qa-3", "zz")
    assert r.assign("another-pool", "qa-1") is OUTSIDE  # the experiment covers one pool


def test_rollback_moves_only_the_rolled_back_arms_units() -> None:
    r = rollout({"a": 1, "b": 1, "c": 1}, coverage=0.5)
    units = [f"u{i}" for i in range(20_000)]
    before = {u: r.assign(POOL, u).label for u in units}
    rec = r.set_weight("exp", "b", 0, actor="test", reason="p95 regression")
    assert rec["before"] == 1 and rec["after"] == 0 and rec["outcome"] == "applied"
    after = {u: r.assign(POOL, u).label for u in units}
    for u in units:
        assert after[u] == (names.DEFAULT_ARM if before[u] == "exp:b" else before[u])
    assert r.expected_shares("exp") == {"a": 0.5, "b": 0.0, "c": 0.5}
    with pytest.raises(WeightTooLarge, match="configured weight"):
        r.set_weight("exp", "a", 2, actor="test")
    assert r.audit.recent(1)[0]["outcome"] == "refused"
    with pytest.raises(UnknownExperiment):
        r.set_weight("nope", "a", 0, actor="test")
    with pytest.raises(ValueError, match="weight"):
        r.set_weight("exp", "a", -1, actor="test")
    # ramping through the API: the same monotonicity as a config change
    r.set_coverage("exp", 0.9, actor="test")
    ramped = {u: r.assign(POOL, u).label for u in units}
    assert all(ramped[u] == after[u] for u in units if after[u] != names.DEFAULT_ARM)


def test_the_hash_is_a_fixed_function() -> None:
    """Golden values: changing the hash would reshuffle every running experiment."""
    assert point(hash_prefix("exp", 0), "user-1") == 0x20958B0F0206E1C9
    assert point(hash_prefix("checkout", 42), "user-1") == 0xDA851B88AFEC08FA
    r = rollout({"a": 1, "b": 1}, seed=42, key="checkout")
    assert r.assign(POOL, "user-1").label == "checkout:b"  # 0xDA.. is in the upper half
    assert rollout({"a": 1, "b": 1}, seed=0, key="exp").assign(POOL, "user-1").label == "exp:a"


def test_one_enabled_experiment_per_pool_and_errors_name_the_key() -> None:
    two = {"x": {"arms": {"a": {}, "b": {}}}, "y": {"arms": {"a": {}, "b": {}}}}
    with pytest.raises(E.ExperimentError, match=r"ab\.experiments\.y\.enabled: pool 'default' already runs ab\.experiments\.x"):
        E.parse(two)
    two["y"]["enabled"] = False
    assert set(E.parse(two)) == {"x", "y"}
    for body, key in [
        ({"arms": {"a": {}}}, "ab.experiments.x.arms"),
        ({"arms": {"a": {}, "b": {"weight": 0}}}, "ab.experiments.x.arms.b.weight"),
        ({"arms": {"a": {}, "b:c": {}}}, "ab.experiments.x.arms.b:c"),
        ({"arms": {"a": {}, "b": {}}, "coverage": 2}, "ab.experiments.x.coverage"),
        ({"arms": {"a": {}, "b": {}}, "control": "z"}, "ab.experiments.x.control"),
        ({"arms": {"a": {}, "b": {}}, "forced": {"u": "z"}}, "ab.experiments.x.forced.u"),
        ({"arms": {"a": {}, "b": {"schedule": {"name": "linear", "params": {"t_mni": 1}}}}},
         "ab.experiments.x.arms.b.schedule.params"),
        ({"arms": {"a": {}, "b": {}}, "seeed": 1}, "ab.experiments.x.seeed"),
    ]:
        with pytest.raises(E.ExperimentError) as exc:
            E.parse({"x": body})
        assert str(exc.value).startswith(key), (str(exc.value), key)
