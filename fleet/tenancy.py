"""The simulator's tenant and class mix: which tenant and class each simulated request is for.

``llmsla simulate --tenant-mix acme/interactive:3,globex/batch:1,default:1`` gives each arrival a
(tenant, class) pair drawn with those weights, so a replay has several tenants and classes on its
events and series, as the gateway's resolver (exporters/tenants.py) gives real traffic. The draws
use their own seeded generator: the same run with or without a mix has the same arrivals,
routing and latencies. See docs/fleet.md.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

from llmsla import names
from llmsla.events import string_problem


@dataclass(frozen=True)
class Share:
    tenant: str
    class_: str
    weight: float


def parse_mix(spec: str) -> tuple[Share, ...]:
    """``TENANT[/CLASS]:WEIGHT,...`` (class default: names.DEFAULT_CLASS); ValueError names the
    item and what is wrong with it."""
    out: list[Share] = []
    seen: set[tuple[str, str]] = set()
    for item in (s.strip() for s in spec.split(",")):
        if not item:
            raise ValueError(f"tenant mix {spec!r}: an empty item (expected TENANT[/CLASS]:WEIGHT,...)")
        who, sep, weight_s = item.rpartition(":")
        if not sep or not who:
            raise ValueError(f"tenant mix item {item!r}: expected TENANT[/CLASS]:WEIGHT")
        tenant, _, class_ = who.partition("/")
        class_ = class_ or names.DEFAULT_CLASS
        for what, value in (("tenant", tenant), ("class", class_)):
            problem = string_problem(value) if value else "empty"
            if problem:
                raise ValueError(f"tenant mix item {item!r}: the {what} is not a usable label ({problem})")
        try:
            weight = float(weight_s)
        except ValueError:
            raise ValueError(f"tenant mix item {item!r}: weight {weight_s!r} is not a number") from None
        if not math.isfinite(weight) or weight <= 0:
            raise ValueError(f"tenant mix item {item!r}: weight must be a finite number > 0")
        if (tenant, class_) in seen:
            raise ValueError(f"tenant mix item {item!r}: {tenant}/{class_} is named twice")
        seen.add((tenant, class_))
        out.append(Share(tenant, class_, weight))
    return tuple(out)


class Picker:
    """Draws each request's (tenant, class) from a mix; without one, the defaults."""

    def __init__(self, mix: tuple[Share, ...], seed: int) -> None:
        self.mix = mix
        self._rng = random.Random(seed)
        self._pairs = [(s.tenant, s.class_) for s in mix]
        self._cum: list[float] = []
        total = 0.0
        for s in mix:
            total += s.weight
            self._cum.append(total)

    def pick(self) -> tuple[str, str]:
        if not self._pairs:
            return names.DEFAULT_TENANT, names.DEFAULT_CLASS
        return self._rng.choices(self._pairs, cum_weights=self._cum)[0]
