"""Router policies: correctness against independent models computed in the test."""

from __future__ import annotations

import collections
import math
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as hst

from llmsla import names
from llmsla.control.router import (
    LastReplicaError,
    NoReplicaAvailable,
    Replica,
    Router,
    UnknownReplica,
)


class Clock:
    """Integer-millisecond clock so the test's freshness arithmetic matches the router's exactly."""

    def __init__(self) -> None:
        self.ms = 0

    def __call__(self) -> float:
        return self.ms / 1000.0


def reps(n: int, pool: str = names.DEFAULT_POOL, **kw) -> list[Replica]:
    return [Replica(f"r{i}", pool, **kw) for i in range(n)]


def test_round_robin_cycles_and_skips_drained_and_excluded():
    r = Router(reps(4), "round_robin")
    assert [r.pick("default").id for _ in range(8)] == ["r0", "r1", "r2", "r3"] * 2
    r.drain("r1")
    seq = [r.pick("default").id for _ in range(6)]
    assert "r1" not in seq and collections.Counter(seq) == {"r0": 2, "r2": 2, "r3": 2}
    assert r.pick("default", exclude={"r2", "r3"}).id == "r0"
    r.set_weight("r0", 0)
    with pytest.raises(NoReplicaAvailable, match="excluded"):
        r.pick("default", exclude={"r2", "r3"})
    with pytest.raises(NoReplicaAvailable, match="no such pool"):
        r.pick("nope")


@pytest.mark.parametrize("weights", [
    {"r0": 1.0, "r1": 2.0, "r2": 0.5, "r3": 1.0, "r4": 3.0, "r5": 1.0},  # weighted scan
    {f"r{i}": 1.0 for i in range(6)},  # uniform: the outstanding-level index
])
def test_least_outstanding_matches_brute_force(weights):
    rng = random.Random(3)
    r = Router(reps(6), "least_outstanding", rng=rng)
    for rid, w in weights.items():
        r.set_weight(rid, w)
    load = collections.Counter()
    drained: set[str] = set()
    for step in range(800):
        u = rng.random()
        if u < 0.05 and len(drained) < 4:
            rid = rng.choice(sorted(set(weights) - drained))
            r.drain(rid)
            drained.add(rid)
            continue
        if u < 0.10 and drained:
            rid = rng.choice(sorted(drained))
            r.undrain(rid)
            drained.discard(rid)
            continue
        if load and u < 0.50:
            busy = sorted(k for k, v in load.items() if v > 0)
            if busy:
                rid = rng.choice(busy)
                r.end(rid, 10.0)
                load[rid] -= 1
            continue
        exclude = {rng.choice(sorted(weights))} if u > 0.9 else set()
        live = {k: w for k, w in weights.items() if k not in drained and k not in exclude}
        if not live:
            continue
        best = min(load[k] / w for k, w in live.items())
        got = r.pick("default", exclude=exclude)
        assert got.id in live and load[got.id] / weights[got.id] == best, step
        r.begin(got.id)
        load[got.id] += 1
    assert sum(load.values()) == sum(r.outstanding(k) for k in weights)


def test_least_outstanding_spreads_ties_between_idle_replicas():
    r = Router(reps(4), "least_outstanding")
    seen = []
    for _ in range(8):  # one request at a time: every replica is idle at each pick
        rid = r.pick("default").id
        r.begin(rid)
        r.end(rid, 5.0)
        seen.append(rid)
    assert collections.Counter(seen) == {"r0": 2, "r1": 2, "r2": 2, "r3": 2}


def test_p2c_never_picks_the_unique_most_loaded():
    r = Router(reps(5), "p2c", rng=random.Random(1))
    for _ in range(10):
        r.begin("r3")
    picks = collections.Counter(r.pick("default").id for _ in range(4000))
    assert picks["r3"] == 0
    assert set(picks) == {"r0", "r1", "r2", "r4"}
    # two candidates only: the lighter one always wins
    r.drain("r0"), r.drain("r1"), r.drain("r2")
    assert {r.pick("default").id for _ in range(50)} == {"r4"}


