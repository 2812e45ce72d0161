"""Engine signals in the router: llm-d's queue and KV-cache scorers, LADR's engine term, and
LADR unchanged without engine data (docs/control.md#engine-signals)."""

from __future__ import annotations

import collections
import hashlib
import math
import random

import pytest

from llmsla import config as config_mod
from llmsla.control.replica import EngineSignal
from llmsla.control.router import Replica, Router, UnknownReplica, from_config
from llmsla.control.scorers import engine_terms, kv_scores, queue_scores


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def sig(waiting: float, kv: float = 0.0) -> EngineSignal:
    return EngineSignal(waiting, 0.0, kv, 0.0)


def test_queue_scorer_prefers_the_shorter_waiting_queue():
    assert queue_scores([sig(8), sig(0), sig(4)]) == [0.0, 1.0, 0.5]
    assert queue_scores([sig(3), sig(3)]) == [1.0, 1.0]  # all equal: no preference
    assert queue_scores([]) == []


def test_kv_scorer_prefers_the_lower_kv_usage():
    assert kv_scores([sig(0, 0.9), sig(0, 0.25)]) == pytest.approx([0.1, 0.75])


def test_engine_terms_weigh_and_fill_unknown_with_the_mean():
    terms = engine_terms([sig(10, 0.5), None, sig(0, 0.0)], 2.0, 1.0)
    assert terms[0] == pytest.approx(0.5)  # queue 0 * 2 + kv 0.5 * 1
    assert terms[2] == pytest.approx(3.0)  # queue 1 * 2 + kv 1 * 1
    assert terms[1] == pytest.approx(1.75)  # no engine data: the mean of the others
    assert engine_terms([None, None], 1.0, 1.0) == [0.0, 0.0]
    assert engine_terms([sig(1), sig(2)], 0.0, 0.0) == [0.0, 0.0]


def _share(router: Router, clock: Clock, n: int = 2000) -> collections.Counter:
    """Picks of ``n`` requests that each end before the next (equal latency everywhere), so only
    the engine term tells the replicas apart."""
    got: collections.Counter = collections.Counter()
    for _ in range(n):
        clock.t += 0.001
        rid = router.pick("default").id
        router.begin(rid)
        router.end(rid, 100.0)
        got[rid] += 1
    return got


@pytest.mark.parametrize(("kw", "feed"), [
    ({"engine_queue": 1.0}, {"r0": (12, 0.3), "r1": (0, 0.3)}),  # r1: the shorter waiting queue
    ({"engine_queue": 0.0, "engine_kv": 1.0}, {"r0": (0, 0.95), "r1": (0, 0.10)}),  # r1: lower KV
])
def test_ladr_with_engine_scorers_prefers_the_better_engine_state(kw, feed):
    clock = Clock()
    r = Router([Replica("r0", "default"), Replica("r1", "default")], "ladr", clock=clock,
               rng=random.Random(1), **kw)
    for rid, (waiting, kv) in feed.items():
        r.update_engine(rid, waiting=waiting, running=4, kv_usage=kv)
    got = _share(r, clock)
    assert got["r1"] > 3 * got["r0"] > 0  # the floor keeps the worse one measured
    snap = {x["id"]: x for x in r.snapshot()["pools"]["default"]}
    assert snap["r1"]["score"] > snap["r0"]["score"]
    assert snap["r0"]["engine"]["fresh"] and snap["r0"]["engine"]["kv_usage"] == feed["r0"][1]


def test_stale_engine_data_is_ignored():
    """Older than engine_ttl_s: the picks are those of a router that never had engine data
    (and the same data when fresh does change them, so the comparison can fail)."""
    picks = {}
    for case, at in (("none", None), ("stale", -3.5), ("fresh", 0.0)):
        clock = Clock()
        r = Router([Replica("r0", "default"), Replica("r1", "default")], "ladr", clock=clock,
                   rng=random.Random(4), engine_ttl_s=3.0, engine_queue=1.0, engine_kv=1.0)
        if at is not None:
            r.update_engine("r0", waiting=50, running=64, kv_usage=1.0, at=at)
            r.update_engine("r1", waiting=0, running=1, kv_usage=0.1, at=at)
        picks[case] = [r.pick("default").id for _ in range(200)]
        if case == "stale":
            assert r.snapshot()["pools"]["default"][0]["engine"]["fresh"] is False
    assert picks["stale"] == picks["none"]
    assert picks["fresh"] != picks["none"]


def test_update_engine_rejects_bad_values_and_keeps_the_last_good_one():
    r = Router([Replica("r0", "default")], "ladr", clock=Clock())
    r.update_engine("r0", waiting=2, running=3, kv_usage=0.5)
    for bad, match in (({"waiting": -1}, "waiting"), ({"running": math.nan}, "running"),
                       ({"kv_usage": 1.5}, "kv_usage"), ({"kv_usage": "0.5"}, "kv_usage"),
                       ({"waiting": True}, "waiting")):
        kw = {"waiting": 2, "running": 3, "kv_usage": 0.5, **bad}
        with pytest.raises(ValueError, match=match):
            r.update_engine("r0", **kw)
    with pytest.raises(ValueError, match="finite time"):
        r.update_engine("r0", waiting=1, running=1, kv_usage=0.1, at=math.inf)
    with pytest.raises(UnknownReplica):
        r.update_engine("nope", waiting=1, running=1, kv_usage=0.1)
    e = r.snapshot()["pools"]["default"][0]["engine"]
    assert (e["waiting"], e["running"], e["kv_usage"]) == (2.0, 3.0, 0.5)


