"""Chi-squared goodness of fit, for the tests that check a sampler keeps the target's distribution."""

from __future__ import annotations

import math

MIN_EXPECTED = 5  # cells expected fewer times are pooled, the usual chi-squared rule


def chi2_sf(x: float, dof: int) -> float:
    """P(chi2_dof > x): the regularised upper incomplete gamma Q(dof/2, x/2) (series / Lentz)."""
    a, z = dof / 2.0, x / 2.0
    if z <= 0:
        return 1.0
    log_front = a * math.log(z) - z - math.lgamma(a)
    if z < a + 1:  # series for P(a, z)
        term = total = 1.0 / a
        for i in range(1, 1000):
            term *= z / (a + i)
            total += term
            if term < total * 1e-16:
                break
        return 1.0 - total * math.exp(log_front)
    b, c, d = z + 1 - a, 1e300, 1 / (z + 1 - a)  # continued fraction for Q(a, z)
    h = d
    for i in range(1, 1000):
        an = -i * (i - a)
        b += 2
        d = an * d + b
        d = 1e-300 if abs(d) < 1e-300 else d
        c = b + an / c
        c = 1e-300 if abs(c) < 1e-300 else c
        d = 1 / d
        h *= d * c
        if abs(d * c - 1) < 1e-16:
            break
    return h * math.exp(log_front)


def goodness_of_fit(counts: dict, probs: dict) -> tuple[float, int, float]:
    """(statistic, degrees of freedom, p-value); a draw in a zero-probability cell fails."""
    impossible = {cell: c for cell, c in counts.items() if probs.get(cell, 0.0) == 0.0}
    assert not impossible, f"tokens the target rules out were committed: {impossible}"
    total = sum(counts.values())
    bins = [([c], total * p) for c, p in probs.items() if total * p >= MIN_EXPECTED]
    rare = [c for c, p in probs.items() if 0 < total * p < MIN_EXPECTED]
    if rare:
        bins.append((rare, total * sum(probs[c] for c in rare)))
    observed = [sum(counts.get(c, 0) for c in cells) for cells, _ in bins]
    stat = sum((o - e) ** 2 / e for o, (_, e) in zip(observed, bins))
    dof = len(bins) - 1
    return stat, dof, chi2_sf(stat, dof)