@pytest.mark.parametrize("policy", ["round_robin", "least_outstanding", "p2c", "ladr"])
def test_health_down_is_apart_from_an_operator_drain(policy):
    """A health checker's down/up never overrides an operator's drain, nor the reverse: a replica
    is picked only when it is neither drained nor down (the simulator's health checker once
    undrained a replica the alert receiver had drained, the moment its crash ended)."""
    r = Router(reps(3), policy, rng=random.Random(3))

    def picked(n: int = 300) -> set[str]:
        out = set()
        for _ in range(n):
            rep = r.pick(names.DEFAULT_POOL)
            r.begin(rep.id)
            r.end(rep.id, 10.0, ok=True)
            out.add(rep.id)
        return out

    r.drain("r1")  # the operator
    r.set_down("r1", True)  # the crash, seen by the health checker
    r.set_down("r1", False)  # back up: still drained
    assert r.is_drained("r1") and picked() == {"r0", "r2"}
    r.set_down("r2", True)
    r.undrain("r1")  # the operator restores r1 while r2 is dead: r2 stays out
    assert picked() == {"r0", "r1"}
    r.drain("r0")  # r1 is the last eligible one now: neither path may take it out
    with pytest.raises(LastReplicaError, match="last eligible"):
        r.set_down("r1", True)
    with pytest.raises(LastReplicaError, match="last healthy"):
        r.drain("r1")
    r.undrain("r0")
    r.set_down("r2", False)
    assert picked() == {"r0", "r1", "r2"}
    assert r.snapshot()["pools"][names.DEFAULT_POOL][2]["down"] is False


def test_drain_refuses_last_healthy_replica_per_pool():
    r = Router([*reps(2, "a"), Replica("b0", "b")], "ladr")
    r.drain("r0")
    with pytest.raises(LastReplicaError, match="last healthy"):
        r.drain("r1")
    with pytest.raises(LastReplicaError):
        r.drain("b0")
    assert not r.is_drained("r1") and not r.is_drained("b0")
    r.undrain("r0")
    r.drain("r1")  # now allowed: r0 is healthy again
    with pytest.raises(UnknownReplica, match="zz"):
        r.drain("zz")
    with pytest.raises(ValueError, match="weight"):
        r.set_weight("r0", -1)
    with pytest.raises(ValueError, match="theta"):
        r.set_params(theta=1.0)
    with pytest.raises(ValueError, match="unknown router parameter"):
        r.set_params(gamma=1)
    with pytest.raises(ValueError, match="policy"):
        r.set_params(policy="random")


OPS = hst.lists(
    hst.tuples(
        hst.sampled_from(["pick", "pick", "pick", "end", "observe", "tick", "drain", "undrain", "begin"]),
        hst.integers(0, 5),
        hst.integers(1, 900),
    ),
    min_size=1,
    max_size=120,
)


@settings(max_examples=150, deadline=None)
@given(OPS, hst.integers(0, 2**32 - 1))
def test_ladr_never_picks_drained_or_stale(ops, seed):
    """Random operation sequences; an independent model tracks drain state and stats age."""
    clock = Clock()
    r = Router(reps(6), "ladr", clock=clock, rng=random.Random(seed))
    ttl_ms = 1000
    last_seen = {f"r{i}": 0 for i in range(6)}
    drained: set[str] = set()
    for op, i, arg in ops:
        rid = f"r{i}"
        if op == "tick":
            clock.ms += arg
        elif op == "end":
            r.end(rid, float(arg), ok=arg % 7 != 0)
            last_seen[rid] = clock.ms
        elif op == "observe":
            r.observe(rid, queue_length=arg % 5)
            last_seen[rid] = clock.ms
        elif op == "begin":
            r.begin(rid)
        elif op == "drain":
            if len(drained) < 5 and rid not in drained:
                r.drain(rid)
                drained.add(rid)
        elif op == "undrain":
            if rid in drained:
                r.undrain(rid)
                drained.discard(rid)
                last_seen[rid] = max(last_seen[rid], clock.ms)
        else:
            got = r.pick("default").id
            assert got not in drained
            fresh = {k for k, t in last_seen.items() if clock.ms - t <= ttl_ms and k not in drained}
            if fresh:
                assert got in fresh, (got, clock.ms, last_seen)


