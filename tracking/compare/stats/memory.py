"""Long memory in the EWC cosines: the memory parameter ``d``, its test and the variance it implies.

Under short memory the spectrum of the linearised series is flat over the EWC's lowest ``K``
cosines, so their mean square estimates the long-run variance. Under long memory (spectral density
``~ lambda^(-2d)`` near frequency 0, ``0 < d < 1/2``) it is not: the cosines' power rises towards
frequency 0 and the variance of the window's mean grows like ``n^(2d - 1)``, faster than any of
them shows. This module measures that rise on the EWC's own cosines and corrects for it:

1. **Exact expectations.** For unit-variance ARFIMA(0, d, 0) noise (autocorrelations
   ``rho_k = prod_{i<=k} (i - 1 + d) / (i - d)``), ``E[(phi_j' M x)^2]`` of the residual cosine
   coefficients (``M`` the trend's residual maker) and ``n Var(mean(x))`` are computed exactly,
   with no ``n x n`` matrix: ``phi_j' Gamma phi_j = 1 + (2/n) sum_k rho_k ((n - k) cos(a k) -
   sin(a k) / sin(a))`` with ``a = pi j / n`` (two FFTs for all ``j``), and the trend terms by
   Toeplitz products (one FFT per basis column). Above ``EXACT_UNITS`` units they are computed at
   ``EXACT_UNITS`` units for the same cosine indices (both sides scale as ``n^(2d)``; the ratio
   that matters does not depend on ``n`` to first order).
2. **Estimate and test** (``correct``). ``d`` maximises the Gaussian (Whittle) pseudo-likelihood
   of the residual coefficients ``j = 1 .. K`` with those expectations, the scale profiled out,
   over a grid of step ``GRID_STEP`` in ``[0, D_MAX]``; its standard error is the inverse square
   root of the Fisher information at ``d = 0``, ``(1/2) sum_j (g_j - mean g)^2`` with
   ``g_j = d log E_j / d d``. Only where ``se <= SE_MAX`` (enough cosines to tell memory from
   chance). Long memory is **reported** (``found``) when ``d_hat > GATE * se`` (a one-sided test at
   about 16 %); the correction is **applied** wherever ``d_hat > 0`` (``applied``), significant or
   not: a correction only after a significant pre-test leaves the rows that just miss it
   uncorrected, and under real long memory those passed as equivalent in 15-30 % of replicates.
3. **Confirmed** (``confirm``). A single episode of a different level raises the low cosines too.
   The window's largest excursion (``excursions``) is removed with the trend, as an indicator, and
   ``d`` fitted again on what is left (the model's expectations for that basis): the finding is
   still reported if ``d_hat > CONFIRM_GATE * se`` then, the correction still applied if
   ``d_hat > 0``, and ``d`` is taken at most as large as is still plausible then (``d_hat + se`` of
   that fit).
4. **Correction.** The EWC estimate is multiplied by ``F(d) = n Var(mean) / E[EWC]`` under
   ARFIMA(0, d, 0): for the interval, where applied, at ``d_hat + WIDEN * se`` (capped at
   ``D_MAX``); for the effective sample size (the point estimate of the variance), where found, at
   ``d_hat``, so that neither the uncertainty of ``d_hat`` nor short memory read as a small ``d``
   by chance lowers the reported sample size (at AR 0.9 over 1,000 steps, the point at every
   ``d_hat > 0`` halved it, to 0.47 of the true one); the degrees of
   freedom shrink by the unequal expected powers of the cosines (``(sum E_j)^2 / sum E_j^2``
   against its white-noise value). Otherwise the EWC estimate stands unchanged.

``D_MAX`` keeps the model stationary: a series whose cosines rise faster (a near unit root over
the window) is corrected as if ``d = D_MAX``, which already leaves an effective sample of a few
units, below the verdict gate.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np
from cliptrack.compare.stats.cosines import cosine_coefficients, polynomial_overlap, trend_basis
from cliptrack.compare.stats.windows import scan_windows

GRID_STEP = 0.01
"""Step of the grid over which ``d`` is estimated."""
D_MAX = 0.45
"""Largest memory parameter considered (ARFIMA(0, d, 0) is stationary for ``d < 1/2``)."""
GATE = 1.0
"""Long memory is reported (``found``) when ``d_hat > GATE * se(d_hat)``."""
APPLY_GATE = 0.0
"""The correction is applied when ``d_hat > APPLY_GATE * se(d_hat)``: wherever the cosines rise at all."""
WIDEN = 1.25
"""The interval's variance uses ``d_hat + WIDEN * se`` (the effective sample size uses ``d_hat``)."""
SE_MAX = 0.2
"""Long memory is only tested where ``se(d_hat) <= SE_MAX`` (about 25 cosines or more): with fewer,
a white-noise window's correction at ``d_hat + WIDEN * se`` would cost many honest verdicts."""
CONFIRM_GATE = 0.5
"""The finding is still reported when ``d_hat > CONFIRM_GATE * se`` holds without the largest excursion
(the correction is still applied when ``d_hat > APPLY_GATE * se`` does)."""
EXCURSION_SHORTEST = 8
"""Shortest window (units) considered as an excursion in ``excursions``."""
EXACT_UNITS = 16_384
"""Above this many units the expectations are computed at this many (same cosine indices)."""
GRID = np.round(np.arange(0.0, D_MAX + GRID_STEP / 2, GRID_STEP), 10)
"""The grid of ``d`` values (read-only)."""
GRID.setflags(write=False)


