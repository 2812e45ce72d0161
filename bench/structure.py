"""The structure pass costs nothing: the gateway, router, receiver and forecaster benches, run on
the tree before it (``--ref``, the anchor) and on this one, interleaved round by round.

Both trees run from ``git archive`` copies laid out for ``PYTHONPATH`` (``exporters.legacy_tree``)
with this venv's dependencies, so neither has an advantage. Each figure is a ratio to an anchor
measured inside the same process run (the router's ``random.choice``, the receiver's bare 200
handler, the forecaster's bare LSTM forward), except the gateway's, which is CPU per proxied
stream of two gateway processes under the same load; the paired ratio (today / before, per round)
is summarised by its geometric mean and 95 % interval (``_common.paired_interval``). "Within
noise" means the interval contains 1, or lies wholly below it (faster).

    python bench/structure.py [--ref 7e74c03] [--rounds 3] [--only gateway|router|receiver|forecaster]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import paired_interval, print_table, write_result  # noqa: E402

from exporters import bench_otel, legacy_tree  # noqa: E402

#: The last commit before the structure pass (issue 34).
STRUCTURE_BASE_REF = "7e74c03"

#: In-process figures, each "lower is better" and already a ratio to the run's own anchor.
FORECASTER_DRIVER = """
import json, sys
sys.path.insert(0, sys.argv[1])
import forecaster as F
from llmsla import config
from llmsla.forecaster import artifact, train
cfg = config.load()
art = artifact.load(artifact.PRETRAINED)
train.seed_everything(0, cfg.forecast.threads)
rows, _ = F.online_rows(cfg, art, 64, int(sys.argv[2]))
print("RESULT " + json.dumps({r["what"]: r["p99_ms"] / rows[0]["p99_ms"] for r in rows[1:]}))
"""


def _run(tree: Path, argv: list[str], timeout: int = 1200) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    env.pop("PROMETHEUS_MULTIPROC_DIR", None)
    # cwd: the package tree, so ``-c``'s sys.path[0] ("") cannot shadow it with the source layout
    script = [str(tree.parent / "src" / argv[0]), *argv[1:]] if argv[0].endswith(".py") else argv
    res = subprocess.run([sys.executable, *script], env=env, cwd=tree, capture_output=True,
                         text=True, timeout=timeout)
    if res.returncode != 0:
        raise RuntimeError(f"{argv[0]} in {tree}: exit {res.returncode}\n{res.stderr[-3000:]}")
    return res


def router_figures(tree: Path, calls: int) -> dict[str, float]:
    """pick() per policy / random.choice, from the tree's own bench/router.py."""
    _run(tree, ["bench/router.py", "--calls", str(calls), "--repeats", "5", "--no-redis"])
    res = json.loads((tree.parent / "src/bench/results/router.json").read_text())["results"]
    return {f"router {k} pick / random.choice": v["ratio_vs_anchor"] for k, v in res.items() if "ratio_vs_anchor" in v}


def receiver_figures(tree: Path, seconds: float) -> dict[str, float]:
    """Webhook -> action p99 and time per post under load, each / the bare 200 handler's."""
    _run(tree, ["bench/receiver.py", "--rounds", "2", "--seconds", str(seconds), "--big-alerts", "500"])
    d = json.loads((tree.parent / "src/bench/results/receiver.json").read_text())
    lat, thr = d["latency"], d["throughput"]
    out = {}
    for server in ("mem", "pg"):
        out[f"receiver {server} journal: webhook->action p99 / anchor"] = lat[f"{server}/ascii"]["p99_ms"] / lat["bare/ascii"]["p99_ms"]
        out[f"receiver {server} journal: time per post / anchor"] = thr["bare/ascii"]["posts_s"] / thr[f"{server}/ascii"]["posts_s"]
    return out


def forecaster_figures(tree: Path, steps: int) -> dict[str, float]:
    """Online scoring p99 (and the full store step) / the bare LSTM forward."""
    res = _run(tree, ["-c", FORECASTER_DRIVER, str(tree.parent / "src/bench"), str(steps)])
    line = next(ln for ln in res.stdout.splitlines() if ln.startswith("RESULT "))
    return {f"forecaster {k} p99 / forward": v for k, v in json.loads(line[7:]).items()}


def gateway_rows(rounds: int, ref: str) -> tuple[list[dict], dict[str, Any]]:
    """CPU per proxied stream of the gateway before and today (defaults), interleaved."""
    def variants(legacy: Path, sink: str) -> dict[str, dict[str, str]]:
        return {f"before ({ref}, anchor)": {"PYTHONPATH": str(legacy)}, "today": {}}
    with tempfile.TemporaryDirectory() as tmp:
        rows, info = bench_otel(rounds, 20, 25, Path(tmp), ref, drain_s=1.0, variants_of=variants)
    per_round = list(info["per_round_cpu_ms"].values())
    ratios = [b / a if a else None for a, b in zip(per_round[0], per_round[1], strict=True)]
    return rows, {"gateway CPU per stream today / before": ratios}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ref", default=STRUCTURE_BASE_REF, help="the tree before the structure pass")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--only", action="append", choices=["gateway", "router", "receiver", "forecaster"])
    ap.add_argument("--router-calls", type=int, default=100_000)
    ap.add_argument("--receiver-seconds", type=float, default=3.0)
    ap.add_argument("--forecaster-steps", type=int, default=300)
    args = ap.parse_args()
    only = set(args.only or ("gateway", "router", "receiver", "forecaster"))
    trees = {"before": legacy_tree(args.ref), "today": legacy_tree("HEAD")}
    per_round: dict[str, list[float | None]] = {}
    out: dict[str, Any] = {"inputs": {"ref": args.ref, "today": "HEAD", **{k: v for k, v in vars(args).items()
                                                                            if k not in ("ref",)}}}
    if "gateway" in only:
        rows, ratios = gateway_rows(args.rounds + 2, args.ref)
        print_table(rows, "gateway CPU per proxied stream (interleaved processes)")
        out["gateway"] = rows
        per_round.update(ratios)
    figures = []
    if "router" in only:
        figures.append(lambda t: router_figures(t, args.router_calls))
    if "receiver" in only:
        figures.append(lambda t: receiver_figures(t, args.receiver_seconds))
    if "forecaster" in only:
        figures.append(lambda t: forecaster_figures(t, args.forecaster_steps))
    raw: list[dict[str, dict[str, float]]] = []
    for i in range(args.rounds):
        order = ["before", "today"] if i % 2 == 0 else ["today", "before"]
        got: dict[str, dict[str, float]] = {"before": {}, "today": {}}
        for fig in figures:
            for name in order:
                got[name].update(fig(trees[name]))
        raw.append(got)
        print(f"round {i + 1}/{args.rounds} done", flush=True)
        for k in got["today"]:
            if k in got["before"]:
                per_round.setdefault(k, []).append(got["today"][k] / got["before"][k])
    table = []
    for k, ratios in per_round.items():
        iv = paired_interval(ratios)
        table.append({"figure (lower is better)": k, "today / before": iv.get("geomean"),
                      "95 % low": iv.get("low"), "95 % high": iv.get("high"), "rounds": iv["rounds"],
                      "within noise or better": iv.get("low") is not None and iv["low"] <= 1.0})
    print_table(table, f"today / before ({args.ref}): paired rounds")
    out.update({"per_round": per_round, "raw": raw, "summary": table})
    write_result("structure", out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