def _ladr_with_latencies(lat_ms: dict[str, float], clock: Clock, **params) -> Router:
    r = Router([Replica(k, "default") for k in lat_ms], "ladr", clock=clock, rng=random.Random(7), **params)
    for rid, lat in lat_ms.items():
        r.end(rid, lat)
    r.refresh()
    return r


def _expected_shares(lat: dict[str, float], queue: dict[str, int], weight: dict[str, float], *,
                     alpha: float, beta: float, sharpness: float, floor: float = 0.01) -> dict[str, float]:
    """Independent model of LADR's sampling: p_i ~ weight_i * exp(sharpness * score_i) with
    score_i = alpha * min(lat) / lat_i - beta * queue_i / max(1, mean queue), floored at
    ``floor`` times the best weight."""
    ref = min(lat.values())
    qbar = max(1.0, sum(queue.values()) / len(queue))
    raw = {k: weight[k] * math.exp(sharpness * (alpha * ref / lat[k] - beta * queue[k] / qbar)) for k in lat}
    best = max(raw.values())
    w = {k: max(v, floor * best) for k, v in raw.items()}
    total = sum(w.values())
    return {k: v / total for k, v in w.items()}


def _ladr_scene(systematic: float, **params) -> tuple[Router, dict[str, float], dict[str, int], dict[str, float]]:
    clock = Clock()
    lat = {"a": 100.0, "b": 200.0, "c": 400.0, "d": 250.0}
    queue = {"a": 6, "b": 1, "c": 0, "d": 2}
    r = Router([Replica(k, "default") for k in lat], "ladr", clock=clock, rng=random.Random(11),
               theta=0.0, systematic=systematic, **params)
    for rid, q in queue.items():
        r.end(rid, lat[rid])
        for _ in range(q):
            r.begin(rid)
    r.set_weight("d", 2.0)
    return r, lat, queue, {"a": 1.0, "b": 1.0, "c": 1.0, "d": 2.0}


def test_weighted_sampling_converges_to_score_proportions():
    """i.i.d. sampling: shares match the independent model (chi-square, df 3, p = 0.001)."""
    alpha, beta, k = 1.0, 0.5, 1.5
    r, lat, queue, weight = _ladr_scene(0.0, alpha=alpha, beta=beta, sharpness=k)
    expected = _expected_shares(lat, queue, weight, alpha=alpha, beta=beta, sharpness=k)
    assert min(expected.values()) > 0.05  # no floor involved: the exp(score) law itself is tested
    n = 40_000
    counts = collections.Counter(r.pick("default").id for _ in range(n))
    chi2 = sum((counts[x] - n * p) ** 2 / (n * p) for x, p in expected.items())
    assert chi2 < 16.27, (chi2, counts, expected)
    for x, p in expected.items():  # and every share within 4 binomial standard deviations
        assert abs(counts[x] / n - p) < 4 * math.sqrt(p * (1 - p) / n)
    snap = {x["id"]: x for x in r.snapshot()["pools"]["default"]}
    for x in lat:  # the reported score is the model's score at the refresh
        want = alpha * 100.0 / lat[x] - beta * queue[x] / (sum(queue.values()) / 4)
        assert snap[x]["score"] == pytest.approx(want)


def test_systematic_sampling_keeps_the_proportions_and_spreads_picks():
    """Default (golden-ratio) sampling: same probabilities, but every window of consecutive picks
    is close to its expected split - a weighted round robin without bursts on one replica."""
    alpha, beta, k = 1.0, 0.5, 1.5
    r, lat, queue, weight = _ladr_scene(1.0, alpha=alpha, beta=beta, sharpness=k)
    expected = _expected_shares(lat, queue, weight, alpha=alpha, beta=beta, sharpness=k)
    seq = [r.pick("default").id for _ in range(20_000)]
    counts = collections.Counter(seq)
    for x, p in expected.items():
        assert abs(counts[x] / len(seq) - p) < 0.002, (counts, expected)
    worst = 0.0
    for start in range(0, len(seq) - 200, 50):
        win = collections.Counter(seq[start:start + 200])
        worst = max(worst, *(abs(win[x] - 200 * p) for x, p in expected.items()))
    assert worst <= 4, worst  # i.i.d. sampling would stray by ~ +/- 3 sd = +/- 20 in such windows
    assert len({tuple(seq[i:i + 4]) for i in range(0, 400, 4)}) > 3  # not a fixed cycle of one