@dataclass(frozen=True)
class Memory:
    """Per-row results of ``fit`` (1-d arrays).

    ``d``: estimated memory parameter; ``se``: its standard error under ``d = 0``; ``tested``: the
    test ran (``se <= SE_MAX``); ``found``: long memory reported (``d > GATE * se``, and confirmed
    where ``measure`` asks); ``applied``: the correction applied (``d > APPLY_GATE * se``, likewise
    confirmed; every ``found`` row is; only where tested);
    ``point`` / ``interval``: the factors ``F`` (>= 1) that multiply the EWC long-run variance for
    the effective sample size (exactly 1 where not found) and for the interval (exactly 1 where not
    applied); ``df_scale``: the factor on the EWC's degrees of freedom (unequal expected powers of
    the cosines leave fewer).
    """

    d: np.ndarray
    se: np.ndarray
    tested: np.ndarray
    found: np.ndarray
    applied: np.ndarray
    point: np.ndarray
    interval: np.ndarray
    df_scale: np.ndarray


def autocorrelations(n: int, d: float) -> np.ndarray:
    """``rho_0 .. rho_{n-1}`` of ARFIMA(0, d, 0)."""
    k = np.arange(1, n)
    return np.concatenate([[1.0], np.cumprod((k - 1.0 + d) / (k - d))])


def _toeplitz_times(rho: np.ndarray, v: np.ndarray) -> np.ndarray:
    """``Gamma v`` for the symmetric Toeplitz ``Gamma[s, t] = rho[|s - t|]`` and ``v`` of shape ``(n, c)``."""
    n = rho.size
    size = 1 << int(2 * n - 1).bit_length()
    column = np.concatenate([rho, np.zeros(size - 2 * n + 1), rho[:0:-1]])
    product = np.fft.irfft(np.fft.rfft(v, size, axis=0) * np.fft.rfft(column)[:, None], size, axis=0)
    return product[:n]


def model(basis: np.ndarray, kmax: int) -> tuple[np.ndarray, np.ndarray]:
    """``(E, nvar)`` over ``GRID``: ``E[g, j - 1] = E[(phi_j' M x)^2]`` for ``j = 1 .. kmax`` and
    ``nvar[g] = n Var(mean(x))``, for unit-variance ARFIMA(0, GRID[g], 0) noise ``x`` of ``n`` units,
    ``M`` the residual maker of the orthonormal columns ``basis`` (``n x q``)."""
    terms = _model_terms(basis, kmax)
    return terms.e, terms.nvar


@dataclass(frozen=True)
class _ModelTerms:
    """``model``'s ``e`` and ``nvar`` with what it formed on the way, per grid value ``g`` (read-only):
    ``basis`` (``n x q``), ``overlap = phi' basis`` (``q x kmax``), ``gb[g] = Gamma basis``
    (``n x q``) and ``cum[g, m] = rho_0 + ... + rho_{m - 1}`` (``cum[g, 0] = 0``)."""

    basis: np.ndarray
    overlap: np.ndarray
    e: np.ndarray
    nvar: np.ndarray
    gb: np.ndarray
    cum: np.ndarray


