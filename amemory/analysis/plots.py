"""Matplotlib figures of the experiments and reports (Agg backend, PNGs of about 100 dpi).

Every function takes plain numpy-compatible data, writes one PNG and returns its path;
colours are fixed per optimizer name. Wherever a function takes a curve ``y [n]`` it also
takes ``y [n, seeds]``, drawn as the seed mean with its 95% Student-t band
(:func:`amemory.analysis.stats.band`, the interval the reports' verdicts use).
"""

from __future__ import annotations

import io
import os
import pathlib
from collections.abc import Mapping, Sequence
from typing import Any

import matplotlib

matplotlib.use("Agg")  # headless; must precede pyplot
import matplotlib.pyplot as plt  # noqa: E402
import matplotlib.ticker  # noqa: E402
import numpy as np  # noqa: E402

from amemory import atomic  # noqa: E402
from amemory.analysis import stats  # noqa: E402

COLORS = {
    "gd": "#7f7f7f",
    "sgd": "#7f7f7f",
    "adam": "#1f77b4",
    "signgd": "#2ca02c",
    "signum": "#2ca02c",
    "muon": "#d62728",
    "normuon": "#9467bd",
    "muon_vo+ffn": "#ff7f0e",
    "muon_qk": "#8c564b",
}
_FALLBACK = plt.get_cmap("tab10")


def color_for(name: str, index: int = 0) -> Any:
    """Fixed colour for an optimizer/label name; a tab10 colour by ``index`` otherwise."""
    key = name.lower()
    if key in COLORS:
        return COLORS[key]
    for k, v in COLORS.items():
        if key.startswith(k + " ") or key.startswith(k + "("):
            return v
    return _FALLBACK(index % 10)


def _line(ax: Any, x: Sequence[float], y: Any, *, label: str, color: Any, **kw: Any) -> None:
    """Plot ``y [n]`` as a line, or ``y [n, seeds]`` as its seed mean with a 95% band."""
    x, y = np.asarray(x, float), np.asarray(y, float)
    if y.ndim == 2 and y.shape[1] == 1:
        y = y[:, 0]
    if y.ndim == 1:
        ax.plot(x, y, label=label, color=color, **kw)
        return
    mean, lo, hi = stats.band(y)
    ax.plot(x, mean, label=f"{label} (mean of {y.shape[1]})", color=color, **kw)
    ax.fill_between(x, lo, hi, color=color, alpha=0.22, lw=0)


def _panels(n: int, ncols: int, width: float, height: float) -> tuple[plt.Figure, np.ndarray]:
    """A grid for ``n`` panels, at most ``ncols`` per row; the unused cells are hidden."""
    ncols = max(1, min(ncols, n))
    nrows = int(np.ceil(n / ncols))
    fig, axes = plt.subplots(nrows, ncols, figsize=(width * ncols, height * nrows), squeeze=False)
    for ax in list(axes.flat)[n:]:
        ax.axis("off")
    return fig, axes


def _decorate(ax: Any, xlabel: str, ylabel: str, title: str, **grid: Any) -> None:
    """Axis labels, the title (if any), a light grid and the legend."""
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    if title:
        ax.set_title(title, fontsize=10)
    ax.grid(alpha=0.3, **grid)
    ax.legend(fontsize=7)


def save(fig: plt.Figure, path: str | os.PathLike, dpi: int = 100) -> pathlib.Path:
    """Save ``fig`` as PNG at ``path`` atomically (parents created), close it, return the path."""
    path = pathlib.Path(path)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, dpi=dpi, format="png")
    plt.close(fig)
    return atomic.write_bytes(path, buf.getvalue())


