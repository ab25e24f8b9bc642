"""Student t and F quantiles for real degrees of freedom, from scipy.

The critical values of every interval (degrees of freedom from the long-run variance, from Welch's
formula, or from seeds) and of the trend test. The values are ``scipy.stats.t.ppf`` and
``scipy.stats.f.ppf``; they are computed by the special functions those call (``stdtrit``,
``fdtri``), which are vectorised and cheap per call. scipy is imported on the first quantile, so
importing this module (and ``cliptrack compare --help``) does not load it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import numpy as np


def _special() -> Any:
    """``scipy.special``, imported on first use; a clear error when scipy is not installed."""
    try:
        from scipy import special
    except ImportError as exc:
        raise ImportError(
            "the comparison's t and F quantiles need scipy: pip install 'cliptrack[compare]'"
        ) from exc
    return special


def _check_probability(p: float, what: str) -> None:
    if not 0.0 < p < 1.0:
        raise ValueError(f"{what}: probability must be in (0, 1), got {p}")


def t_quantile(p: float, df: float) -> float:
    """The ``p`` quantile of Student's t with ``df > 0`` degrees of freedom (``df = inf``: normal)."""
    _check_probability(p, "t quantile")
    if not df > 0:
        raise ValueError(f"t quantile: degrees of freedom must be > 0, got {df}")
    if p == 0.5:
        return 0.0
    return float(_special().stdtrit(float(df), float(p)))


def t_critical(confidence: float, df: float) -> float:
    """Two-sided critical value: the ``(1 + confidence) / 2`` quantile of t with ``df`` degrees of freedom."""
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")
    return t_quantile(0.5 + confidence / 2.0, df)


def t_criticals(confidence: float, df: np.ndarray) -> np.ndarray:
    """``t_critical`` per entry of ``df`` (NaN where ``df`` is not positive), in one call."""
    import numpy as np

    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")
    df = np.asarray(df, dtype=float)
    with np.errstate(invalid="ignore"):
        out = _special().stdtrit(np.where(df > 0, df, 1.0), 0.5 + confidence / 2.0)
    return np.where(df > 0, out, np.nan)


def f_quantile(p: float, d1: float, d2: float) -> float:
    """The ``p`` quantile of the F distribution with ``(d1, d2)`` degrees of freedom."""
    if not 0.0 < p < 1.0 or not (d1 > 0 and d2 > 0):
        raise ValueError(f"F quantile needs 0 < p < 1 and positive degrees of freedom, got {p}, {d1}, {d2}")
    return float(_special().fdtri(float(d1), float(d2), float(p)))


def chi2_quantile(p: float, df: float) -> float:
    """The ``p`` quantile of the chi-square distribution with ``df > 0`` degrees of freedom."""
    _check_probability(p, "chi-square quantile")
    if not df > 0:
        raise ValueError(f"chi-square quantile: degrees of freedom must be > 0, got {df}")
    return float(_special().chdtri(float(df), 1.0 - float(p)))