def test_engine_weights_are_checked_and_come_from_config():
    with pytest.raises(ValueError, match="engine_queue"):
        Router([Replica("r0", "default")], "ladr", engine_queue=-1)
    with pytest.raises(ValueError, match="engine_ttl_s"):
        Router([Replica("r0", "default")], "ladr", engine_ttl_s=0)
    cfg = config_mod.load(env={"LLMSLA_CONTROL_LADR_ENGINE_QUEUE": "2.5", "LLMSLA_CONTROL_LADR_ENGINE_KV": "0.5"})
    r = from_config(cfg, [Replica("r0", "default")], shared=None)
    assert (r.params["engine_queue"], r.params["engine_kv"]) == (2.5, 0.5)
    with pytest.raises(config_mod.ConfigError, match="ladr_engine_kv"):
        config_mod.load(env={"LLMSLA_CONTROL_LADR_ENGINE_KV": "-1"})


def test_ladr_without_engine_data_picks_as_before():
    """The pick sequence of a seeded LADR router (latencies differing per replica, requests
    overlapping) is the one the router made before engine signals existed: the hash was
    computed on that code."""
    now = [0.0]
    r = Router([Replica(f"r{i}", "default") for i in range(4)], "ladr", clock=lambda: now[0],
               rng=random.Random(11))
    rng = random.Random(12)
    inflight: list[tuple[str, float]] = []
    out = []
    for _ in range(3000):
        now[0] += rng.expovariate(50.0)
        rid = r.pick("default").id
        r.begin(rid)
        out.append(rid)
        inflight.append((rid, now[0]))
        while inflight and rng.random() < 0.5:
            x, t0 = inflight.pop(rng.randrange(len(inflight)))
            r.end(x, (now[0] - t0) * 1000.0 * (1 + int(x[1])))
    assert len(set(out)) == 4
    assert hashlib.sha256(",".join(out).encode()).hexdigest()[:16] == "7310e8e0900a2334"


def test_engine_report_is_moved_to_now_by_the_routers_own_requests():
    """Between scrapes the router's own requests since the report move it: a request sent
    waits only where the engine had requests waiting, one come back frees a queue place, and
    each holds the running requests' mean KV share (control/ladr.py ``engine_now``)."""
    from llmsla.control.ladr import engine_now

    r = Router([Replica("r0", "default"), Replica("r1", "default")], "ladr", clock=Clock())
    for _ in range(4):
        r.begin("r0")
        r.begin("r1")
    r.update_engine("r0", waiting=0, running=4, kv_usage=0.4)  # a batch slot free
    r.update_engine("r1", waiting=3, running=4, kv_usage=0.8)  # its batch full
    states = r._states
    for st in states.values():
        st.engine_fresh = True
    assert engine_now(states["r0"]) is states["r0"].engine  # nothing moved yet
    r.begin("r0")
    r.begin("r0")
    r.begin("r1")
    e0, e1 = engine_now(states["r0"]), engine_now(states["r1"])
    assert e0 is not None and (e0.waiting, e0.kv_usage) == (0.0, pytest.approx(0.6))
    assert e1 is not None and (e1.waiting, e1.kv_usage) == (4.0, pytest.approx(1.0))
    assert (e0.running, e1.running) == (6.0, 4.0)  # r0's two run at once; r1's one waits
    for _ in range(4):
        r.end("r1", 100.0)  # three come back beyond the one sent
    e1 = engine_now(states["r1"])
    assert e1 is not None and (e1.waiting, e1.kv_usage) == (0.0, pytest.approx(0.2))
    assert e1.running == 4.0  # the three waiting took the slots of three that came back
    r.end("r1", 100.0)
    e1 = engine_now(states["r1"])
    assert e1 is not None and (e1.waiting, e1.running) == (0.0, 3.0)  # none waiting: the batch shrinks
    assert states["r1"].engine.waiting == 3  # the report itself is kept as it came


def test_picks_between_scrapes_do_not_all_go_to_the_replica_the_scrape_found_shortest():
    """Two equal replicas whose last scrape found r1's queue one shorter: with the engine term
    weighing most, picks that stay in flight fill r1's queue until it is the longer one, and
    then go to r0, not to r1 until the next scrape."""
    clock = Clock()
    r = Router([Replica("r0", "default"), Replica("r1", "default")], "ladr", clock=clock,
               rng=random.Random(3), alpha=0.0, beta=0.0, engine_queue=5.0, refresh_s=0.01)
    r.update_engine("r0", waiting=2, running=8, kv_usage=0.5)
    r.update_engine("r1", waiting=1, running=8, kv_usage=0.5)
    got: collections.Counter = collections.Counter()
    for _ in range(40):
        clock.t += 0.02  # a refresh before every pick, all within one scrape interval
        rid = r.pick("default").id
        r.begin(rid)
        got[rid] += 1
    assert got["r0"] >= 15 and got["r1"] >= 15, got