def plot_gap_vs_loss(
    panels: Mapping[str, Mapping[str, tuple[Sequence[float], Sequence[float]]]],
    path: str | os.PathLike,
    *,
    ncols: int = 4,
    suptitle: str | None = None,
) -> pathlib.Path:
    """Panels of the gap Δ(W) against the loss, one line per optimizer (paper A Fig. 4b/c).

    x = population loss (nats, log scale, decreasing to the right), y = Δ(W) =
    max_i f_ii - min_j f_jj in [0, 1]. ``panels``: title -> {optimizer name -> (loss [n],
    gap [n])}; ``ncols`` panels per row. Returns the PNG path.
    """
    fig, axes = _panels(len(panels), ncols, 3.2, 2.7)
    for ax, (title, curves) in zip(axes.flat, panels.items(), strict=False):
        for i, (name, (loss, gap)) in enumerate(curves.items()):
            loss, gap = np.asarray(loss, dtype=float), np.asarray(gap, dtype=float)
            ok = np.isfinite(loss) & np.isfinite(gap) & (loss > 0)
            ax.plot(loss[ok], gap[ok], label=name, color=color_for(name, i), lw=1.5)
        ax.set_xscale("log")
        ax.invert_xaxis()
        ax.set_ylim(-0.02, 1.02)
        ax.set_title(title, fontsize=9)
        ax.set_xlabel("loss (nats)", fontsize=8)
        ax.set_ylabel("gap Δ", fontsize=8)
        ax.tick_params(labelsize=7)
        ax.grid(alpha=0.3)
    axes.flat[0].legend(fontsize=7)
    if suptitle:
        fig.suptitle(suptitle, fontsize=10)
    return save(fig, path)


def plot_curves(
    series: Mapping[str, tuple[Sequence[float], Sequence[float]]],
    path: str | os.PathLike,
    *,
    xlabel: str,
    ylabel: str,
    title: str = "",
    logx: bool = False,
    logy: bool = False,
    hline: float | None = None,
    marker: str | None = None,
) -> pathlib.Path:
    """One axes with one line per series: label -> (x [n], y [n] or [n, seeds]); returns
    the PNG path. ``hline``: a dashed horizontal reference line (e.g. Adam's final loss);
    ``marker``: a matplotlib marker drawn at every point (None: lines only)."""
    fig, ax = plt.subplots(figsize=(4.6, 3.2))
    for i, (name, (x, y)) in enumerate(series.items()):
        _line(ax, x, y, label=name, color=color_for(name, i), marker=marker, ms=3)
    if hline is not None:
        ax.axhline(hline, color="k", lw=0.8, ls="--")
    if logx:
        ax.set_xscale("log")
    if logy:
        ax.set_yscale("log")
    _decorate(ax, xlabel, ylabel, title)
    return save(fig, path)


def plot_bucket_losses(
    steps: Mapping[str, Sequence[float]],
    losses: Mapping[str, Sequence[Sequence[float]]],
    bucket_labels: Sequence[str],
    path: str | os.PathLike,
    *,
    title: str = "validation loss per frequency bucket",
) -> pathlib.Path:
    """One panel per frequency bucket (head to tail): loss against step per optimizer.

    ``steps``: optimizer -> steps ``[n]``; ``losses``: optimizer -> ``[n, n_buckets]`` or
    ``[n, n_buckets, seeds]`` loss (nats per token); ``bucket_labels``: ``[n_buckets]``,
    head first. Returns the PNG path.
    """
    nb = len(bucket_labels)
    fig, axes = plt.subplots(1, nb, figsize=(2.6 * nb, 2.7), squeeze=False)
    for b, ax in enumerate(axes.flat):
        for i, (name, arr) in enumerate(losses.items()):
            arr = np.asarray(arr, dtype=float)
            if arr.ndim not in (2, 3) or arr.shape[1] <= b:
                continue
            _line(ax, steps[name], arr[:, b], label=name, color=color_for(name, i))
        ax.set_title(str(bucket_labels[b]), fontsize=8)
        ax.set_xlabel("step", fontsize=8)
        ax.tick_params(labelsize=7)
        ax.grid(alpha=0.3)
    axes.flat[0].set_ylabel("val loss (nats/token)", fontsize=8)
    axes.flat[0].legend(fontsize=7)
    fig.suptitle(title, fontsize=10)
    return save(fig, path)


def plot_group_accuracy(
    groups: Sequence[int],
    accuracy: Mapping[str, Sequence[float]],
    path: str | os.PathLike,
    *,
    title: str = "first-token accuracy per group",
    xlabel: str = "group g (larger = rarer)",
) -> pathlib.Path:
    """First-token accuracy against frequency group, one line per optimizer.

    ``accuracy``: name -> ``[G]``, or ``[G, seeds]`` (seed mean with a 95% band).
    """
    fig, ax = plt.subplots(figsize=(4.8, 3.2))
    for i, (name, acc) in enumerate(accuracy.items()):
        _line(ax, list(groups), acc, label=name, color=color_for(name, i), marker="o", ms=3)
    ax.set_ylim(-0.03, 1.03)
    _decorate(ax, xlabel, "first-token accuracy", title)
    return save(fig, path)


