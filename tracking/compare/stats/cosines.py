"""The orthonormal cosines and the Legendre trend basis the long-run variance and the long-memory
model share (``lrv``, ``memory``): the cosines ``phi_j(t) = sqrt(2 / n) cos(pi j (t + 1/2) / n)``,
``j = 1 .. k``, over ``n`` units, and the discrete orthonormal Legendre polynomials of degree
``0 .. d`` over the unit index. Arrays are float64; the cached ones are read-only.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np


def cosine_coefficients(x: np.ndarray, k: int) -> np.ndarray:
    """``phi_j' x`` for ``j = 1 .. k`` along the last axis: one real FFT of length ``n`` of the
    series reordered (even indices, then odd ones reversed; Makhoul's DCT-II), or of length ``2n``
    zero-padded when ``k > n / 2``."""
    n = x.shape[-1]
    if k <= n // 2:
        reordered = np.concatenate((x[..., ::2], x[..., 1::2][..., ::-1]), axis=-1)
        f = np.fft.rfft(reordered, axis=-1)[..., 1 : k + 1]
    else:
        f = np.fft.rfft(x, 2 * n, axis=-1)[..., 1 : k + 1]
    j = np.arange(1, f.shape[-1] + 1)
    return np.sqrt(2.0 / n) * (f * np.exp(-1j * np.pi * j / (2.0 * n))).real


def trend_basis(n: int, degree: int, extra: np.ndarray | None = None) -> np.ndarray:
    """Orthonormal columns (``n x q``) spanning the Legendre polynomials of degree ``0 .. degree``
    over the unit index, plus the columns of ``extra`` (``n x r``) if given (read-only; the basis
    without ``extra`` is cached per ``(n, degree)``)."""
    if extra is None:
        return polynomial_basis(n, degree)
    return _orthonormal(np.column_stack([polynomial_basis(n, degree), extra]))


def _orthonormal(v: np.ndarray) -> np.ndarray:
    q, r = np.linalg.qr(v)
    diag = np.abs(np.diag(r))
    keep = diag > 1e-10 * max(1.0, float(diag.max()))
    out = np.ascontiguousarray(q[:, keep])
    out.setflags(write=False)
    return out


@lru_cache(maxsize=8)
def polynomial_basis(n: int, degree: int) -> np.ndarray:
    """Orthonormal Legendre columns (``n x (degree + 1)``) over the unit index (read-only, cached)."""
    x = (2.0 * np.arange(n) + 1.0) / n - 1.0
    return _orthonormal(np.polynomial.legendre.legvander(x, degree))


@lru_cache(maxsize=8)
def polynomial_overlap(n: int, degree: int, k: int) -> np.ndarray:
    """``phi_j' basis_i`` (``q x k``) of the cached polynomial basis (read-only)."""
    out = cosine_coefficients(polynomial_basis(n, degree).T, k)
    out.setflags(write=False)
    return out