def test_all_negative_scores_still_prefer_the_better_replicas():
    """Defect of the first LADR: with every score <= 0 it sampled uniformly."""
    clock = Clock()
    r = Router(reps(3), "ladr", clock=clock, rng=random.Random(3), theta=0.0, alpha=0.1, beta=1.0,
               sharpness=2.0, systematic=0)
    lat = {"r0": 100.0, "r1": 100.0, "r2": 100.0}
    queue = {"r0": 10, "r1": 20, "r2": 30}
    for rid, q in queue.items():
        r.end(rid, lat[rid])
        for _ in range(q):
            r.begin(rid)
    r.refresh()
    snap = {x["id"]: x for x in r.snapshot()["pools"]["default"]}
    assert all(x["score"] < 0 for x in snap.values())
    expected = _expected_shares(lat, queue, {k: 1.0 for k in lat}, alpha=0.1, beta=1.0, sharpness=2.0)
    n = 30_000
    counts = collections.Counter(r.pick("default").id for _ in range(n))
    assert counts["r0"] > counts["r1"] > counts["r2"] and counts["r0"] > 0.6 * n
    for x, p in expected.items():
        assert abs(counts[x] / n - p) < 4 * math.sqrt(p * (1 - p) / n), (counts, expected)


def test_queue_term_is_live_within_a_refresh_window():
    """Defect of the first LADR: scores frozen for 200 ms, so a burst herded onto one replica.
    Now begin() moves the odds at once: a burst inside one window spreads evenly."""
    for systematic in (0.0, 1.0):
        clock = Clock()
        r = _ladr_with_latencies({f"r{i}": 100.0 for i in range(4)}, clock, systematic=systematic)
        refreshes = r.refreshes
        for _ in range(400):  # clock frozen: no refresh, only the live queue can spread them
            r.begin(r.pick("default").id)
        out = [r.outstanding(f"r{i}") for i in range(4)]
        assert r.refreshes == refreshes
        assert max(out) - min(out) <= 8, (systematic, out)  # uniform random: sd ~ 9 per replica
    # and the odds follow the live counts exactly (independent model, queue scale frozen at 1)
    clock = Clock()
    r = _ladr_with_latencies({"a": 100.0, "b": 100.0}, clock, systematic=0, sharpness=1.0)
    r.pick("default")  # builds the sampler at queue 0/0 (scale 1)
    for _ in range(2):
        r.begin("a")
    n = 20_000
    counts = collections.Counter(r.pick("default").id for _ in range(n))
    p_a = 1 / (1 + math.exp(2.0))
    assert abs(counts["a"] / n - p_a) < 4 * math.sqrt(p_a * (1 - p_a) / n), counts


def test_slow_decode_counts_not_only_ttft():
    """Defect of the first LADR: TTFT only, so a replica that decodes 3x slower looked equal."""
    clock = Clock()
    r = Router([Replica("fast", "default"), Replica("slowdec", "default")], "ladr", clock=clock,
               rng=random.Random(5), theta=0.0)
    for _ in range(5):
        r.end("fast", 1000.0, ttft_ms=100.0)
        r.end("slowdec", 3000.0, ttft_ms=100.0)
    r.refresh()
    counts = collections.Counter(r.pick("default").id for _ in range(3000))
    assert counts["slowdec"] < 0.05 * 3000 and counts["slowdec"] > 0, counts


def test_extreme_parameters_neither_overflow_nor_go_uniform():
    clock = Clock()
    r = _ladr_with_latencies({"a": 100.0, "b": 150.0, "c": 5000.0}, clock, theta=0.0, alpha=100.0,
                             beta=100.0, sharpness=50.0, systematic=0)
    for _ in range(3):
        r.begin("c")
    counts = collections.Counter(r.pick("default").id for _ in range(5000))
    # a's weight is exp(5000 * (1 - 2/3)) times b's: b and c are both at the 1 % floor
    p = 0.01 / 1.02
    for x in ("b", "c"):
        assert abs(counts[x] / 5000 - p) < 4 * math.sqrt(p * (1 - p) / 5000), counts
    r.set_params(sharpness=0.0)  # uniform, whatever the scores
    counts = collections.Counter(r.pick("default").id for _ in range(6000))
    assert all(abs(counts[x] / 6000 - 1 / 3) < 4 * math.sqrt(2 / 9 / 6000) for x in "abc"), counts


