"""Intervals and tests for measurements whose examples cluster: the phrases, words and regions of one image
are not independent, so images are resampled (a bootstrap clustered by image), never examples."""

from __future__ import annotations

import numpy as np


def clustered_bootstrap(values: np.ndarray, clusters: np.ndarray, *, resamples: int = 2000, seed: int = 0,
                        level: float = 0.95, return_draws: bool = False) -> dict:
    """Mean of `values` (NaN = not scored) and its percentile interval from resampling whole clusters
    with replacement: each resample draws as many clusters as there are, and its mean weights every
    example of a drawn cluster equally (the ratio estimator, as the mean over all examples is)."""
    ok = np.isfinite(values)
    v, c = values[ok].astype(np.float64), clusters[ok]
    if v.size == 0:
        return {"n": 0, "clusters": 0, "mean": None, "ci95": None}
    ids, inverse = np.unique(c, return_inverse=True)
    sums = np.bincount(inverse, weights=v, minlength=len(ids))
    counts = np.bincount(inverse, minlength=len(ids)).astype(np.float64)
    rng = np.random.default_rng(seed)
    draws = rng.integers(0, len(ids), size=(resamples, len(ids)))
    means = sums[draws].sum(1) / counts[draws].sum(1)
    alpha = (1 - level) / 2
    lo, hi = np.quantile(means, [alpha, 1 - alpha])
    out = {"n": int(v.size), "clusters": int(len(ids)), "mean": float(v.mean()), "ci95": [float(lo), float(hi)]}
    if return_draws:
        out["draws"] = means
    return out


def summarise(values: np.ndarray, clusters: np.ndarray | None = None, resamples: int = 2000, seed: int = 0) -> dict:
    """Mean and 95% interval over the scored (finite) examples: from a bootstrap that resamples whole
    clusters (images: the phrases of one image are not independent) when `clusters` is given, else the
    t-interval over examples."""
    # lazy: scipy.stats (~0.9 s to import) only for the statistics
    from scipy import stats

    if clusters is not None and resamples:
        return clustered_bootstrap(values, clusters, resamples=resamples, seed=seed)
    v = values[np.isfinite(values)]
    n = int(v.size)
    if n == 0:
        return {"n": 0, "mean": None, "ci95": None}
    mean = float(v.mean())
    if n < 2:  # one value has no spread to make an interval of ([mean, mean] would claim certainty)
        return {"n": n, "mean": mean, "ci95": None}
    if float(v.std()) == 0.0:
        return {"n": n, "mean": mean, "ci95": [mean, mean]}
    lo, hi = stats.t.interval(0.95, n - 1, loc=mean, scale=stats.sem(v))
    return {"n": n, "mean": mean, "ci95": [float(lo), float(hi)]}


def paired_test(a: np.ndarray, b: np.ndarray, clusters: np.ndarray | None = None, resamples: int = 2000,
                seed: int = 0) -> dict:
    """b - a over examples scored in both: the paired t-test (examples as independent), and with
    `clusters` the difference's 95% interval from the clustered bootstrap and its two-sided bootstrap p
    (twice the share of resampled mean differences on the far side of 0)."""
    # lazy: scipy.stats (~0.9 s to import) only for the statistics
    from scipy import stats

    ok = np.isfinite(a) & np.isfinite(b)
    n = int(ok.sum())
    if n < 2:
        return {"n": n, "mean_diff": None, "t": None, "p": None}
    diff = b[ok] - a[ok]
    out: dict = {"n": n, "mean_diff": float(diff.mean()), "t": None, "p": None}
    if float(diff.std()) != 0.0:
        res = stats.ttest_rel(b[ok], a[ok])
        out.update(t=float(res.statistic), p=float(res.pvalue))
    if clusters is not None and resamples:
        boot = clustered_bootstrap(diff, clusters[ok], resamples=resamples, seed=seed, return_draws=True)
        draws = boot.pop("draws")
        side = np.mean(draws <= 0) if boot["mean"] > 0 else np.mean(draws >= 0)
        out.update(ci95=boot["ci95"], clusters=boot["clusters"], p_bootstrap=float(min(1.0, 2 * side)))
    return out


def format_interval(s: dict | None) -> str:
    """'mean [low, high]' of a summary, 'mean (n 1)' when it has no interval, or '-' when nothing was scored."""
    if not s or s["mean"] is None:
        return "-"
    if s["ci95"] is None:
        return f"{s['mean']:.3f} (n {s['n']})"
    return f"{s['mean']:.3f} [{s['ci95'][0]:.3f}, {s['ci95'][1]:.3f}]"
