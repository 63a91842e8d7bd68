"""The loss curve of `calm train --plot`: training and held-out loss, and the learning rate, drawn
with matplotlib (the optional `plot` extra: `pip install 'calmd[plot]'`).

A PNG, or an SVG when the file's name ends in `.svg`; written atomically like every file calm
writes. Without matplotlib, `calm train --plot` says how to install it before it trains.
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from pathlib import Path

from calmd.atomic import atomic_write
from calmd.errors import CalmError

INSTALL = "pip install 'calmd[plot]'"  # what --plot needs: matplotlib


def check_available() -> None:
    """Raise CalmError saying how to install matplotlib when it cannot be imported."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise CalmError(f"--plot draws with matplotlib, which is not installed: {INSTALL}") from None


def plot_format(path: Path) -> str:
    return "svg" if path.suffix.lower() == ".svg" else "png"


def write_loss_plot(
    path: Path,
    losses: Sequence[float],
    val: Sequence[tuple[int, float]],
    lrs: Sequence[float] = (),
    *,
    title: str = "calm train",
) -> None:
    """Training loss per step, held-out loss where it was measured (step, loss), and the learning
    rate per step on a second axis; PNG or SVG by the file's suffix, written atomically."""
    check_available()
    import matplotlib

    matplotlib.use("Agg")  # no display: draw to a file
    from matplotlib.figure import Figure

    fig = Figure(figsize=(8, 4.5), dpi=100, layout="constrained")
    ax = fig.add_subplot()
    steps = range(1, len(losses) + 1)
    ax.plot(steps, losses, color="tab:blue", linewidth=1.0, label="training loss")
    if val:
        ax.plot([s for s, _ in val], [v for _, v in val], color="tab:orange", marker="o", linewidth=1.5,
                label="held-out loss")  # fmt: skip
    ax.set_xlabel("step")
    ax.set_ylabel("loss (nats per supervised token)")
    ax.set_title(title)
    ax.grid(True, alpha=0.3)
    handles, labels = ax.get_legend_handles_labels()
    if lrs:
        lr_ax = ax.twinx()
        lr_ax.plot(range(1, len(lrs) + 1), lrs, color="tab:green", linewidth=1.0, linestyle="--",
                   label="learning rate")  # fmt: skip
        lr_ax.set_ylabel("learning rate")
        lr_ax.ticklabel_format(axis="y", style="sci", scilimits=(-3, 3))
        more_handles, more_labels = lr_ax.get_legend_handles_labels()
        handles, labels = handles + more_handles, labels + more_labels
    ax.legend(handles, labels, loc="upper right")
    buffer = io.BytesIO()
    fig.savefig(buffer, format=plot_format(path))
    with atomic_write(path) as f:
        f.write(buffer.getvalue())
