"""The ghost rule's trade-off as a curve: keys saved against states showing a wrong ghost.

    python -m calmd.quality.ghost_curve [--states held_grown.json] [--young-states held_young.json]
                                        [--json docs/ghost_curve.json] [--plot docs/ghost_curve.png]

On the held-out users (never fitted on), the states `python -m calmd.quality.fit_ghost
--held-out` collects: their grown histories and their first 100 commands (a new user). The
word-by-word user of `calm replay` (calmd/quality/fit_ghost.py `simulate`) types them with:
- the packaged rule (calmd/data/ghost.json), as shipped;
- one threshold everywhere (`CALM_MIN_CONFIDENCE`, the shells' setting: heads drawn as the
  rule draws them), from 0 (every top line's head) to 0.8; the eager setting is one of them;
- zsh-autosuggestions `match_prev_cmd` on the same commands (the collection replays it).
Each point: keys saved word by word, and the share of states showing a wrong ghost (a ghost whose
next word is not what the user types next). The figures of the replay itself (`calm replay
--held-out`, `--first 100`) are in docs/quality.md beside them.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from calmd.arguments import Parser, run_tool
from calmd.quality.fit_ghost import PEER, add_collection_arguments, collected_pair, peer_figures, simulate
from calmd.suggest.ghost import GhostRule, packaged_rule

THRESHOLDS = (0.0, 0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.8)
EAGER = 0.1  # the eager setting of docs/quality.md: CALM_MIN_CONFIDENCE=0.1


def point(out: Any) -> dict[str, float]:
    return {"saved_words": round(out.saved, 4), "wrong_states": round(out.wrong_share, 4),
            "drawn_states": round(out.drawn / max(1, out.states), 4)}  # fmt: skip


def curve(collected: dict[str, Any], rule: GhostRule) -> dict[str, Any]:
    """The packaged rule, each uniform threshold (with the rule's heads) and the peer."""
    states = collected["states"]
    saved, wrong = peer_figures(collected)
    return {
        "commands": len(states),
        "shipped": point(simulate(states, rule)),
        "uniform": {
            str(t): point(simulate(states, GhostRule.uniform(t, heads=rule.heads))) for t in THRESHOLDS
        },
        "peer": {"name": PEER, "saved_words": round(saved, 4), "wrong_states": round(wrong, 4)},
    }


def plot(result: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4.5))
    for ax, (name, title) in zip(axes, (("grown", "held-out users"), ("young", "their first 100 commands")),
                                 strict=True):  # fmt: skip
        part = result[name]
        xs = [p["wrong_states"] * 100 for p in part["uniform"].values()]
        ys = [p["saved_words"] * 100 for p in part["uniform"].values()]
        ax.plot(xs, ys, "o-", color="tab:blue", label="calmd, one threshold (CALM_MIN_CONFIDENCE)")
        for t, x, y in zip(part["uniform"], xs, ys, strict=True):
            ax.annotate(t, (x, y), textcoords="offset points", xytext=(4, -10), fontsize=7)
        s = part["shipped"]
        ax.plot([s["wrong_states"] * 100], [s["saved_words"] * 100], "*", ms=15, color="tab:green",
                label="calmd as shipped (the fitted rule)")  # fmt: skip
        e = part["uniform"][str(EAGER)]
        ax.plot([e["wrong_states"] * 100], [e["saved_words"] * 100], "s", ms=9, mfc="none", c="tab:orange",
                label=f"eager: CALM_MIN_CONFIDENCE={EAGER}")  # fmt: skip
        p = part["peer"]
        ax.plot([p["wrong_states"] * 100], [p["saved_words"] * 100], "D", ms=9, color="tab:red",
                label="zsh-autosuggestions match_prev_cmd")  # fmt: skip
        ax.axvline(p["wrong_states"] * 100, color="tab:red", lw=0.5, ls=":")
        ax.axhline((p["saved_words"] + 0.05) * 100, color="tab:red", lw=0.5, ls=":")
        ax.set_title(f"{title} ({part['commands']} commands typed out)")
        ax.set_xlabel("states showing a wrong ghost (%)")
        ax.set_ylabel("keys saved, word by word (%)")
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=7, loc="lower right")
    fig.suptitle("What the screen shows: keys saved against the noise of wrong ghosts (dotted: the bar)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv: list[str] | None = None) -> int:
    p = Parser(prog=PROG, description=__doc__.split("\n")[0])
    add_collection_arguments(p)  # the held-out users' (`fit_ghost --held-out --states ...` caches them)
    p.add_argument("--json", help="write the points here")
    p.add_argument("--plot", help="draw the curve here (PNG, matplotlib)")
    args = p.parse_args(argv)
    rule = packaged_rule()
    result: dict[str, Any] = {}
    for name, collected in zip(("grown", "young"), collected_pair(args, held=True), strict=True):
        result[name] = curve(collected, rule)
        part = result[name]
        print(f"{name}: {part['commands']} commands")
        rows = [("shipped", part["shipped"]), *((f"uniform {t}", v) for t, v in part["uniform"].items()),
                (PEER, part["peer"])]  # fmt: skip
        for label, v in rows:
            print(
                f"  {label:<40} saved {v['saved_words'] * 100:5.2f}%  wrong {v['wrong_states'] * 100:5.2f}%"
            )
    if args.json:
        from calmd.atomic import atomic_write

        with atomic_write(Path(args.json)) as f:
            f.write((json.dumps(result, indent=1) + "\n").encode())
    if args.plot:
        plot(result, Path(args.plot))
        print(f"wrote {args.plot}")
    return 0


PROG = "python -m calmd.quality.ghost_curve"

if __name__ == "__main__":
    sys.exit(run_tool(PROG, main))