def plot_bars(
    values: Mapping[str, float | Sequence[float]],
    path: str | os.PathLike,
    *,
    ylabel: str,
    title: str = "",
    reference: Mapping[str, float] | None = None,
    ylim: tuple[float, float] | None = None,
) -> pathlib.Path:
    """Bar chart of ``values``; optional paper ``reference`` as markers.

    ``values``: label -> a number, or a sequence of per-seed numbers (the bar is their
    mean, the error bar its 95% t interval).
    """
    labels = list(values)
    x = np.arange(len(labels))
    fig, ax = plt.subplots(figsize=(max(3.5, 0.8 * len(labels) + 1.5), 3.0))
    rows = [np.atleast_1d(np.asarray(values[k], float)) for k in labels]
    width = max(r.size for r in rows) if rows else 1
    arr = np.array([np.pad(r, (0, width - r.size), constant_values=np.nan) for r in rows])
    mean, lo, hi = stats.band(arr)
    err = None if width < 2 else np.vstack([mean - lo, hi - mean])
    label = "ours" if width < 2 else f"ours (mean of {width}, 95% CI)"
    ax.bar(x, mean, color="#4c72b0", label=label, yerr=err, capsize=3, ecolor="#888888")
    if reference:
        ref = [reference.get(k, np.nan) for k in labels]
        ax.plot(x, ref, "k_", ms=18, mew=2, label="paper")
    ax.set_xticks(x, labels, rotation=30, ha="right", fontsize=8)
    if ylim:
        ax.set_ylim(*ylim)
    _decorate(ax, "", ylabel, title, axis="y")
    return save(fig, path)


def plot_band_curves(
    panels: Mapping[str, Mapping[str, tuple[Sequence[float], Sequence[Sequence[float]]]]],
    path: str | os.PathLike,
    *,
    xlabel: str = "step",
    ncols: int = 4,
) -> pathlib.Path:
    """Panels of seed-band curves: title -> {name -> (x [n], values [n, seeds])}."""
    fig, axes = _panels(len(panels), ncols, 3.0, 2.5)
    for ax, (title, curves) in zip(axes.flat, panels.items(), strict=False):
        for i, (name, (x, values)) in enumerate(curves.items()):
            _line(ax, x, values, label=name, color=color_for(name, i))
        ax.set_title(title, fontsize=8)
        ax.set_xlabel(xlabel, fontsize=8)
        ax.tick_params(labelsize=7)
        ax.grid(alpha=0.3)
    axes.flat[0].legend(fontsize=7)
    return save(fig, path)


def plot_scaling(
    series: Mapping[str, tuple[Sequence[float], Sequence[float]]],
    fits: Mapping[str, tuple[float, float]],
    path: str | os.PathLike,
    *,
    xlabel: str = "T (steps)",
    ylabel: str = "excess loss (nats)",
    title: str = "",
) -> pathlib.Path:
    """Log-log points per series, name -> (x [n], y [n]) positive, plus the ``fits``, name
    -> (slope, intercept) in natural-log space, drawn dashed as ``y = exp(intercept) x^slope``."""
    fig, ax = plt.subplots(figsize=(5.0, 3.6))
    markers = "os^vD*"
    suffixes: dict[str, int] = {}
    for i, (name, (x, y)) in enumerate(series.items()):
        x, y = np.asarray(x, float), np.asarray(y, float)
        head, _, rest = name.partition(" ")
        c = color_for(head, i)
        mk = markers[suffixes.setdefault(rest, len(suffixes)) % len(markers)]
        label = name
        if name in fits:
            slope, intercept = fits[name]
            xx = np.geomspace(x.min(), x.max(), 50)
            ax.plot(xx, np.exp(intercept) * xx**slope, "--", color=c, lw=1)
            label = f"{name} (slope {slope:.2f})"
        ax.plot(x, y, mk, ms=4, color=c, label=label)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
    _decorate(ax, xlabel, ylabel, title, which="both")
    return save(fig, path)
