"""Binomial statistics for per-category accuracy: Wilson interval, two-proportion z-test, sample size.

Formulas (why: docs/decisions/accuracy.md, "BFCL accuracy: a stratified sample, a drop that is both large and significant"):
* Wilson 95 %: (p + z²/2n ± z·sqrt(p(1-p)/n + z²/4n²)) / (1 + z²/n), z = 1.96.
* Drop test (one-sided, pooled): z = (p_base - p_now) / sqrt(p̄(1-p̄)(1/n_base + 1/n_now)),
  p̄ = (k_base + k_now) / (n_base + n_now); p-value = P(Z >= z).
* Items per category (each of the two runs) to detect a drop from p1 to p2 with one-sided level α and power 1-β:
  n = (z_α·sqrt(2·p̄(1-p̄)) + z_β·sqrt(p1(1-p1) + p2(1-p2)))² / (p1 - p2)², p̄ = (p1 + p2) / 2.
"""

from __future__ import annotations

import math
from statistics import NormalDist

Z95 = 1.959963984540054


def wilson(passed: int, n: int, z: float = Z95) -> tuple[float, float]:
    """95 % Wilson score interval of ``passed``/``n`` ((0, 1) for n = 0: nothing is known)."""
    if n <= 0:
        return 0.0, 1.0
    p = passed / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    return max(0.0, centre - half), min(1.0, centre + half)


def drop_z(k_base: int, n_base: int, k_now: int, n_now: int) -> tuple[float, float]:
    """(z, one-sided p-value) of the hypothesis that accuracy dropped from the baseline to now."""
    if n_base <= 0 or n_now <= 0:
        return 0.0, 1.0
    pooled = (k_base + k_now) / (n_base + n_now)
    se = math.sqrt(pooled * (1 - pooled) * (1 / n_base + 1 / n_now))
    diff = k_base / n_base - k_now / n_now
    if se == 0:
        # Both runs all-pass or all-fail: identical figures are no drop; otherwise impossible (pooled would vary).
        return (0.0, 1.0) if diff == 0 else (math.inf, 0.0)
    z = diff / se
    return z, 1 - NormalDist().cdf(z)


def items_needed(p1: float, drop: float, alpha: float = 0.05, power: float = 0.8) -> int:
    """Items per category in each run to detect a drop of ``drop`` from accuracy ``p1`` (one-sided test)."""
    p2 = p1 - drop
    pbar = (p1 + p2) / 2
    za, zb = NormalDist().inv_cdf(1 - alpha), NormalDist().inv_cdf(power)
    n = (za * math.sqrt(2 * pbar * (1 - pbar)) + zb * math.sqrt(p1 * (1 - p1) + p2 * (1 - p2))) ** 2 / drop ** 2
    return math.ceil(n)
