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

from collections.abc import Callable
from dataclasses import dataclass, field

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
    token) that objective is moot.

    The fields are the fleet-wide bounds; with a catalog, a request of a tenant or class that a
    spec targets is held to its own (``Catalog.for_request``: the most specific objective per
    SLI), so a batch request within the batch class's E2E is goodput
    (docs/alerting.md#slos-per-class-and-per-tenant)."""

    ttft_ms: float | None
    tpot_ms: float | None
    e2e_ms: float | None
    catalog: slo_catalog.Catalog | None = field(default=None, compare=False, repr=False)
    #: the tenants and classes some spec targets (empty: every request gets the fields' bounds)
    tenants: frozenset[str] = frozenset()
    classes: frozenset[str] = frozenset()
    #: (tenant, class) as the catalog tells them apart -> their bounds; bounded by the specs
    _scoped: dict[tuple[str, str], GoodputBounds] = field(default_factory=dict, compare=False, repr=False)

    @classmethod
    def from_catalog(cls, cat: slo_catalog.Catalog) -> GoodputBounds:
        def bound(sli: str) -> float | None:
            o = cat.objective(sli)
            return None if o is None else o.threshold_ms

        return cls(bound(slo_catalog.SLI_TTFT), bound(slo_catalog.SLI_TPOT), bound(slo_catalog.SLI_E2E), cat,
                   cat.scoped_tenants, cat.scoped_classes)

    def _key(self, tenant: str | None, class_: str | None) -> tuple[str, str]:
        """(tenant, class) as the specs tell them apart: "" where no spec targets the value."""
        return (tenant if tenant in self.tenants else "", class_ if class_ in self.classes else "")

    def for_request(self, tenant: str, class_: str) -> GoodputBounds:
        """The bounds a request of ``tenant`` and ``class_`` is held to (these, when no spec
        targets either)."""
        key = self._key(tenant, class_)
        if key == ("", "") or self.catalog is None:
            return self
        got = self._scoped.get(key)
        if got is None:
            cat = self.catalog

            def bound(sli: str) -> float | None:
                o = cat.for_request(sli, *key)
                return None if o is None else o.threshold_ms

            got = self._scoped[key] = GoodputBounds(bound(slo_catalog.SLI_TTFT), bound(slo_catalog.SLI_TPOT),
                                                    bound(slo_catalog.SLI_E2E))
        return got

    def met(self, ttft_s: float | None, tpot_s: float | None, e2e_s: float, *,
            tenant: str | None = None, class_: str | None = None) -> bool:
        """The latency part of the rule, in seconds (the gateway's measures): the fleet's
        objectives, or with ``tenant`` and/or ``class_`` the most specific objective of that
        tenant and class per SLI; the caller checks the status."""
        if self._key(tenant, class_) != ("", ""):
            return self.for_request(tenant or "", class_ or "").met(ttft_s, tpot_s, e2e_s)
        ttft = e2e_s if ttft_s is None else ttft_s
        return ((self.e2e_ms is None or e2e_s <= self.e2e_ms / 1000.0)
                and (self.ttft_ms is None or ttft <= self.ttft_ms / 1000.0)
                and (self.tpot_ms is None or tpot_s is None or tpot_s <= self.tpot_ms / 1000.0))

    def request_met(self, status: str, ttft_ms: float | None, e2e_ms: float, output_tokens: int, *,
                    tenant: str | None = None, class_: str | None = None) -> bool:
        """The whole rule for one ``RequestEvent``'s fields (durations in ms)."""
        if status != names.STATUS_OK:
            return False
        ttft_s = None if ttft_ms is None else ttft_ms / 1000.0
        return self.met(ttft_s, tpot_seconds(status, ttft_s, e2e_ms / 1000.0, output_tokens), e2e_ms / 1000.0,
                        tenant=tenant, class_=class_)

    def sql(self, *, status_ok: str, ttft: str = "ttft_ms", e2e: str = "e2e_ms",
            output_tokens: str = "output_tokens", tenant: str = "tenant", class_: str = "class",
            text: Callable[[str], str] = lambda v: "'" + v.replace("'", "''") + "'") -> str:
        """:meth:`request_met` as a SQL predicate over a request's columns (Flink SQL and
        PostgreSQL): ``status_ok`` is the condition "status is ok" in the caller's dialect and
        ``text`` renders a string literal its tenant and class columns compare with. The same
        comparisons in seconds as :meth:`met`, so a value on a bound is judged alike; scoped
        specs become a CASE over the tenants and classes they target, most specific first."""
        if self.catalog is None or not (self.tenants or self.classes):
            return "(" + " AND ".join([status_ok, *self._latency_sql(ttft, e2e, output_tokens)]) + ")"
        keys = sorted(self._scoped_keys(), key=lambda k: (k[0] == "", k[1] == "", k))
        branches = []
        for t, c in keys:
            cond = " AND ".join([*([f"{tenant} = {text(t)}"] if t else []), *([f"{class_} = {text(c)}"] if c else [])])
            branches.append(f"WHEN {cond} THEN {self.for_request(t, c)._latency_case(ttft, e2e, output_tokens)}")
        fleet = self._latency_case(ttft, e2e, output_tokens)
        return f"({status_ok} AND CASE {' '.join(branches)} ELSE {fleet} END)"

    def _scoped_keys(self) -> list[tuple[str, str]]:
        """Every (tenant, class) pair the specs tell apart, "" standing for any other value."""
        return [(t, c) for t in [*self.tenants, ""] for c in [*self.classes, ""] if (t, c) != ("", "")]

    def _latency_case(self, ttft: str, e2e: str, output_tokens: str) -> str:
        return "(" + " AND ".join(self._latency_sql(ttft, e2e, output_tokens) or ["TRUE"]) + ")"

    def _latency_sql(self, ttft: str, e2e: str, output_tokens: str) -> list[str]:
        """Each latency objective as a SQL condition (none: no spec sets a latency SLI)."""
        parts: list[str] = []
        if self.e2e_ms is not None:
            parts.append(f"{e2e} / {_K} <= {_double(self.e2e_ms / 1000.0)}")
        if self.ttft_ms is not None:
            parts.append(f"COALESCE({ttft}, {e2e}) / {_K} <= {_double(self.ttft_ms / 1000.0)}")
        if self.tpot_ms is not None:
            # TPOT exists for a request with a first token and 2+ output tokens (tpot_seconds)
            tpot = f"GREATEST(0E0, {e2e} / {_K} - {ttft} / {_K}) / ({output_tokens} - 1)"
            parts.append(f"({ttft} IS NULL OR {output_tokens} < 2 OR {tpot} <= {_double(self.tpot_ms / 1000.0)})")
        return parts


#: Milliseconds per second as a DOUBLE literal (``1000.0`` is a DECIMAL in Flink SQL).
_K = "1000E0"


def _double(x: float) -> str:
    """A float as a DOUBLE literal that reads back as the same float (Flink SQL, PostgreSQL)."""
    text = repr(float(x))
    return text if "e" in text else f"{text}E0"
