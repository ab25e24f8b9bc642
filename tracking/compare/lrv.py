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
3. **Long-memory check.** The variance of batch sums of ``e`` per unit, ``L(m)`` (normalised so that
   white noise gives ``sigma^2`` at every batch size ``m``), is compared at ``m`` and ``4 m``
   (``m = n / 64``). For short memory it stops growing once ``m`` exceeds the correlation length;
   a ratio ``L(4m) / L(m) > VR_LIMIT`` means persistence at the scale of the window (long memory,
   or a near-unit-root wander). The estimate is then widened to ``max(LRV, ratio * L(4m))`` and
   flagged.

The effective sample size is ``n * gamma0 / LRV`` with ``gamma0`` the residual variance (degrees of
freedom corrected), capped at ``n``: the same estimate that sets the interval. Every step is a
few passes over ``n`` numbers and one FFT of length ``2n`` per row: O(n log n).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

TREND_DEGREE = 2
"""Highest Legendre degree of the smooth trend removed before the variance (linear + quadratic)."""
TREND_MIN_UNITS = 50
"""Fewest units for which a trend is removed (below, only the mean)."""
K_MIN = 4
"""Fewest cosine terms of the EWC estimate (t critical values with at least about 4 df)."""
VR_LIMIT = 2.0
"""Variance ratio ``L(4m) / L(m)`` above which the series is flagged as persistent at window scale."""
VR_BATCHES = 64
"""Batches at the smaller batch size of the long-memory check (``m = n // VR_BATCHES``)."""


@dataclass(frozen=True)
class LongRunVariance:
    """Per-row results (1-d arrays, one entry per row of the input).

    ``lrv``: long-run variance (units of ``z`` squared); ``df``: degrees of freedom of the t critical
    value; ``gamma0``: residual variance; ``lag1``: lag-1 autocorrelation of the residual;
    ``terms``: cosine terms ``K``; ``trend_terms``: trend terms removed (not counting the mean);
    ``variance_ratio``: ``L(4m) / L(m)`` (NaN when too short); ``long_memory``: flagged;
    ``ess``: ``n * gamma0 / lrv`` capped at ``n``.
    """

    lrv: np.ndarray
    df: np.ndarray
    gamma0: np.ndarray
    lag1: np.ndarray
    terms: np.ndarray
    trend_terms: int
    variance_ratio: np.ndarray
    long_memory: np.ndarray
    ess: np.ndarray


def cosine_coefficients(x: np.ndarray, k: int) -> np.ndarray:
    """``phi_j' x`` for ``j = 1 .. k`` along the last axis (one FFT of length ``2n``)."""
    n = x.shape[-1]
    f = np.fft.rfft(x, 2 * n, axis=-1)[..., 1 : k + 1]
    j = np.arange(1, f.shape[-1] + 1)
    return np.sqrt(2.0 / n) * (f * np.exp(-1j * np.pi * j / (2.0 * n))).real


def trend_basis(n: int, degree: int, extra: np.ndarray | None = None) -> np.ndarray:
    """Orthonormal columns (``n x q``) spanning the Legendre polynomials of degree ``0 .. degree``
    over the unit index, plus the columns of ``extra`` (``n x r``) if given."""
    x = (2.0 * np.arange(n) + 1.0) / n - 1.0
    v = np.polynomial.legendre.legvander(x, degree)
    if extra is not None:
        v = np.column_stack([v, extra])
    q, r = np.linalg.qr(v)
    keep = np.abs(np.diag(r)) > 1e-10 * max(1.0, float(np.abs(np.diag(r)).max()))
    return q[:, keep]


def choose_terms(n: int, lag1: np.ndarray, q: int) -> np.ndarray:
    """EWC cosine terms per row: ``min(0.4 n^(2/3), 0.1 n (1 - rho))`` within ``[K_MIN, n // 2 - q]``."""
    rule = 0.4 * n ** (2.0 / 3.0)
    rho = np.clip(np.nan_to_num(lag1, nan=0.0), -0.5, 1.0)
    k = np.floor(np.minimum(rule, 0.1 * n * (1.0 - rho)))
    top = max(1, n // 2 - q)
    return np.clip(k, min(K_MIN, top), top).astype(int)


def _batch_lrv(e: np.ndarray, basis: np.ndarray, m: int) -> np.ndarray:
    """``L(m)``: squared batch sums of ``e`` over their white-noise expectation ``sum_b 1_b' M 1_b``."""
    nb = e.shape[1] // m
    sums = e[:, : nb * m].reshape(e.shape[0], nb, m).sum(axis=2)
    proj = basis[: nb * m].reshape(nb, m, -1).sum(axis=1)
    expected = nb * m - float(np.sum(proj * proj))
    return (sums * sums).sum(axis=1) / max(expected, 1e-300)


def long_run_variance(
    z: np.ndarray, *, degree: int | None = None, extra: np.ndarray | None = None
) -> LongRunVariance:
    """The long-run variance of each row of ``z`` (``(rows, n)``, or one 1-d series) around its
    smooth trend (see the module docstring). ``degree``: trend degree (default ``TREND_DEGREE`` from
    ``TREND_MIN_UNITS`` units); ``extra``: ``n x r`` further regressors removed with the trend."""
    z = np.atleast_2d(np.asarray(z, dtype=float))
    rows, n = z.shape
    if n < 2:
        nan = np.full(rows, np.nan)
        return LongRunVariance(nan, nan, nan, nan, np.zeros(rows, int), 0, nan, np.zeros(rows, bool), nan)
    if degree is None:
        degree = TREND_DEGREE if n >= TREND_MIN_UNITS else 0
    degree = max(0, min(degree, n - 2))
    basis = trend_basis(n, degree, extra)
    q = basis.shape[1]
    e = z - (z @ basis) @ basis.T
    ss = np.einsum("ij,ij->i", e, e)
    gamma0 = ss / max(n - q, 1)
    with np.errstate(divide="ignore", invalid="ignore"):
        lag1 = np.where(ss > 0, np.einsum("ij,ij->i", e[:, 1:], e[:, :-1]) / ss, np.nan)
    terms = choose_terms(n, lag1, q)
    kmax = int(terms.max())
    coef = cosine_coefficients(e, kmax)
    overlap = cosine_coefficients(basis.T, kmax)  # (q, kmax): phi_j' basis_i
    lrv, df = np.empty(rows), np.empty(rows)
    for k in np.unique(terms):
        rows_k = terms == k
        b = overlap[:, :k]
        c = np.eye(k) - b.T @ b
        tr = float(np.trace(c))
        lrv[rows_k] = np.sum(coef[rows_k, :k] ** 2, axis=1) / tr
        df[rows_k] = tr * tr / float(np.sum(c * c))
    ratio = np.full(rows, np.nan)
    flagged = np.zeros(rows, bool)
    m = n // VR_BATCHES
    if m >= 1 and n // (4 * m) >= 8:
        small, large = _batch_lrv(e, basis, m), _batch_lrv(e, basis, 4 * m)
        with np.errstate(divide="ignore", invalid="ignore"):
            ratio = np.where(small > 0, large / small, np.nan)
        flagged = np.nan_to_num(ratio) > VR_LIMIT
        lrv = np.where(flagged, np.maximum(lrv, ratio * large), lrv)
    with np.errstate(divide="ignore", invalid="ignore"):
        ess = np.where(lrv > 0, np.minimum(n, n * gamma0 / lrv), float(n))
    return LongRunVariance(lrv, df, gamma0, lag1, terms, degree, ratio, flagged, ess)


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
