"""The few statistics the leaderboards need: mean and sample std, a one-sided Welch t-test, a Pareto front.

Pure Python so the sweep summary works anywhere; the t-test uses scipy when it is installed (it is in the
``dev`` and ``report`` extras) and an equivalent Student-t tail (regularized incomplete beta) otherwise.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass


def finite(values: Iterable[object]) -> list[float]:
    """The values that are real finite numbers (None, NaN, inf and strings dropped)."""
    out = []
    for v in values:
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            continue
        if math.isfinite(v):
            out.append(float(v))
    return out


def mean(xs: Sequence[float]) -> float | None:
    return math.fsum(xs) / len(xs) if xs else None


def std(xs: Sequence[float]) -> float | None:
    """Sample standard deviation (n - 1); None below two values."""
    if len(xs) < 2:
        return None
    m = math.fsum(xs) / len(xs)
    return math.sqrt(math.fsum((x - m) ** 2 for x in xs) / (len(xs) - 1))


ALTERNATIVES = ("less", "greater", "two-sided")
"""H1 of the Welch test, as scipy names it: mean(a) < mean(b) (a beats b when lower is better), mean(a) > mean(b)
(an ablation: taking a lever out makes it worse), or mean(a) != mean(b)."""


@dataclass(frozen=True)
class Welch:
    """Welch's unequal-variance t-test of H1 ``alternative`` (ALTERNATIVES; "less": a beats b when lower is better)."""

    t: float
    df: float
    p: float
    delta: float
    """mean(a) - mean(b)."""
    alternative: str = "less"


def welch_less(a: Sequence[float], b: Sequence[float]) -> Welch | None:
    """One-sided Welch t-test that ``a`` has a lower mean than ``b``. None when either side has < 2 values."""
    return welch(a, b, "less")


def welch(a: Sequence[float], b: Sequence[float], alternative: str = "less") -> Welch | None:
    """Welch t-test of H1 ``alternative`` (ALTERNATIVES) for the means of ``a`` and ``b``. None when either side has
    < 2 values."""
    if alternative not in ALTERNATIVES:
        raise ValueError(f"alternative={alternative!r} is not one of {', '.join(ALTERNATIVES)}")
    w = _welch_less(a, b)
    if w is None or alternative == "less":
        return w
    # P(T >= t) = P(T <= -t) by symmetry; two-sided: twice the smaller tail (capped at 1 for t = 0).
    greater = 1.0 - w.p if math.isinf(w.t) else student_t_cdf(-w.t, w.df)
    p = greater if alternative == "greater" else min(1.0, 2.0 * min(w.p, greater))
    return Welch(t=w.t, df=w.df, p=p, delta=w.delta, alternative=alternative)


def _welch_less(a: Sequence[float], b: Sequence[float]) -> Welch | None:
    a, b = finite(a), finite(b)
    if len(a) < 2 or len(b) < 2:
        return None
    ma, mb, sa, sb = mean(a), mean(b), std(a), std(b)
    assert ma is not None and mb is not None and sa is not None and sb is not None  # two or more values each
    va, vb = sa**2, sb**2
    se2 = va / len(a) + vb / len(b)
    delta = ma - mb
    if se2 == 0.0:  # identical constant samples: no evidence either way unless the means differ
        p = 0.0 if delta < 0 else 1.0 if delta > 0 else 0.5
        return Welch(
            t=-math.inf if delta < 0 else math.inf if delta > 0 else 0.0,
            df=float(len(a) + len(b) - 2),
            p=p,
            delta=delta,
        )
    t = delta / math.sqrt(se2)
    df = se2**2 / ((va / len(a)) ** 2 / (len(a) - 1) + (vb / len(b)) ** 2 / (len(b) - 1))
    return Welch(t=t, df=df, p=student_t_cdf(t, df), delta=delta)


def student_t_cdf(t: float, df: float) -> float:
    """P(T <= t) for Student's t with ``df`` degrees of freedom (scipy when available)."""
    try:
        from scipy import stats as sps
    except ImportError:
        return _t_cdf(t, df)
    return float(sps.t.cdf(t, df))


def _t_cdf(t: float, df: float) -> float:
    # P(T <= t) = 1 - I_x(df/2, 1/2) / 2 for t > 0, with x = df / (df + t^2); symmetric for t < 0.
    if math.isinf(t):
        return 0.0 if t < 0 else 1.0
    x = df / (df + t * t)
    tail = 0.5 * _betainc(df / 2.0, 0.5, x)
    return tail if t < 0 else 1.0 - tail


def _betainc(a: float, b: float, x: float) -> float:
    """Regularized incomplete beta I_x(a, b) by its continued fraction (modified Lentz)."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    log_front = math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)
    if x > (a + 1.0) / (a + b + 2.0):  # the fraction converges fast only below this point: use the symmetry
        return 1.0 - _betainc(b, a, 1.0 - x)
    tiny = 1e-300
    c, d = 1.0, 1.0 - (a + b) * x / (a + 1.0)
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 500):
        for num in (
            m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)),
            -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1)),
        ):
            d = 1.0 + num * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + num / c
            c = c if abs(c) > tiny else tiny
            h *= d * c
        if abs(d * c - 1.0) < 1e-15:
            break
    return math.exp(log_front) * h / a


def pareto_front(points: Sequence[tuple[float, float]]) -> list[int]:
    """Indices of the points no other point beats on both axes, for (x higher is better, y lower is better),
    e.g. (tokens_per_s, val_bpb). Returned in increasing x."""
    order = sorted(range(len(points)), key=lambda i: (-points[i][0], points[i][1]))
    front, best_y = [], math.inf
    for i in order:
        if points[i][1] < best_y:
            front.append(i)
            best_y = points[i][1]
    return sorted(front, key=lambda i: points[i][0])


@dataclass(frozen=True)
class Below:
    """One-sample t-test of H1: the population mean is below ``target`` (modded-nanogpt's acceptance of a record:
    the mean final val loss over seeds is below 3.28 with p < 0.01)."""

    t: float
    df: float
    p: float
    delta: float
    """mean - target."""


def ttest_below(xs: Sequence[float], target: float) -> Below | None:
    """One-sided one-sample t-test that the values' mean is below ``target``. None with fewer than 2 values."""
    xs = finite(xs)
    if len(xs) < 2:
        return None
    m, s = mean(xs), std(xs)
    assert m is not None and s is not None
    delta, df = m - target, float(len(xs) - 1)
    if s == 0.0:  # constant values: certain either way, unless exactly at the target
        return Below(
            t=math.copysign(math.inf, delta) if delta else 0.0,
            df=df,
            p=0.0 if delta < 0 else 1.0 if delta > 0 else 0.5,
            delta=delta,
        )
    t = delta / (s / math.sqrt(len(xs)))
    return Below(t=t, df=df, p=student_t_cdf(t, df), delta=delta)


def holm(p_values: Sequence[float]) -> list[float]:
    """Holm's step-down adjusted p-values, in the input order.

    Several groups tested against one baseline inflate false wins; Holm bounds
    the family-wise error without assuming the tests are independent.
    """
    m = len(p_values)
    order = sorted(range(m), key=lambda i: p_values[i])
    adjusted = [0.0] * m
    running = 0.0
    for rank, i in enumerate(order):
        # Monotone: a larger raw p never gets a smaller adjusted p.
        running = max(running, min(1.0, (m - rank) * p_values[i]))
        adjusted[i] = running
    return adjusted