def _model_terms(basis: np.ndarray, kmax: int) -> _ModelTerms:

    n = basis.shape[0]
    kmax = min(kmax, n - 1)
    overlap = cosine_coefficients(basis.T, kmax)  # (q, kmax): phi_j' b_i
    j = np.arange(1, kmax + 1)
    a = np.pi * j / n
    lags = np.arange(n)
    e = np.empty((GRID.size, kmax))
    nvar = np.empty(GRID.size)
    gb = np.empty((GRID.size, n, basis.shape[1]))
    cum = np.zeros((GRID.size, n + 1))
    for g, d in enumerate(GRID):
        rho = autocorrelations(n, float(d))
        np.cumsum(rho, out=cum[g, 1:])
        tail = rho.copy()
        tail[0] = 0.0
        spread = np.fft.fft(tail * (n - lags), 2 * n)[1 : kmax + 1]  # sum_k w_k e^{-i a k}
        twist = np.fft.fft(tail, 2 * n)[1 : kmax + 1]
        diag = 1.0 + (2.0 / n) * (spread.real + twist.imag / np.sin(a))
        gb[g] = _toeplitz_times(rho, basis)  # Gamma b_i
        cross = cosine_coefficients(gb[g].T, kmax)  # phi_j' Gamma b_i
        inner = basis.T @ gb[g]
        e[g] = (
            diag - 2.0 * np.sum(overlap * cross, axis=0) + np.einsum("qj,qr,rj->j", overlap, inner, overlap)
        )
        nvar[g] = 1.0 + 2.0 * float(np.sum((n - lags[1:]) * rho[1:])) / n
    for array in (overlap, e, nvar, gb, cum):
        array.setflags(write=False)
    return _ModelTerms(basis, overlap, e, nvar, gb, cum)


@lru_cache(maxsize=2)
def _polynomial_terms(n: int, degree: int) -> _ModelTerms:
    """``_model_terms`` of the Legendre basis of ``degree`` over every cosine ``j = 1 .. n - 1``."""

    return _model_terms(trend_basis(n, degree), n - 1)


def _gamma_times_indicator(c: np.ndarray, start: int, stop: int) -> np.ndarray:
    """``Gamma 1_[start, stop)`` for ``Gamma[s, t] = rho[|s - t|]``, per row of the cumulative sums
    ``c`` (``rows x (n + 1)``, ``c[:, m] = rho_0 + ... + rho_{m - 1}``): O(n) per row."""
    n = c.shape[1] - 1
    rho0 = c[:, 1:2] - c[:, 0:1]
    tau = np.arange(n)
    before = c[:, np.clip(stop - tau, 0, n)] - c[:, np.clip(start - tau, 0, n)]  # lags start - tau ..
    after = c[:, np.clip(tau - start + 1, 0, n)] - c[:, np.clip(tau - stop + 1, 0, n)]  # lags .. tau - start
    inside = c[:, np.clip(tau - start + 1, 0, n)] + c[:, np.clip(stop - tau, 0, n)] - rho0
    return np.where(tau < start, before, np.where(tau >= stop, after, inside))


def _outside_trend(
    p: np.ndarray, overlap: np.ndarray, start: int, stop: int
) -> tuple[np.ndarray, float, np.ndarray, np.ndarray] | None:
    """``(p' 1, |1 - p p' 1|, u, phi' u)`` for the indicator ``1 = 1_[start, stop)`` against the
    orthonormal trend columns ``p`` (``n x q``, with ``overlap = phi' p``): its weights on the trend,
    the norm of its part outside the trend, that part normalised (``u``), and the first
    ``overlap.shape[1]`` cosine coefficients of ``u`` (closed form, ``indicator_coefficients``);
    None when the indicator lies in the trend's span."""
    n = p.shape[0]
    weights = p[start:stop].sum(axis=0)
    residual = -(p @ weights)
    residual[start:stop] += 1.0
    norm = float(np.sqrt(residual @ residual))
    if not norm > 1e-10 * np.sqrt(stop - start):
        return None
    ou = (indicator_coefficients(n, start, stop, overlap.shape[1]) - weights @ overlap) / norm
    return weights, norm, residual / norm, ou


def indicator_model(n: int, degree: int, start: int, stop: int, kmax: int) -> tuple[np.ndarray, np.ndarray]:
    """``model(trend_basis(n, degree, 1_[start, stop)), kmax)``, from the cached polynomial terms and
    one cosine transform per grid value for the indicator (``confirm`` calls it once per row)."""

    kmax = min(kmax, n - 1)
    terms = _polynomial_terms(n, degree)
    p, ov, e = terms.basis, terms.overlap[:, :kmax], terms.e[:, :kmax]
    outside = _outside_trend(p, ov, start, stop)
    if outside is None:
        return e, terms.nvar  # the indicator lies in the trend's span
    weights, norm, u, ou = outside
    gu = (_gamma_times_indicator(terms.cum, start, stop) - terms.gb @ weights) / norm  # (grid, n): Gamma u
    cu = cosine_coefficients(gu, kmax)  # phi' Gamma u
    pu = gu @ p  # (grid, q): p' Gamma u
    uu = gu @ u
    e = e - 2.0 * ou * cu + 2.0 * ou * np.einsum("qj,gq->gj", ov, pu) + uu[:, None] * ou * ou
    return e, terms.nvar