def test_sampler_matches_a_brute_force_scan():
    """Fenwick-tree sampling vs a linear scan of weights computed in the test, under random
    begin/end traffic (the sampler is updated incrementally, the scan from scratch)."""
    rng = random.Random(9)
    clock = Clock()
    lat = {f"r{i}": rng.uniform(50, 500) for i in range(13)}
    r = _ladr_with_latencies(lat, clock, theta=0.0, sharpness=3.0)
    r.pick("default")
    lad = r._group("default", None).ladr
    qbar = max(1.0, sum(r.outstanding(k) for k in lat) / len(lat))  # scale frozen at the build
    ref = min(lat.values())
    base = {k: math.exp(3.0 * (ref / v - 1.0)) for k, v in lat.items()}
    fl = 0.01 * max(base.values())
    order = [st.rep.id for st in lad.states]
    for _ in range(2000):
        rid = rng.choice(order)
        if rng.random() < 0.6:
            r.begin(rid)
        elif r.outstanding(rid):
            r.end(rid, lat[rid])
        if lad.stale:
            break  # the pick would rebuild the sampler with a new scale; stop comparing here
        w = [max(base[k] * math.exp(-3.0 / qbar) ** r.outstanding(k), fl) for k in order]
        u = rng.random()
        x, want = u * sum(w), order[-1]
        for k, wk in zip(order, w, strict=True):
            x -= wk
            if x < 0:
                want = k
                break
        assert lad.sample(u).rep.id == want
        assert lad.total == pytest.approx(sum(w))


def test_never_always_the_top_replica_and_negative_scores_clamped():
    clock = Clock()
    r = _ladr_with_latencies({"fast": 50.0, "slow": 5000.0}, clock, theta=0.0, beta=1.0, floor=0.02)
    for _ in range(100):
        r.begin("slow")  # raw score of slow is now very negative
    clock.ms += 200
    r.observe("slow")
    r.observe("fast")
    n = 20_000
    counts = collections.Counter(r.pick("default").id for _ in range(n))
    # floor = 2 % of the best score -> slow gets 0.02 / 1.02 of the draws
    p = 0.02 / 1.02
    assert abs(counts["slow"] / n - p) < 4 * math.sqrt(p * (1 - p) / n), counts
    assert r.snapshot()["pools"]["default"][1]["score"] < 0


def test_ema_damping_reduces_route_flapping():
    """Count switches of the argmax score under noisy latencies, with and without the EMA."""

    def switches(theta: float) -> int:
        clock = Clock()
        noise = random.Random(5)  # same noise for both runs
        r = Router([Replica("a", "default"), Replica("b", "default")], "ladr", clock=clock,
                   rng=random.Random(1), theta=theta, beta=0.0)
        prev, count = None, 0
        for _ in range(600):
            for rid, mean in (("a", 100.0), ("b", 110.0)):
                for _ in range(3):
                    r.end(rid, mean * noise.lognormvariate(0, 0.4))
            clock.ms += 200
            r.refresh()
            scores = {x["id"]: x["score"] for x in r.snapshot()["pools"]["default"]}
            top = max(scores, key=scores.get)
            count += prev is not None and top != prev
            prev = top
        return count

    raw, smoothed = switches(0.0), switches(0.7)
    assert smoothed < 0.6 * raw, (raw, smoothed)
    assert raw > 50  # the noise really is noisy enough to flap without smoothing


