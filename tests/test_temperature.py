"""Temperature policies: closed-form values, bounds, actions and the entropy controller."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from llmsla.events import POLICY_ACTIONS
from llmsla.temperature import (
    TEMPERATURE_POLICIES,
    Decision,
    PolicyParams,
    make_policy,
)
from llmsla.worker.engine import entropy_nats  # the worker computes entropies with torch


def run(name: str, params: PolicyParams, steps: int, entropies=None) -> list[Decision]:
    pol = make_policy(name, params)
    return [pol.decide(s, None if entropies is None else entropies[s]) for s in range(steps)]


def test_constant_is_t_max_and_holds() -> None:
    ds = run("constant", PolicyParams(t_min=0.2, t_max=0.7), 5)
    assert [d.temperature for d in ds] == [0.7] * 5
    assert [d.action for d in ds] == ["set", "hold", "hold", "hold", "hold"]
    assert {d.trigger for d in ds} == {"schedule"}


def test_linear_decay_hand_values() -> None:
    # t_max=1, t_min=0.2, horizon=4: T = 1 - 0.8 * s/4 -> 1, .8, .6, .4, .2, then .2
    ds = run("linear", PolicyParams(t_min=0.2, t_max=1.0, horizon=4), 7)
    assert [round(d.temperature, 12) for d in ds] == [1.0, 0.8, 0.6, 0.4, 0.2, 0.2, 0.2]
    assert [d.action for d in ds] == ["set", "lower", "lower", "lower", "lower", "hold", "hold"]


def test_cosine_annealing_hand_values() -> None:
    # t_min + (t_max - t_min)(1 + cos(pi s/N))/2 with t_min=0, t_max=2, N=4:
    # s=0: 2; s=1: 1 + cos(pi/4) = 1.7071...; s=2: 1; s=3: 1 - cos(pi/4); s=4: 0
    ds = run("cosine", PolicyParams(t_min=0.0, t_max=2.0, horizon=4), 6)
    expected = [2.0, 1 + math.sqrt(0.5), 1.0, 1 - math.sqrt(0.5), 0.0, 0.0]
    assert [d.temperature for d in ds] == pytest.approx(expected, abs=1e-12)


def test_exponential_decay_hand_values() -> None:
    # T = max(t_min, t_max * decay^s): 1, .5, .25, .125 -> clamped at .2 from s=3
    ds = run("exponential", PolicyParams(t_min=0.2, t_max=1.0, decay=0.5), 5)
    assert [d.temperature for d in ds] == pytest.approx([1.0, 0.5, 0.25, 0.2, 0.2])
    assert [d.action for d in ds] == ["set", "lower", "lower", "lower", "hold"]


def test_entropy_adaptive_raises_on_peaked_and_lowers_on_flat() -> None:
    p = PolicyParams(t_min=0.1, t_max=2.0, entropy_target=2.0, entropy_band=0.1, entropy_gain=0.2)
    peaked = torch.full((1, 257), -30.0)
    peaked[0, 7] = 10.0
    flat = torch.zeros((1, 257))
    h_peak, h_flat = entropy_nats(peaked).item(), entropy_nats(flat).item()
    assert h_peak < 0.01 and h_flat == pytest.approx(math.log(257), rel=1e-5)
    # starts at the midpoint 1.05; peaked: T' = 1.05 * exp(0.2 * (2 - h_peak)) ~ 1.57
    pol = make_policy("entropy", p)
    d0 = pol.decide(0, h_peak)
    assert d0.action == "set" and d0.trigger == "entropy_low"
    assert d0.temperature == pytest.approx(1.05 * math.exp(0.2 * (2.0 - h_peak)))
    d1 = pol.decide(1, h_peak)
    assert d1.temperature == pytest.approx(2.0) and d1.action == "raise"  # clamped at t_max
    d2 = pol.decide(2, h_peak)
    assert d2.temperature == 2.0 and d2.action == "hold" and d2.trigger == "entropy_low"
    # flat: lowers by exp(0.2 * (2 - ln 257)) each step down to t_min
    d3 = pol.decide(3, h_flat)
    assert d3.action == "lower" and d3.trigger == "entropy_high"
    assert d3.temperature == pytest.approx(2.0 * math.exp(0.2 * (2.0 - math.log(257))), rel=1e-5)
    for s in range(4, 40):
        d = pol.decide(s, h_flat)
    assert d.temperature == pytest.approx(0.1)
    # inside the band: hold
    d = pol.decide(40, 2.05)
    assert (d.action, d.trigger, d.temperature) == ("hold", "entropy_ok", pytest.approx(0.1))


def test_entropy_nats_matches_numpy_reference() -> None:
    g = torch.Generator().manual_seed(3)
    logits = torch.randn(5, 257, generator=g) * 3
    import numpy as np

    x = logits.double().numpy()
    p = np.exp(x - x.max(axis=1, keepdims=True))
    p /= p.sum(axis=1, keepdims=True)
    ref = -(p * np.log(p)).sum(axis=1)
    assert entropy_nats(logits).numpy() == pytest.approx(ref, rel=1e-5)


def test_bad_params_and_names_are_rejected() -> None:
    with pytest.raises(ValueError, match="t_min"):
        PolicyParams(t_min=2.0, t_max=1.0)
    with pytest.raises(ValueError, match="decay"):
        PolicyParams(decay=0.0)
    with pytest.raises(ValueError, match="unknown temperature policy 'nope'"):
        make_policy("nope", PolicyParams())
    with pytest.raises(ValueError, match="entropy"):
        make_policy("entropy", PolicyParams()).decide(0, None)


@settings(max_examples=150, deadline=None)
@given(
    name=st.sampled_from(TEMPERATURE_POLICIES),
    t_min=st.floats(0, 2),
    span=st.floats(0, 2),
    horizon=st.integers(1, 300),
    decay=st.floats(0.01, 1.0),
    target=st.floats(0, 6),
    gain=st.floats(0, 3),
    entropies=st.lists(st.floats(0, 6), min_size=1, max_size=60),
)
def test_bounds_and_actions_always_hold(name, t_min, span, horizon, decay, target, gain, entropies) -> None:
    p = PolicyParams(t_min=t_min, t_max=t_min + span, horizon=horizon, decay=decay, entropy_target=target, entropy_gain=gain)
    prev = None
    for s, d in enumerate(run(name, p, len(entropies), entropies)):
        assert p.t_min - 1e-12 <= d.temperature <= p.t_max + 1e-12
        assert d.action in POLICY_ACTIONS
        if prev is None:
            assert d.action == "set"
        elif d.action == "raise":
            assert d.temperature > prev
        elif d.action == "lower":
            assert d.temperature < prev
        prev = d.temperature
        if name in ("linear", "cosine", "exponential") and s > 0:
            assert d.action in ("lower", "hold")  # decay schedules never raise
