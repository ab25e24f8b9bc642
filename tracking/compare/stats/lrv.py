"""Long-run variance of a linearised series around its own smooth trend, vectorised over rows.

The variance of a window's mean ``mean(z)`` is ``LRV / n`` with ``LRV`` the long-run variance
(``2 pi`` times the spectral density at frequency 0) of the noise of ``z``. Three steps:

1. **Trend.** ``z`` is regressed on the discrete orthonormal Legendre polynomials of degree
   ``0 .. d`` over the unit index (``d = TREND_DEGREE`` once there are ``TREND_MIN_UNITS`` units,
   else 0). The degree-0 term is the mean, i.e. the estimand itself; the other ``d`` terms are the
   smooth trend, which is part of the window's value, not noise. Extra regressors (an episode's
   indicator) can be removed too. ``e = M z`` is the residual (``M`` the residual maker).
2. **Equal-weighted cosine (EWC) estimate.** ``LRV = sum_j (phi_j' e)^2 / tr(C)`` over the
   orthonormal cosines ``phi_j(t) = sqrt(2 / n) cos(pi j (t + 1/2) / n)``, ``j = 1 .. K``, with
   ``C = Phi' M Phi``. Dividing by ``tr(C)`` instead of ``K`` makes the estimate unbiased for
   white noise after the trend is removed; its Satterthwaite degrees of freedom
   ``tr(C)^2 / tr(C^2)`` (``K`` without a trend) are those of the t critical value. ``K`` is
   ``0.4 n^(2/3)`` (Lazarus, Lewis, Stock & Watson 2018), lowered to ``0.1 n (1 - rho)`` under
   strong persistence (``rho`` the lag-1 autocorrelation of ``e``) so the cosines used stay in the
   flat part of the spectrum, and never below ``K_MIN``.
3. **Persistence at the window's scale.** The variance of batch sums of ``e`` per unit, ``L(m)``
   (normalised so that white noise gives ``sigma^2`` at every batch size ``m``), is compared at
   ``m`` and ``4 m`` (``m = n / 64``). For short memory it stops growing once ``m`` exceeds the
   correlation length; a ratio ``L(4m) / L(m) > VR_LIMIT`` means persistence at the scale of the
   window (long memory, or a near-unit-root wander). The estimate is then widened to
   ``max(LRV, ratio * L(4m))`` and flagged; likewise when the coarsest cosines reaching ``K_MIN``
   give a larger estimate than ``K``.
4. **Long memory** (``memory.measure``). The rise of the EWC's own cosines towards frequency 0 is
   measured as the memory parameter ``d`` of ARFIMA(0, d, 0) noise; wherever ``d_hat > 0`` and
   that survives removing the window's largest excursion (an episode is not memory), the EWC
   estimate times the exact ratio of the variance of the mean to the EWC's expectation under that
   model replaces the estimate when larger (not only where ``d_hat`` is significant: a correction
   behind a pre-test fails exactly the windows that just miss it); the row is flagged where
   ``d_hat`` is significant.

The effective sample size is ``n * gamma0 / LRV`` with ``gamma0`` the residual variance (degrees of
freedom corrected) and ``LRV`` the point estimate (step 4 at ``d_hat`` where long memory is
found; the interval's uses ``memory.WIDEN`` standard errors more wherever it is applied), capped
at ``n``: from the same estimate that sets the interval. Every step is a few passes over ``n``
numbers and one real FFT of length ``n`` per row: O(n log n); the model's expectations are cached per
window length.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from cliptrack.compare.stats.cosines import cosine_coefficients, polynomial_overlap, trend_basis
from cliptrack.compare.stats.memory import measure
from cliptrack.compare.stats.quantiles import f_quantile

TREND_DEGREE = 2
"""Highest Legendre degree of the smooth trend removed before the variance (linear + quadratic)."""
TREND_MIN_UNITS = 50
"""Fewest units for which a trend is removed (below, only the mean)."""
K_MIN = 4
"""Fewest cosine terms of the EWC estimate (t critical values with at least about 4 df)."""
FLAT_SHARE = 0.1
"""Cosine terms are kept below ``FLAT_SHARE * n * (1 - rho)``, where an AR(1) spectrum is still flat."""
VR_LIMIT = 1.8
"""Variance ratio ``L(4m) / L(m)`` above which the series is flagged as persistent at window scale."""
EXTRAPOLATE = 1.5
"""When flagged, ``L`` is extrapolated from batches of ``4m`` towards the window as ``L(4m) ratio^EXTRAPOLATE``
(power-law growth of the batch-mean variance; ``ratio^2`` would reach batches of ``n``)."""
VR_BATCHES = 64
"""Batches at the smaller batch size of the long-memory check (at most; see ``batch_sizes``)."""
VR_TAU = 2.0
"""The smaller batch size is at least this many integrated autocorrelation times ``(1 + rho) / (1 - rho)``,
so that short-memory correlation has died out within a batch."""
VR_MIN_BATCHES = 4
"""Fewest batches at the larger batch size for the check to run."""


def batch_sizes(n: int, lag1: np.ndarray) -> np.ndarray:
    """Smaller batch size ``m`` of the long-memory check per row: ``max(n // VR_BATCHES, VR_TAU tau)``."""
    rho = np.clip(np.nan_to_num(lag1, nan=0.0), 0.0, 0.999)
    return np.maximum(n // VR_BATCHES, np.ceil(VR_TAU * (1.0 + rho) / (1.0 - rho))).astype(int)


@dataclass(frozen=True)
class LongRunVariance:
    """Per-row results (1-d arrays, one entry per row of the input).

    ``lrv``: long-run variance (units of ``z`` squared); ``df``: degrees of freedom of the t critical
    value; ``gamma0``: residual variance; ``lag1``: lag-1 autocorrelation of the residual;
    ``terms``: cosine terms ``K``; ``trend_terms``: trend terms removed (not counting the mean);
    ``variance_ratio``: ``L(4m) / L(m)`` (NaN when too short); ``long_memory``: flagged (step 3 or
    4); ``memory``: the memory parameter ``d`` where step 4 found long memory, else 0;
    ``ess``: ``n * gamma0 / lrv_point`` capped at ``n``; ``memory_tested``: step 4 ran (enough
    cosines to tell long memory from chance, ``memory.SE_MAX``; about 470 units or more for a flat
    series).
    """

    lrv: np.ndarray
    df: np.ndarray
    gamma0: np.ndarray
    lag1: np.ndarray
    terms: np.ndarray
    trend_terms: np.ndarray
    variance_ratio: np.ndarray
    long_memory: np.ndarray
    memory: np.ndarray
    ess: np.ndarray
    memory_tested: np.ndarray


def choose_terms(n: int, lag1: np.ndarray, q: int) -> np.ndarray:
    """EWC cosine terms per row: ``min(0.4 n^(2/3), 0.1 n (1 - rho))`` within ``[K_MIN, n // 2 - q]``."""
    rule = 0.4 * n ** (2.0 / 3.0)
    rho = np.clip(np.nan_to_num(lag1, nan=0.0), -0.5, 1.0)
    k = np.floor(np.minimum(rule, FLAT_SHARE * n * (1.0 - rho)))
    top = max(1, n // 2 - q)
    return np.clip(k, min(K_MIN, top), top).astype(int)


def _ewc(coef: np.ndarray, overlap: np.ndarray, k: int) -> tuple[np.ndarray, float]:
    """EWC estimate over the first ``k`` cosines of residual coefficients ``coef`` (rows x >= k), and
    its Satterthwaite degrees of freedom, for a trend basis with cosine overlaps ``overlap``."""
    b = overlap[:, :k]
    # C = I - B'B (k x k) is never formed: tr(C) = k - |B|^2, tr(C^2) = k - 2 |B|^2 + |B B'|^2
    bb = b @ b.T
    tr = k - float(np.trace(bb))
    tr2 = k - 2.0 * float(np.trace(bb)) + float(np.sum(bb * bb))
    return np.sum(coef[:, :k] ** 2, axis=1) / tr, tr * tr / tr2


def _low_terms(overlap: np.ndarray, n: int, q: int) -> int:
    """Fewest lowest cosines whose part outside the trend, ``tr(C)``, reaches ``K_MIN``."""
    left = np.cumsum(1.0 - np.sum(overlap * overlap, axis=0))
    reach = np.flatnonzero(left >= K_MIN - 1e-9)
    return int(reach[0]) + 1 if reach.size else max(1, min(n // 2 - q, overlap.shape[1]))


def _batch_lrv(e: np.ndarray, basis: np.ndarray, m: int) -> np.ndarray:
    """``L(m)``: squared batch sums of ``e`` over their white-noise expectation ``sum_b 1_b' M 1_b``."""
    nb = e.shape[1] // m
    sums = e[:, : nb * m].reshape(e.shape[0], nb, m).sum(axis=2)
    proj = basis[: nb * m].reshape(nb, m, -1).sum(axis=1)
    expected = nb * m - float(np.sum(proj * proj))
    return (sums * sums).sum(axis=1) / max(expected, 1e-300)


TREND_LEVEL = 0.01
"""Significance level of the test that a smooth trend is there (F test against the EWC variance)."""


def _test_terms(n: int) -> int:
    return int(max(K_MIN, min(n // 2 - 1, round(0.4 * n ** (2.0 / 3.0)))))


def trend_is_significant(z: np.ndarray, degree: int, zcoef: np.ndarray | None = None) -> np.ndarray:
    """Per row of ``z``: whether its Legendre terms ``1 .. d`` (for some ``d <= degree``) exceed what
    stationary noise gives: ``F = (||terms||^2 / d) / LRV`` with the EWC estimate over
    ``0.4 n^(2/3)`` cosines of the row around its mean (trend included, so a strong persistent wander
    is not mistaken for a trend), against the F(d, K) quantile at ``1 - TREND_LEVEL / degree``.
    ``zcoef``: the rows' cosine coefficients when already computed."""
    rows, n = z.shape
    if degree < 1:
        return np.zeros(rows, bool)
    basis = trend_basis(n, degree)
    trend = (z @ basis)[:, 1:]
    k = _test_terms(n)
    c = cosine_coefficients(z, k) if zcoef is None or zcoef.shape[1] < k else zcoef[:, :k]
    lrv = np.sum(c * c, axis=1) / k
    found = np.zeros(rows, bool)
    for d in range(1, degree + 1):  # the first d terms jointly, each at TREND_LEVEL / degree
        size = np.sum(trend[:, :d] ** 2, axis=1) / d
        with np.errstate(divide="ignore", invalid="ignore"):
            f = np.where(lrv > 0, size / lrv, np.where(size > 0, np.inf, 0.0))
        found |= f > f_quantile(1.0 - TREND_LEVEL / degree, d, k)
    return found


def long_run_variance(
    z: np.ndarray,
    *,
    degree: int | None = None,
    extra: np.ndarray | None = None,
    floor: bool = True,
    memory_gate: float | None = None,
) -> LongRunVariance:
    """The long-run variance of each row of ``z`` (``(rows, n)``, or one 1-d series) around its
    smooth trend (see the module docstring). ``degree``: trend degree (default: ``TREND_DEGREE``
    from ``TREND_MIN_UNITS`` units where the trend test finds one, else 0); ``extra``: ``n x r``
    further regressors removed with the trend; ``floor``: the coarsest cosines' estimate when it is
    larger (step 3) and the long-memory step (4); off for the episode scan, whose Bonferroni
    threshold needs the band's df; ``memory_gate``: the long-memory correction applies where
    ``d_hat > memory_gate * se`` (default ``memory.APPLY_GATE``: wherever ``d_hat > 0``)."""
    z = np.atleast_2d(np.asarray(z, dtype=float))
    rows, n = z.shape
    if n < 2:
        nan = np.full(rows, np.nan)
        zero = np.zeros(rows, int)
        no = np.zeros(rows, bool)
        return LongRunVariance(nan, nan, nan, nan, zero, zero, nan, no, nan, nan, no)
    zcoef = cosine_coefficients(z, min(n, max(_test_terms(n), 4 * K_MIN)))  # the one FFT per row
    if degree is not None:
        return _fixed_degree(z, degree, extra, floor, zcoef, memory_gate)
    top = TREND_DEGREE if n >= TREND_MIN_UNITS else 0
    with_trend = trend_is_significant(z, top, zcoef)
    if with_trend.all() or not with_trend.any():
        return _fixed_degree(z, top if with_trend.all() else 0, extra, floor, zcoef, memory_gate)
    parts = {
        d: (mask, _fixed_degree(z[mask], d, extra, floor, zcoef[mask], memory_gate))
        for d, mask in ((top, with_trend), (0, ~with_trend))
    }
    merged = {}
    for name in LongRunVariance.__dataclass_fields__:
        out = np.empty(rows, dtype=getattr(parts[0][1], name).dtype)
        for mask, part in parts.values():
            out[mask] = getattr(part, name)
        merged[name] = out
    return LongRunVariance(**merged)


@dataclass(frozen=True)
class _Memory:
    """Step 4 per row: ``d_hat`` where long memory was found (else 0), ``found``, ``tested``, and the
    EWC estimate corrected for it (interval, point) with its degrees of freedom."""

    d_hat: np.ndarray
    found: np.ndarray
    tested: np.ndarray
    corrected: np.ndarray
    corrected_point: np.ndarray
    corrected_df: np.ndarray


def _long_memory(
    e: np.ndarray,
    coef: np.ndarray,
    terms: np.ndarray,
    degree: int,
    lrv: np.ndarray,
    df: np.ndarray,
    memory_gate: float | None,
) -> _Memory:
    """Step 4: long memory measured in the EWC's own cosines, per group of rows with ``K`` terms."""
    rows = e.shape[0]
    out = _Memory(
        np.zeros(rows), np.zeros(rows, bool), np.zeros(rows, bool), lrv.copy(), lrv.copy(), df.copy()
    )
    for k in np.unique(terms):
        rows_k = terms == k
        m = measure(e[rows_k], coef[rows_k], degree, int(k), memory_gate)
        out.d_hat[rows_k], out.found[rows_k] = np.where(m.found, m.d, 0.0), m.found
        out.tested[rows_k] = m.tested
        out.corrected[rows_k] *= m.interval
        out.corrected_point[rows_k] *= m.point
        out.corrected_df[rows_k] *= m.df_scale
    return out


def _coarse_floor(
    coef: np.ndarray, overlap: np.ndarray, low_k: int, lrv: np.ndarray, df: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """``(lrv, df, ratio, flagged)``: the estimate widened to the coarsest cosines' where those give
    more; ``ratio`` their ratio to it, ``flagged`` where above ``VR_LIMIT``."""
    coarse, coarse_df = _ewc(coef, overlap, low_k)
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.where(lrv > 0, coarse / lrv, np.nan)
    flagged = np.nan_to_num(ratio) > VR_LIMIT
    wider = np.nan_to_num(ratio) > 1.0
    return np.where(wider, coarse, lrv), np.where(wider, coarse_df, df), ratio, flagged


def _batch_check(
    e: np.ndarray,
    basis: np.ndarray,
    lag1: np.ndarray,
    lrv: np.ndarray,
    ratio: np.ndarray,
    flagged: np.ndarray,
) -> None:
    """Step 3 in place: where batch variances grow from ``m`` to ``4m`` by more than ``VR_LIMIT``, the
    row's ``ratio`` is that growth, it is ``flagged``, and ``lrv`` is raised to the extrapolation."""
    n = e.shape[1]
    sizes = batch_sizes(n, lag1)
    for m in np.unique(sizes):
        rows_m = sizes == m
        if m < 1 or n // (4 * m) < VR_MIN_BATCHES:
            continue
        small, large = _batch_lrv(e[rows_m], basis, int(m)), _batch_lrv(e[rows_m], basis, 4 * int(m))
        with np.errstate(divide="ignore", invalid="ignore"):
            vr = np.where(small > 0, large / small, np.nan)
        hit = np.nan_to_num(vr) > VR_LIMIT
        idx = np.flatnonzero(rows_m)
        ratio[idx[hit]] = vr[hit]
        flagged[idx[hit]] = True
        lrv[idx[hit]] = np.maximum(lrv[idx[hit]], vr[hit] ** EXTRAPOLATE * large[hit])


def _fixed_degree(
    z: np.ndarray,
    degree: int,
    extra: np.ndarray | None,
    floor: bool,
    zcoef: np.ndarray,
    memory_gate: float | None = None,
) -> LongRunVariance:
    """``long_run_variance`` at a given trend degree; ``zcoef``: cosine coefficients of ``z`` (the
    residual's are ``zcoef - (z' basis) overlap``, since the transform is linear)."""
    rows, n = z.shape
    degree = max(0, min(degree, n - 2))
    basis = trend_basis(n, degree, extra)
    q = basis.shape[1]
    proj = z @ basis
    e = z - proj @ basis.T
    ss = np.einsum("ij,ij->i", e, e)
    gamma0 = ss / max(n - q, 1)
    with np.errstate(divide="ignore", invalid="ignore"):
        lag1 = np.where(ss > 0, np.einsum("ij,ij->i", e[:, 1:], e[:, :-1]) / ss, np.nan)
    terms = choose_terms(n, lag1, q)
    kmax = int(terms.max())
    k_over = max(kmax, min(n - q, 4 * K_MIN))
    overlap = (  # (q, k): phi_j' basis_i
        polynomial_overlap(n, degree, k_over) if extra is None else cosine_coefficients(basis.T, k_over)
    )
    low_k = _low_terms(overlap, n, q)
    need = max(kmax, low_k)
    if zcoef.shape[1] >= need and overlap.shape[1] >= need:
        coef = zcoef[:, :need] - proj @ overlap[:, :need]
    else:
        coef = cosine_coefficients(e, need)
    lrv, df = np.empty(rows), np.empty(rows)
    for k in np.unique(terms):
        rows_k = terms == k
        lrv[rows_k], df[rows_k] = _ewc(coef[rows_k], overlap, int(k))
    if floor and extra is None:  # step 4: long memory in the EWC's own cosines
        memory = _long_memory(e, coef, terms, degree, lrv, df, memory_gate)
    else:
        memory = _Memory(
            np.zeros(rows), np.zeros(rows, bool), np.zeros(rows, bool), lrv.copy(), lrv.copy(), df.copy()
        )
    ratio = np.full(rows, np.nan)
    flagged = np.zeros(rows, bool)
    if floor and low_k < int(terms.min()):
        lrv, df, ratio, flagged = _coarse_floor(coef, overlap, low_k, lrv, df)
    _batch_check(e, basis, lag1, lrv, ratio, flagged)
    corrected, corrected_point, corrected_df = memory.corrected, memory.corrected_point, memory.corrected_df
    d_hat, found, tested = memory.d_hat, memory.found, memory.tested
    point = np.maximum(lrv, corrected_point)
    wider = corrected > lrv
    lrv, df = np.where(wider, corrected, lrv), np.where(wider, corrected_df, df)
    with np.errstate(divide="ignore", invalid="ignore"):
        ess = np.where(point > 0, np.minimum(n, n * gamma0 / point), float(n))
    trend_terms = np.full(rows, degree)
    return LongRunVariance(
        lrv, df, gamma0, lag1, terms, trend_terms, ratio, flagged | found, d_hat, ess, tested
    )


def autocovariances(z: np.ndarray) -> np.ndarray:
    """Sample autocovariances ``gamma_0 .. gamma_{n-1}`` of each row of ``z`` (demeaned, divisor
    ``n``), by FFT; a 1-d ``z`` gives a 1-d result."""
    z = np.asarray(z, dtype=float)
    rows = np.atleast_2d(z)
    n = rows.shape[1]
    d = rows - rows.mean(axis=1, keepdims=True)
    size = 1 << int(2 * n - 1).bit_length()
    f = np.fft.rfft(d, size, axis=1)
    g = np.fft.irfft(f * np.conj(f), size, axis=1)[:, :n] / n
    return g if z.ndim == 2 else g[0]