def test_ema_formula_and_runtime_alpha_beta():
    clock = Clock()
    r = Router([Replica("a", "default"), Replica("b", "default")], "ladr", clock=clock, theta=0.7)
    r.end("a", 100.0)
    r.end("b", 100.0)
    r.refresh()
    snap = {x["id"]: x for x in r.snapshot()["pools"]["default"]}
    assert snap["a"]["latency_ema_ms"] == pytest.approx(100.0)  # first window initialises the EMA
    assert snap["a"]["score"] == pytest.approx(1.0)  # alpha * 1 (the fastest) - beta * 0
    r.end("a", 200.0)
    r.end("b", 100.0)
    clock.ms += 200
    r.refresh()
    snap = {x["id"]: x for x in r.snapshot()["pools"]["default"]}
    assert snap["a"]["latency_ema_ms"] == pytest.approx(0.7 * 100.0 + 0.3 * 200.0)
    assert snap["a"]["score"] == pytest.approx(100.0 / 130.0)  # relative to b, the fastest
    r.set_params(alpha=2.0, beta=1.0, theta=0.0)
    r.begin("a")
    r.begin("a")
    clock.ms += 200
    r.refresh()  # empty window: the EMA is held
    snap = {x["id"]: x for x in r.snapshot()["pools"]["default"]}
    assert snap["a"]["latency_ema_ms"] == pytest.approx(130.0)
    # queue 2 against the pool's mean of 1: beta * 2 / 1
    assert snap["a"]["score"] == pytest.approx(2.0 * 100.0 / 130.0 - 1.0 * 2 / 1)
    assert snap["b"]["score"] == pytest.approx(2.0 - 0.0)
    with pytest.raises(ValueError, match="systematic"):
        r.set_params(systematic=0.5)
    with pytest.raises(ValueError, match="sharpness"):
        r.set_params(sharpness=-1)


def test_all_stale_falls_back_to_least_outstanding_and_observe_keeps_fresh():
    clock = Clock()
    r = _ladr_with_latencies({"a": 100.0, "b": 100.0, "c": 100.0}, clock)
    for rid, k in (("a", 3), ("b", 1), ("c", 2)):
        for _ in range(k):
            r.begin(rid)
    clock.ms += 1500  # everything stale
    assert {r.pick("default").id for _ in range(20)} == {"b"}
    r.observe("c")  # a health probe report: only c is fresh now
    clock.ms += 1
    r.refresh()
    assert {r.pick("default").id for _ in range(50)} == {"c"}
    snap = {x["id"]: x for x in r.snapshot()["pools"]["default"]}
    assert snap["c"]["fresh"] and not snap["a"]["fresh"]


def test_failures_are_charged_the_error_penalty():
    clock = Clock()
    r = Router([Replica("a", "default"), Replica("b", "default")], "ladr", clock=clock, theta=0.0)
    r.end("a", 5.0, ok=False)  # a fast failure must not look like a fast replica
    r.end("b", 500.0)
    r.refresh()
    snap = {x["id"]: x for x in r.snapshot()["pools"]["default"]}
    assert snap["a"]["avg_latency_ms"] == 10_000.0 and snap["a"]["errors"] == 1
    assert snap["b"]["score"] > snap["a"]["score"]


def test_roles_and_metrics():
    from prometheus_client import CollectorRegistry

    reg = CollectorRegistry()
    r = Router([Replica("t0", "p", role="teacher"), Replica("s0", "p", role="student"),
                Replica("s1", "p", role="student")], "round_robin", registry=reg)
    assert {r.pick("p", role="student").id for _ in range(10)} == {"s0", "s1"}
    assert {r.pick("p", role="teacher").id for _ in range(3)} == {"t0"}
    r.drain("s0")
    labels = {names.L_POOL: "p", names.L_REPLICA: "s1"}
    assert reg.get_sample_value(names.ROUTER_PICKS + "_total", labels) == 5
    assert reg.get_sample_value(names.ROUTER_DRAINED, {**labels, names.L_REPLICA: "s0"}) == 1
    r.set_weight("s1", 0.5)
    assert reg.get_sample_value(names.ROUTER_WEIGHT, labels) == 0.5


def test_policy_switch_at_runtime_and_membership():
    clock = Clock()
    r = Router(reps(3), "round_robin", clock=clock)
    r.set_params(policy="ladr")
    assert r.pick("default").id in {"r0", "r1", "r2"}
    r.add_replica(Replica("r9", "default", url="http://x"))
    assert "r9" in {x.id for x in r.replicas("default")}
    with pytest.raises(ValueError, match="already exists"):
        r.add_replica(Replica("r9", "default"))
    r.remove_replica("r9")
    r.end("r9", 1.0)  # a request that finishes after its replica was removed is ignored
    assert r.snapshot()["policy"] == "ladr"


