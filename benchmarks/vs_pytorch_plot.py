"""The plot of `vs_pytorch.py`: per model, measured peak against extra FLOPs and against extra
modelled time, one marker per strategy (`vs_pytorch_report` has the numbers behind it)."""

from __future__ import annotations

from vs_pytorch_report import (
    EAGER,
    FLOP_OBJECTIVE,
    LABELS,
    OURS,
    TIME_OBJECTIVE,
    by_model,
    extra_flops,
    modelled_extra,
)

MARKERS = {"plain": ("o", "black"), "per-block": ("s", "tab:blue"), "sac": ("D", "tab:green"),
           "compile": ("^", "tab:orange"), TIME_OBJECTIVE: ("x", "tab:red"), FLOP_OBJECTIVE: ("+", "tab:purple"),
           EAGER: ("*", "tab:brown")}


def write_plot(rows, path: str) -> None:
    """Per model two panels: measured peak (MiB) against extra FLOPs (the FLOP objective's measure)
    and against extra modelled time (the time objective's), one marker per strategy."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups = by_model(rows)
    measures = (("extra FLOPs (% of plain)", lambda r, plain: 100 * extra_flops(r, plain) / plain.metrics.flops),
                ("extra modelled time (% of plain)", modelled_extra))
    cols = 4  # two models per figure row
    nrows = (2 * len(groups) + 1 + cols - 1) // cols  # one spare panel for the legend
    fig, axes = plt.subplots(nrows, cols, figsize=(4.2 * cols, 3.6 * nrows), squeeze=False)
    panels = iter(axes.flat)
    for model, group in groups.items():
        plain = group[0]
        for (ylabel, measure), ax in zip(measures, panels):
            for strategy, (marker, color) in MARKERS.items():
                pts = sorted((r.metrics.peak_bytes / 2**20, measure(r, plain))
                             for r in group if r.strategy == strategy and r.metrics is not None)
                if pts:
                    xs, ys = zip(*pts)
                    ax.plot(xs, ys, marker=marker, color=color, linestyle="-" if strategy in OURS else "",
                            markersize=7, alpha=0.85)
            ax.set_title(f"{model}: {ylabel.split(' (')[0]}")
            ax.set_xlabel("measured peak (MiB)")
            ax.set_ylabel(ylabel)
            ax.set_yscale("symlog", linthresh=10)  # linear to 10%, then logarithmic (recompute-all)
            ax.grid(alpha=0.3)
    spare = list(panels)
    for ax in spare:
        ax.axis("off")
    handles = [plt.Line2D([], [], marker=m, color=c, linestyle="-" if s in OURS else "", label=LABELS.get(s, s))
               for s, (m, c) in MARKERS.items()]
    spare[0].legend(handles=handles, loc="center", fontsize=11, title="one step, measured")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
