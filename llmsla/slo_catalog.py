"""The SLO catalog: the one loaded, validated model of the SLO specs that every component reads.

The OpenSLO files in ``slo.dir`` are the source; the rules, the stream job, the forecaster, the
A/B report, the dashboards and the HTML report take their thresholds, targets and the meaning of
"failed" from here, so editing a spec changes every one of them. The per-SLI definitions a
store-side reader evaluates are written here once; specs over other queries generate rules only.
See docs/alerting.md#one-catalog-for-every-component.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

from llmsla import names
from llmsla.config import Config, ConfigError
from llmsla.resources import deploy
from llmsla.slo_specs import SCOPE_LABELS, SloSpec, load_specs, spec_files
from llmsla.yamlsrc import SourceError

SLI_TTFT = names.SLO_TTFT
SLI_E2E = names.SLO_E2E
SLI_TPOT = "tpot"
SLI_AVAILABILITY = names.SLO_AVAILABILITY
#: The request histogram a latency SLI reads -> the SLI.
LATENCY_SLIS: dict[str, str] = {
    names.REQUEST_TTFT_SECONDS: SLI_TTFT,
    names.REQUEST_E2E_SECONDS: SLI_E2E,
    names.REQUEST_TPOT_SECONDS: SLI_TPOT,
}
#: The SLIs every catalog must define: the store's windows count within-SLO requests against
#: TTFT and E2E, and the forecaster labels breaches of all three.
REQUIRED_SLIS: tuple[str, ...] = (SLI_TTFT, SLI_E2E, SLI_AVAILABILITY)
_MATCHER = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)\s*(=~|!~|!=|=)\s*"((?:[^"\\]|\\.)*)"')


@dataclass(frozen=True)
class Objective:
    """One SLO as a store-side reader evaluates it."""

    name: str  # the spec's name: the alerts' ``slo`` label
    sli: str  # SLI_TTFT | SLI_E2E | SLI_TPOT | SLI_AVAILABILITY
    target: float  # share of good events required, in (0, 1)
    threshold_ms: float = 0.0  # latency SLIs
    failed: frozenset[str] = frozenset()  # availability: request statuses that spend the budget
    counted: frozenset[str] = frozenset()  # availability: request statuses in the total
    window_days: int = 30
    file: str = ""
    tenant: str = ""  # the tenant it holds to this objective ('': any tenant)
    class_: str = ""  # the class it holds to this objective ('': any class)

    @property
    def error_budget(self) -> float:
        return 1.0 - self.target

    @property
    def specificity(self) -> int:
        """How narrow the scope is: tenant and class (3) > tenant (2) > class (1) > fleet (0)."""
        return 2 * bool(self.tenant) + bool(self.class_)

    def applies(self, tenant: str, class_: str) -> bool:
        """Whether a request of ``tenant`` and ``class_`` is held to this objective."""
        return self.tenant in ("", tenant) and self.class_ in ("", class_)


@dataclass(frozen=True)
class Catalog:
    """Every SLO spec, and the objectives the store-side readers evaluate."""

    specs: tuple[SloSpec, ...]
    objectives: tuple[Objective, ...]  # the fleet-wide ones, one per SLI
    source: str
    #: the objectives of specs that target a tenant, a class or both (one per SLI and scope)
    scoped: tuple[Objective, ...] = ()

    def objective(self, sli: str) -> Objective | None:
        """The fleet-wide objective on ``sli`` (None when no spec defines one)."""
        return next((o for o in self.objectives if o.sli == sli), None)

    def objectives_for(self, sli: str) -> tuple[Objective, ...]:
        """Every objective on ``sli``: the fleet-wide one first (when defined), then the per-class
        and per-tenant ones, most specific last."""
        return tuple(sorted((o for o in (*self.objectives, *self.scoped) if o.sli == sli),
                            key=lambda o: (o.specificity, o.tenant, o.class_)))

    def for_request(self, sli: str, tenant: str = names.DEFAULT_TENANT,
                    class_: str = names.DEFAULT_CLASS) -> Objective | None:
        """The objective a request of ``tenant`` and ``class_`` is held to on ``sli``: the most
        specific that applies (tenant and class, then tenant, then class, then the fleet's);
        None when no spec defines ``sli``."""
        hits = [o for o in self.objectives_for(sli) if o.applies(tenant, class_)]
        return hits[-1] if hits else None

    @cached_property
    def scoped_tenants(self) -> frozenset[str]:
        """The tenants some objective targets (every other tenant gets its class's or the fleet's)."""
        return frozenset(o.tenant for o in self.scoped if o.tenant)

    @cached_property
    def scoped_classes(self) -> frozenset[str]:
        return frozenset(o.class_ for o in self.scoped if o.class_)

    def required(self, sli: str) -> Objective:
        """The objective on one of :data:`REQUIRED_SLIS` (:func:`load` guarantees it)."""
        o = self.objective(sli)
        assert o is not None, sli
        return o

    @property
    def ttft_ms(self) -> float:
        """The TTFT threshold the store's ``ttft_within_slo`` counts against."""
        return self.required(SLI_TTFT).threshold_ms

    @property
    def e2e_ms(self) -> float:
        """The E2E threshold the store's ``e2e_within_slo`` counts against."""
        return self.required(SLI_E2E).threshold_ms

    @property
    def availability(self) -> Objective:
        return self.required(SLI_AVAILABILITY)

    @property
    def latency_target(self) -> float:
        """The strictest latency target (what one "share within SLO" line on a chart shows)."""
        return max(o.target for o in self.objectives if o.sli != SLI_AVAILABILITY)

    def summary(self) -> str:
        """One line for reports and logs: each objective in words."""
        parts = []
        for o in self.objectives:
            share = f"{100 * o.target:.4g} %"
            if o.sli == SLI_AVAILABILITY:
                parts.append(f"{o.name} {share} without {' or '.join(sorted(o.failed))}")
            else:
                parts.append(f"{o.name} {share} within {o.threshold_ms:g} ms")
        return ", ".join(parts)


def statuses(selector: str) -> frozenset[str]:
    """The request statuses a ``llmsla_requests_total{...}`` selector's ``status`` matchers
    select (Prometheus semantics: ``=~``/``!~`` are fully anchored)."""
    out = set(names.STATUSES)
    for label, op, value in _MATCHER.findall(selector):
        if label != names.L_STATUS:
            continue
        value = value.encode().decode("unicode_escape")
        if op in ("=", "!="):
            hit = {s for s in out if s == value}
        else:
            rx = re.compile(value)
            hit = {s for s in out if rx.fullmatch(s)}
        out = hit if op in ("=", "=~") else out - hit
    return frozenset(out)


def _metric(selector: str) -> str:
    return selector.split("{", 1)[0].strip()


def _objective(spec: SloSpec) -> Objective | None:
    """The store-side reading of one spec, or None for a query the store cannot evaluate."""
    common: dict[str, Any] = dict(name=spec.name, target=spec.target, window_days=spec.window_days, file=spec.file,
                                  tenant=spec.scope.get(names.L_TENANT, ""), class_=spec.scope.get(names.L_CLASS, ""))
    if spec.kind == "latency" and spec.histogram in LATENCY_SLIS:
        return Objective(sli=LATENCY_SLIS[spec.histogram], threshold_ms=spec.threshold_s * 1000.0, **common)
    requests_total = names.REQUESTS + "_total"
    if spec.kind == "ratio" and _metric(spec.total) == requests_total and \
            _metric(spec.bad or spec.good) == requests_total:
        counted = statuses(spec.total)
        failed = statuses(spec.bad) & counted if spec.bad else counted - statuses(spec.good)
        return Objective(sli=SLI_AVAILABILITY, failed=failed, counted=counted, **common)
    return None


def specs_dir(cfg: Config) -> Path:
    """``slo.dir``, else ``deploy/slo`` (the working directory's copy, else the packaged one)."""
    return Path(cfg.slo.dir) if cfg.slo.dir else deploy("slo")


def _scope_words(spec: SloSpec) -> str:
    if not spec.filters:
        return "fleet-wide"
    return "for " + ", ".join(f"{k} {v}" for k, v in sorted(spec.filters.items()))


def objectives_of(specs: list[SloSpec] | tuple[SloSpec, ...]) -> tuple[list[Objective], list[Objective]]:
    """(fleet-wide, per tenant/class) objectives of ``specs``. Two specs with the same SLI and the
    same target (model, pool, tenant, class) are a :class:`ConfigError` naming both files and
    lines: a request could not be held to both, and the store counts one per SLI. A spec
    restricted to a model or pool generates its rules but holds no request here."""
    fleet: list[Objective] = []
    scoped: list[Objective] = []
    seen: dict[tuple[str, tuple[tuple[str, str], ...]], SloSpec] = {}
    for spec in specs:
        o = _objective(spec)
        if o is None:
            continue
        key = (o.sli, tuple(sorted(spec.filters.items())))
        twin = seen.get(key)
        if twin is not None:
            what = "second fleet-wide" if not spec.filters else "second"
            raise ConfigError(f"{spec.where}: SLO {spec.name!r} is a {what} {o.sli} objective {_scope_words(spec)} "
                              f"(first: {twin.name!r} in {twin.where}); one spec per SLI and target")
        seen[key] = spec
        if not spec.filters:
            fleet.append(o)
        elif not set(spec.filters) - set(SCOPE_LABELS):
            scoped.append(o)
    return fleet, scoped


def load(cfg: Config, directory: Path | None = None, period_days: int = 30) -> Catalog:
    """Load and validate every spec; :class:`~llmsla.config.ConfigError` names the file, line
    and field of a bad one. Objectives must be unique per SLI and target (a store window holds
    one within-SLO count per SLI); fleet-wide TTFT, E2E and availability must be defined."""
    d = directory if directory is not None else specs_dir(cfg)
    try:
        specs = load_specs(spec_files(d), cfg, period_days)
    except SourceError as exc:
        raise ConfigError(str(exc)) from None
    objectives, scoped = objectives_of(specs)
    for sli in REQUIRED_SLIS:
        if not any(o.sli == sli for o in objectives):
            raise ConfigError(f"{d}: no fleet-wide {sli} SLO; the store, the forecaster and the reports need one "
                              f"(see {deploy('slo')} for the shipped ones)")
    return Catalog(specs=tuple(specs), objectives=tuple(objectives), source=str(d), scoped=tuple(scoped))