def _mini_fleet(policy: str, seed: int = 3) -> tuple[float, float, float]:
    """Tiny discrete-event fleet: Poisson arrivals, latency grows with the replica's queue.

    Returns (share of requests on the slow replica, mean latency ms, p99 latency ms).
    """
    import heapq

    clock = Clock()
    base = {"fast0": 100.0, "fast1": 100.0, "slow": 600.0}
    r = Router([Replica(k, "default") for k in base], policy, clock=clock, rng=random.Random(seed))
    rng = random.Random(seed)
    heap: list[tuple[int, int, str, float]] = []
    t_ms, lat, on_slow, probe = 0, [], 0, 0
    for seq in range(6000):
        t_ms += max(1, int(rng.expovariate(1 / 100.0)))  # ~10 requests/s
        while heap and heap[0][0] <= t_ms:
            done, _, rid, latency = heapq.heappop(heap)
            clock.ms = done
            r.end(rid, latency, ttft_ms=latency)
        if t_ms >= probe:  # queue probes every 500 ms, as the gateway/simulator health checks do
            clock.ms = t_ms
            for rid in base:
                r.observe(rid, queue_length=r.outstanding(rid))
            probe = t_ms + 500
        clock.ms = t_ms
        rid = r.pick("default").id
        latency = base[rid] * (1 + 0.2 * r.outstanding(rid)) * rng.uniform(0.8, 1.2)
        r.begin(rid)
        heapq.heappush(heap, (t_ms + int(latency), seq, rid, latency))
        lat.append(latency)
        on_slow += rid == "slow"
    lat.sort()
    return on_slow / len(lat), sum(lat) / len(lat), lat[int(0.99 * len(lat))]


def test_ladr_routes_away_from_a_slow_replica():
    rr_share, rr_mean, rr_p99 = _mini_fleet("round_robin")
    lo_share, lo_mean, _ = _mini_fleet("least_outstanding")
    ladr_share, ladr_mean, ladr_p99 = _mini_fleet("ladr")
    assert abs(rr_share - 1 / 3) < 0.01
    assert ladr_share < 0.12, ladr_share  # the slow replica gets a small share ...
    assert ladr_share > 0.005  # ... but never none: its recovery would go unnoticed
    assert ladr_share < lo_share and ladr_mean < lo_mean  # latency-aware beats queue-only here
    assert ladr_mean < 0.5 * rr_mean and ladr_p99 < 0.7 * rr_p99, (rr_mean, rr_p99, ladr_mean, ladr_p99)


def test_from_config_uses_the_control_section_and_names_bad_keys():
    from llmsla import config as config_mod
    from llmsla.control.router import from_config

    cfg = config_mod.load(env={"LLMSLA_CONTROL_ROUTE_POLICY": "p2c", "LLMSLA_CONTROL_LADR_BETA": "0.3"})
    r = from_config(cfg, reps(2))
    assert r.policy == "p2c" and r.params["beta"] == 0.3 and r.shared is None  # no redis_url
    with pytest.raises(config_mod.ConfigError, match="control.ladr_theta"):  # refused where it is set
        config_mod.load(env={"LLMSLA_CONTROL_LADR_THETA": "1.5"})
    bad = config_mod.load(env={})
    bad.control.ladr_theta = 1.5  # a Config built in code: the router refuses it too
    with pytest.raises(config_mod.ConfigError, match="control.ladr_theta"):
        from_config(bad, reps(2))


def test_pick_with_an_arms_policy_shares_the_replica_state():
    """An A/B arm's route policy picks on the same router: the same outstanding counts."""
    r = Router([Replica("a", "p"), Replica("b", "p"), Replica("c", "p")], "round_robin")
    r.begin("a")
    r.begin("a")
    r.begin("b")
    assert {r.pick("p", policy="least_outstanding").id for _ in range(5)} == {"c"}
    assert [r.pick("p").id for _ in range(3)] == ["a", "b", "c"]  # the router's own policy unchanged
    r.begin("c")
    r.begin("c")
    assert r.pick("p", policy="least_outstanding").id == "b"  # sees the picks of the other policy's requests
