"""Goodput: the one rule for "this request met every latency objective at once".

A request counts as goodput when it succeeded (status ``ok``) and its TTFT, TPOT and E2E are each
within the SLO catalog's objective for that SLI (AIPerf's and vLLM bench's ``--goodput``). The
gateway's live counter (``llmsla_request_goodput_total``, exporters) and the stream job's
``goodput`` column of the store windows (streaming) both apply it, so it lives in core: the
predicate in Python (:meth:`GoodputBounds.met`) and the same predicate rendered as SQL for the job
(:meth:`GoodputBounds.sql`), side by side; ``tests/unit/test_goodput.py`` pins the rule and the
stream job's windows are checked against an independent reference of it (tests/streaming).
See docs/gateway.md#metrics-exportersmetricspy and docs/streaming.md#windows.
"""

from __future__ import annotations

from dataclasses import dataclass

from llmsla import names, slo_catalog


def tpot_seconds(status: str, ttft_s: float | None, e2e_s: float, output_tokens: int) -> float | None:
    """Per-request time per output token, as the GenAI conventions define
    ``gen_ai.server.time_per_output_token``: (E2E - TTFT) / (output tokens - 1), for a
    successful request with a first token and at least two output tokens; else None. One
    definition for the Prometheus histogram, the OTLP metric and goodput, so they agree."""
    if status != names.STATUS_OK or ttft_s is None or output_tokens < 2:
        return None
    return max(0.0, e2e_s - ttft_s) / (output_tokens - 1)


@dataclass(frozen=True)
class GoodputBounds:
    """The latency objectives a request must meet at once to count as goodput, in ms as the
    catalog states them (None: no spec sets that SLI). Without a first token (a non-streamed
    response) TTFT is its E2E, as the event contract records it; without a TPOT (one output
    token) that objective is moot."""

    ttft_ms: float | None
    tpot_ms: float | None
    e2e_ms: float | None

    @classmethod
    def from_catalog(cls, cat: slo_catalog.Catalog) -> GoodputBounds:
        def bound(sli: str) -> float | None:
            o = cat.objective(sli)
            return None if o is None else o.threshold_ms

        return cls(bound(slo_catalog.SLI_TTFT), bound(slo_catalog.SLI_TPOT), bound(slo_catalog.SLI_E2E))

    def met(self, ttft_s: float | None, tpot_s: float | None, e2e_s: float) -> bool:
        """The latency part of the rule, in seconds (the gateway's measures); the caller checks
        the status."""
        ttft = e2e_s if ttft_s is None else ttft_s
        return ((self.e2e_ms is None or e2e_s <= self.e2e_ms / 1000.0)
                and (self.ttft_ms is None or ttft <= self.ttft_ms / 1000.0)
                and (self.tpot_ms is None or tpot_s is None or tpot_s <= self.tpot_ms / 1000.0))

    def request_met(self, status: str, ttft_ms: float | None, e2e_ms: float, output_tokens: int) -> bool:
        """The whole rule for one ``RequestEvent``'s fields (durations in ms)."""
        if status != names.STATUS_OK:
            return False
        ttft_s = None if ttft_ms is None else ttft_ms / 1000.0
        return self.met(ttft_s, tpot_seconds(status, ttft_s, e2e_ms / 1000.0, output_tokens), e2e_ms / 1000.0)

    def sql(self, *, status_ok: str, ttft: str = "ttft_ms", e2e: str = "e2e_ms",
            output_tokens: str = "output_tokens") -> str:
        """:meth:`request_met` as a SQL predicate over a request's columns (Flink SQL and
        PostgreSQL): ``status_ok`` is the condition "status is ok" in the caller's dialect. The
        same comparisons in seconds as :meth:`met`, so a value on a bound is judged alike."""
        parts = [status_ok]
        if self.e2e_ms is not None:
            parts.append(f"{e2e} / {_K} <= {_double(self.e2e_ms / 1000.0)}")
        if self.ttft_ms is not None:
            parts.append(f"COALESCE({ttft}, {e2e}) / {_K} <= {_double(self.ttft_ms / 1000.0)}")
        if self.tpot_ms is not None:
            # TPOT exists for a request with a first token and 2+ output tokens (tpot_seconds)
            tpot = f"GREATEST(0E0, {e2e} / {_K} - {ttft} / {_K}) / ({output_tokens} - 1)"
            parts.append(f"({ttft} IS NULL OR {output_tokens} < 2 OR {tpot} <= {_double(self.tpot_ms / 1000.0)})")
        return "(" + " AND ".join(parts) + ")"


#: Milliseconds per second as a DOUBLE literal (``1000.0`` is a DECIMAL in Flink SQL).
_K = "1000E0"


def _double(x: float) -> str:
    """A float as a DOUBLE literal that reads back as the same float (Flink SQL, PostgreSQL)."""
    text = repr(float(x))
    return text if "e" in text else f"{text}E0"
