"""pick() latency of every router policy with 64 replicas (target: <= 5 us per pick).

Anchor: ``random.choice`` on the same 64-replica list, timed in the same run, so the ratio says
how much routing costs over the cheapest possible choice on this (shared, noisy) machine.
LADR runs on the real monotonic clock, so its 200 ms lazy refresh is included, amortised, as
it would be in the gateway; ``refresh()`` alone is timed as well. Each figure is the median of
``--repeats`` runs of ``--calls`` picks (min shown too).

    python bench/router.py [--replicas 64] [--calls 200000] [--repeats 7] [--no-redis]
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import print_table, write_result  # noqa: E402

from llmsla.control.router import POLICIES, Replica, Router  # noqa: E402

TARGET_US = 5.0


def _time_per_call(fn, calls: int, repeats: int) -> tuple[float, float]:
    runs = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn(calls)
        runs.append((time.perf_counter() - t0) / calls * 1e6)
    return statistics.median(runs), min(runs)


#: LADR scoring its learnt expected completion time (bench/routing.py's ``ladr+ect`` row);
#: ``ladr+ect+prompt``: the same with prompt sizes known (learnt prefill speeds that differ, each
#: pick weighing its own prompt: the rejection step of control/sampler.py).
ECT_PARAMS = {"ect": 3.0, "alpha": 0.0, "beta": 0.0, "floor": 0.001}


def _router(policy: str, n: int, prompts: bool = False, **params: float) -> Router:
    rng = random.Random(1)
    r = Router([Replica(f"r{i}", "default") for i in range(n)], policy, rng=random.Random(2),
               ttl_s=3600.0, **params)  # long TTL: the bench must not drift into the all-stale fallback
    for i in range(n):  # realistic state: measured latencies, TTFT, output tokens, some queueing
        if prompts:  # prompt sizes known: prefill speeds learnt, half the replicas 3x slower to prefill
            ahead = r.begin(f"r{i}", 500)
            r.first_token(f"r{i}", (3.0 if i % 2 else 1.0) * rng.uniform(5, 20), prompt_tokens=500,
                          ahead_tokens=ahead)
        r.end(f"r{i}", rng.uniform(50, 500), ttft_ms=rng.uniform(5, 20), output_tokens=rng.randint(20, 200))
        for _ in range(rng.randrange(4)):
            r.begin(f"r{i}", rng.randint(50, 2000) if prompts else None)
    return r


def _shared_pick(n: int, calls: int, repeats: int) -> tuple[float, float]:
    """LADR with a real redis-server and the syncer thread running: Redis stays off pick()."""
    import tempfile

    from llmsla import services
    from llmsla.control.shared_state import RedisSharedState

    with tempfile.TemporaryDirectory() as tmp, services.start_redis(Path(tmp)) as svc:
        shared = RedisSharedState(svc.extra["url"], interval_s=0.2).start()
        try:
            r = _router("ladr", n)
            r.shared = shared
            pick = r.pick

            def run(k: int) -> None:
                for _ in range(k):
                    pick("default")

            return _time_per_call(run, calls, repeats)
        finally:
            shared.close()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--replicas", type=int, default=64)
    ap.add_argument("--calls", type=int, default=200_000)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--no-redis", action="store_true", help="skip the row that needs redis-server")
    args = ap.parse_args()
    n, calls, repeats = args.replicas, args.calls, args.repeats

    reps = [Replica(f"r{i}", "default") for i in range(n)]
    choice = random.Random(3).choice

    def anchor(k: int) -> None:
        for _ in range(k):
            choice(reps)

    anchor_med, anchor_min = _time_per_call(anchor, calls, repeats)
    rows = [{"what": "random.choice (anchor)", "median_us": anchor_med, "min_us": anchor_min,
             "x_anchor": 1.0, "target_us": TARGET_US, "ok": anchor_med <= TARGET_US}]
    results = {"anchor_random_choice": {"median_us": anchor_med, "min_us": anchor_min}}
    for policy in (*POLICIES, "ladr+ect", "ladr+ect+prompt"):
        if policy.startswith("ladr+ect"):
            r = _router("ladr", n, prompts=policy.endswith("prompt"), **ECT_PARAMS)
        else:
            r = _router(policy, n)
        pick = r.pick
        sizes = [50, 120, 700, 3000, 20000, 90] if policy.endswith("prompt") else [None]

        def run(k: int, pick=pick, sizes=sizes) -> None:
            m = len(sizes)
            for j in range(k):  # each request's own prompt size: long ones go where prefill is fast
                pick("default", prompt_tokens=sizes[j % m])

        med, mn = _time_per_call(run, calls, repeats)
        rows.append({"what": f"pick {policy}", "median_us": med, "min_us": mn, "x_anchor": med / anchor_med,
                     "target_us": TARGET_US, "ok": med <= TARGET_US})
        results[policy.replace("+", "_")] = {"median_us": med, "min_us": mn, "ratio_vs_anchor": med / anchor_med,
                           "meets_target": med <= TARGET_US}
        if policy == "ladr":
            r_ex = _router(policy, n)

            def run_ex(k: int, pick=r_ex.pick) -> None:
                ex = {"r5"}
                for _ in range(k):
                    pick("default", exclude=ex)

            med, mn = _time_per_call(run_ex, calls, repeats)
            rows.append({"what": "pick ladr exclude={1}", "median_us": med, "min_us": mn,
                         "x_anchor": med / anchor_med, "target_us": TARGET_US, "ok": med <= TARGET_US})
            results["ladr_exclude_one"] = {"median_us": med, "min_us": mn, "ratio_vs_anchor": med / anchor_med}

            def run_refresh(k: int, r=r) -> None:
                for _ in range(k):
                    r.refresh()

            med, mn = _time_per_call(run_refresh, max(1, calls // 100), repeats)
            rows.append({"what": "ladr refresh() (every 200 ms)", "median_us": med, "min_us": mn,
                         "x_anchor": med / anchor_med, "target_us": "-", "ok": "-"})
            results["ladr_refresh"] = {"median_us": med, "min_us": mn}
        if policy in ("ladr", "ladr+ect", "ladr+ect+prompt"):  # a refresh then the sampler build its next pick does, O(n)
            def run_rebuild(k: int, r=r) -> None:
                for _ in range(k):
                    r.refresh()
                    r.pick("default", prompt_tokens=700)

            med, mn = _time_per_call(run_rebuild, max(1, calls // 100), repeats)
            rows.append({"what": f"{policy} refresh() + sampler build", "median_us": med, "min_us": mn,
                         "x_anchor": med / anchor_med, "target_us": "-", "ok": "-"})
            results[f"{policy.replace('+', '_')}_refresh_build"] = {"median_us": med, "min_us": mn}
    if not args.no_redis:
        med, mn = _shared_pick(n, calls, repeats)
        rows.append({"what": "pick ladr + Redis shared state", "median_us": med, "min_us": mn,
                     "x_anchor": med / anchor_med, "target_us": TARGET_US, "ok": med <= TARGET_US})
        results["ladr_redis_shared"] = {"median_us": med, "min_us": mn, "ratio_vs_anchor": med / anchor_med,
                                        "meets_target": med <= TARGET_US}
    print_table(rows, f"router pick() latency, {n} replicas, {calls} calls x {repeats} repeats (median)")
    write_result("router", {"inputs": {"replicas": n, "calls": calls, "repeats": repeats, "target_us": TARGET_US},
                            "results": results})
    return 0 if all(v.get("meets_target", True) for v in results.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
