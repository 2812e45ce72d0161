"""The 1-minute and 1-hour roll-ups of ``request_windows``, from one column list.

Plain PostgreSQL gets ordinary views (``date_bin``); TimescaleDB gets continuous aggregates
(``time_bucket``). Both expose the same names and columns. Counts and sums roll up exactly, so
attainment (``ttft_within_slo / requests``) and means (``ttft_sum_ms / ttft_count``, ITL pooled
variance from ``itl_sumsq_ms2``) are exact at any width; a percentile cannot be merged from
percentiles, so the roll-ups keep the worst 5 s window's P99 (``*_p99_ms_max``).
"""

from __future__ import annotations

from llmsla import names

ROLLUPS: dict[str, str] = {
    names.T_REQUEST_WINDOWS_1M: "1 minute",
    names.T_REQUEST_WINDOWS_1H: "1 hour",
}

_SUMS = (
    "requests", "ok", "errors", "timeouts", "cancelled", "rejected", "prompt_tokens",
    "output_tokens", "ttft_within_slo", "e2e_within_slo", "ttft_count", "ttft_sum_ms",
    "e2e_sum_ms", "itl_n", "itl_sum_ms", "itl_sumsq_ms2",
)
_MAXES = ("ttft_p99_ms", "e2e_p99_ms", "queue_p99_ms", "ttft_slo_ms", "e2e_slo_ms")


def rollup_select(width: str, *, timescale: bool) -> str:
    bucket = (
        f"time_bucket(INTERVAL '{width}', bucket)"
        if timescale
        else f"date_bin(INTERVAL '{width}', bucket, TIMESTAMPTZ '2000-01-01 00:00:00+00')"
    )
    cols = [f"{bucket} AS bucket", "model", "pool", "replica", "arm", "count(*) AS windows"]
    cols += [f"sum({c}) AS {c}" for c in _SUMS]
    cols += [f"max({c}) AS {c}_max" if c.endswith("_p99_ms") else f"max({c}) AS {c}" for c in _MAXES]
    return (
        "SELECT " + ",\n       ".join(cols) + f"\nFROM {names.T_REQUEST_WINDOWS}\n"
        f"GROUP BY {bucket}, model, pool, replica, arm"
    )


def rollup_ddl(*, timescale: bool) -> str:
    stmts = []
    for view, width in ROLLUPS.items():
        body = rollup_select(width, timescale=timescale)
        if timescale:
            stmts.append(
                f"CREATE MATERIALIZED VIEW IF NOT EXISTS {view}\n"
                f"WITH (timescaledb.continuous, timescaledb.materialized_only = false) AS\n{body}\nWITH NO DATA;"
            )
        else:
            stmts.append(f"CREATE OR REPLACE VIEW {view} AS\n{body};")
    return "\n\n".join(stmts)
