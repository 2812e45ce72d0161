"""Champion/challenger: a newly trained model replaces the serving one only when it does better.

Both models are scored by the backtest (:func:`llmsla.forecaster.backtest.score`: each with its
own scaler and serving threshold, under the online alarm policy) on the same store history, and
judged on its held-out part - the latest days, which the candidate neither trained nor picked
its threshold on. The candidate is promoted when its breach recall is at least the champion's
plus ``margin`` **and** its false alarms per healthy target-day are no more than the champion's
(or than the budget the thresholds are picked for, ``forecast.false_alarms_per_day``, when the
champion's are fewer: a champion that never alarms must not be unbeatable). Otherwise it is
refused with the reason. See docs/forecaster.md#championchallenger-gate.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from llmsla.forecaster import metrics as m

#: how much a recall may differ and still be "equal" (float noise, not a margin)
_EPS = 1e-9


@dataclass(frozen=True)
class Score:
    """One model on the held-out part: what the gate compares."""

    version: str
    recall: float  # breach episodes warned ahead / breach episodes
    warned: int
    events: int
    false_alarms_per_day: float
    mean_lead_s: float

    @classmethod
    def of(cls, version: str, report: m.Report) -> Score:
        return cls(version, float(report.recall[m.NONE]), int(report.warned[m.NONE]), int(report.events[m.NONE]),
                   float(report.false_alarms_per_day), float(report.mean_lead_s[m.NONE]))

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class Verdict:
    promote: bool
    reason: str
    candidate: Score
    champion: Score
    champion_label: str  # "v1a2b3c (model 4)" or "the shipped model v…"

    def to_dict(self) -> dict:
        return {"promote": self.promote, "reason": self.reason, "candidate": self.candidate.to_dict(),
                "champion": self.champion.to_dict(), "champion_label": self.champion_label}


def silent(val: m.Report, fa_budget: float) -> str | None:
    """Why a freshly trained model never alarms, or None when it does.

    Its threshold is the lowest that keeps validation within ``fa_budget`` false alarms per
    healthy target-day; a validation part of few target-days allows one or two false alarms,
    and when even the top scores include more the threshold lands above every score. The gate
    then refuses it on recall, which alone does not say that the history, not the model, was
    too short. See docs/forecaster.md#from-the-store-end-to-end."""
    alarmed = (val.alarm_share > 0) or val.false_alarms > 0 or sum(val.warned.values()) > 0
    if alarmed or not val.healthy_days > 0:
        return None
    room = fa_budget * val.healthy_days
    return (f"the model never alarms on its validation part: {val.healthy_days:.2f} healthy target-days at "
            f"{fa_budget:g} false alarms per target-day allow {room:.1f}, and its highest scores held more, "
            f"so its threshold ({val.threshold:.3f}) is above every score; read a longer history (--from) "
            f"or give validation a larger --split share")


def judge(cand: Score, champ: Score, *, margin: float, fa_budget: float, champion_label: str) -> Verdict:
    """The gate's rule (module docstring), a pure function of the two held-out scores."""
    def verdict(promote: bool, why: str) -> Verdict:
        return Verdict(promote, why, cand, champ, champion_label)

    if cand.events == 0:
        return verdict(False, f"kept champion {champion_label}: the held-out part holds no breach to compare on")
    needed = min(1.0, champ.recall + margin)  # a perfect champion is matched, at no more false alarms
    fa_cap = max(champ.false_alarms_per_day, fa_budget)
    if cand.recall + _EPS < needed:
        return verdict(False, f"kept champion {champion_label}: recall {cand.recall:.2f} "
                              f"({cand.warned}/{cand.events}) vs {needed:.2f} needed "
                              f"(champion {champ.recall:.2f} + margin {margin:g})")
    if cand.false_alarms_per_day > fa_cap + _EPS:
        return verdict(False, f"kept champion {champion_label}: {cand.false_alarms_per_day:.1f} false alarms per "
                              f"target-day vs at most {fa_cap:.1f} (champion {champ.false_alarms_per_day:.1f}, "
                              f"budget {fa_budget:g})")
    return verdict(True, f"promoted over {champion_label}: recall {cand.recall:.2f} ({cand.warned}/{cand.events}) "
                         f"vs {champ.recall:.2f}, {cand.false_alarms_per_day:.1f} vs "
                         f"{champ.false_alarms_per_day:.1f} false alarms per target-day on the held-out part")