def expectations(n: int, degree: int, kmax: int) -> tuple[np.ndarray, np.ndarray]:
    """``model`` for the Legendre trend of ``degree`` (the mean included) over ``n`` units, computed
    at ``EXACT_UNITS`` units above that (every cosine at once, cached per window length)."""
    e, nvar = _legendre_model(min(n, EXACT_UNITS), degree)
    return e[:, :kmax], nvar


@lru_cache(maxsize=8)
def _legendre_model(n: int, degree: int) -> tuple[np.ndarray, np.ndarray]:
    terms = _polynomial_terms(n, degree)
    return terms.e, terms.nvar


def measure(e: np.ndarray, coef: np.ndarray, degree: int, k: int, gate: float | None = None) -> Memory:
    """Long memory of rows of residuals ``e`` (``rows x n``: series with the Legendre trend of
    ``degree`` removed) with cosine coefficients ``coef``, for an EWC over ``k`` cosines:
    ``correct``, then each row it would correct checked by ``confirm`` — the memory must still be
    there without the largest excursion, and ``d`` is at most what remains plausible then.
    ``gate``: the correction applies where ``d_hat > gate * se`` (default ``APPLY_GATE``)."""
    gate = APPLY_GATE if gate is None else gate
    n = e.shape[1]
    m = fit(coef, *expectations(n, degree, k), k, gate=gate)
    if not m.applied.any():
        return m
    plausible, d_hat, se = confirm(e[m.applied], degree, k, coef[m.applied])
    at_most, confirmed, kept = m.d.copy(), m.found.copy(), m.applied.copy()
    at_most[m.applied] = plausible
    confirmed[m.applied] &= d_hat > CONFIRM_GATE * se
    kept[m.applied] = d_hat > gate * se
    return fit(coef, *expectations(n, degree, k), k, at_most, confirmed, kept, gate)


def correct(coef: np.ndarray, n: int, degree: int, k: int) -> Memory:
    """The long-memory estimate, test and correction factors for rows of residual cosine
    coefficients ``coef`` (``rows x >= k``; ``phi_j' M z`` for ``j = 1 .. k``) of series of ``n``
    units with a Legendre trend of ``degree`` removed and an EWC over ``k`` cosines."""
    return fit(coef, *expectations(n, degree, k), k)


def fit(
    coef: np.ndarray,
    e: np.ndarray,
    nvar: np.ndarray,
    k: int,
    at_most: np.ndarray | None = None,
    confirmed: np.ndarray | None = None,
    kept: np.ndarray | None = None,
    gate: float | None = None,
) -> Memory:
    """``correct`` for a given ``model``; ``at_most``: per-row upper bound on ``d_hat``;
    ``confirmed`` / ``kept``: per-row conditions that a finding / a correction must also meet;
    ``gate``: the correction applies where ``d_hat > gate * se`` (default ``APPLY_GATE``)."""
    gate = APPLY_GATE if gate is None else gate
    rows = coef.shape[0]
    k = min(k, e.shape[1])
    e = e[:, :k]
    power = coef[:, :k] ** 2
    total = e.sum(axis=1)  # E[EWC] * tr(C), per grid value
    factor = nvar * total[0] / total  # F(d) = n Var(mean) / E[EWC]; F(0) = 1 exactly
    df_scale = (total**2 / np.sum(e * e, axis=1)) / (total[0] ** 2 / np.sum(e[0] ** 2))
    log_e = np.log(e)
    with np.errstate(divide="ignore", invalid="ignore"):
        scale = (power @ (1.0 / e).T) / k  # (rows, grid)
        objective = np.log(scale) + log_e.mean(axis=1)[None, :]
    flat = ~np.all(np.isfinite(objective), axis=1)
    objective[flat] = 0.0
    best = np.argmin(objective, axis=1)
    best[flat] = 0
    slope = (log_e[1] - log_e[0]) / (GRID[1] - GRID[0])  # d log E_j / d d at d = 0
    information = 0.5 * float(np.sum((slope - slope.mean()) ** 2))
    se = 1.0 / np.sqrt(information) if information > 0 else np.inf
    if at_most is not None:
        best = np.minimum(best, np.maximum(np.searchsorted(GRID, at_most + 1e-12) - 1, 0))
    d = GRID[best]
    tested = np.full(rows, se <= SE_MAX)
    applied = (d > gate * se) & tested
    if kept is not None:
        applied &= kept
    found = applied & (d > GATE * se)
    if confirmed is not None:
        found &= confirmed
    widened = np.minimum(np.searchsorted(GRID, d + WIDEN * se - 1e-12), GRID.size - 1)
    return Memory(
        d=d,
        se=np.full(rows, se),
        tested=tested,
        found=found,
        applied=applied,
        point=np.where(found, factor[best], 1.0),
        interval=np.where(applied, factor[widened], 1.0),
        df_scale=np.where(applied, df_scale[best], 1.0),
    )


def excursions(e: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per row of ``e`` (``rows x n``): ``(start, stop)`` of the window with the largest
    ``|sum| / sqrt(width)``: the best among widths ``n / 64 .. n / 4`` (doubling, at least
    ``EXCURSION_SHORTEST``) at starts a quarter-width apart, then its ends moved within a
    quarter-width each way, coarse to fine down to one unit (the score of a level shift peaks where
    the window matches it)."""
    rows, n = e.shape
    cum = np.concatenate([np.zeros((rows, 1)), np.cumsum(e, axis=1)], axis=1)
    shortest = max(EXCURSION_SHORTEST, n // 64)
    start, stop = scan_windows(n, shortest, max(n // 4, shortest))
    best = np.argmax(np.abs(cum[:, stop] - cum[:, start]) / np.sqrt(stop - start), axis=1)
    out_start, out_stop = start[best].copy(), stop[best].copy()
    for i in range(rows):
        reach = max(1, int(out_stop[i] - out_start[i]) // 4)
        while True:  # coarse to fine: at most 33 x 33 candidate pairs per pass
            step = max(1, reach // 16)
            s = np.arange(max(0, out_start[i] - reach), min(n - 1, out_start[i] + reach) + 1, step)
            t = np.arange(max(1, out_stop[i] - reach), min(n, out_stop[i] + reach) + 1, step)
            ss, tt = np.meshgrid(s, t, indexing="ij")
            width = tt - ss
            score = np.where(width > 0, np.abs(cum[i, tt] - cum[i, ss]) / np.sqrt(np.maximum(width, 1)), -1)
            j = np.unravel_index(int(np.argmax(score)), score.shape)
            out_start[i], out_stop[i] = ss[j], tt[j]
            if step == 1:
                break
            reach = step
    return out_start, out_stop


def indicator_coefficients(n: int, start: int, stop: int, k: int) -> np.ndarray:
    """``phi_j' 1_[start, stop)`` for ``j = 1 .. k``, in closed form:
    ``sqrt(2 / n) (sin(a stop) - sin(a start)) / (2 sin(a / 2))`` with ``a = pi j / n``."""
    a = np.pi * np.arange(1, k + 1) / n
    return np.sqrt(2.0 / n) * (np.sin(a * stop) - np.sin(a * start)) / (2.0 * np.sin(a / 2.0))


def confirm(
    e: np.ndarray, degree: int, k: int, coef: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(d_hat + se, d_hat, se)`` per row of the residuals ``e`` (``rows x n``, the Legendre trend of
    ``degree`` removed; ``coef``: their first ``k`` cosine coefficients, computed when not given)
    once the largest excursion (``excursions``) is removed too, as an indicator: the largest ``d``
    still plausible then, and the estimate and standard error behind it. Long memory raises every
    low cosine and survives; one episode of a different level (a deterministic part of the window)
    does not. The indicator's part ``u`` outside the trend is removed by linearity (``e`` is
    orthogonal to the trend, so the new residual is ``e - (u' e) u`` and its coefficients
    ``coef - (u' e) phi' u``, ``phi' u`` in closed form): no transform of the window per row."""

    rows, n = e.shape
    if coef is None:
        coef = cosine_coefficients(e, k)
    small = min(n, EXACT_UNITS)
    p = trend_basis(n, degree)
    overlap = polynomial_overlap(n, degree, k)  # (q, k): phi' p
    start, stop = excursions(e)
    d, se = np.zeros(rows), np.zeros(rows)
    for i in range(rows):
        s, t = int(start[i]), int(stop[i])
        outside = _outside_trend(p, overlap, s, t)
        residual = coef[i : i + 1, :k]
        if outside is not None:
            _, _, u, ou = outside
            residual = residual - float(u @ e[i]) * ou
        if small < n:
            s, t = s * small // n, max(s * small // n + 1, t * small // n)
        m = fit(residual, *indicator_model(small, degree, s, t, k), k)
        d[i], se[i] = m.d[0], m.se[0]
    return d + se, d, se
