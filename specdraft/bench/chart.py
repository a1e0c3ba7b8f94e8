"""The benchmark's picture: speedup per category for each method, and tokens per target forward.

``specdraft bench --chart out.png`` draws it at the end of a run; an existing JSON report can be
drawn again with ``python -m specdraft.bench.chart report.json out.png``.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

from .records import BASELINE


def draw(results: list[dict], path: Path, title: str = "") -> None:
    """results: the report's flat rows (method, category, speedup, mean_accepted_tokens, ...)."""
    import matplotlib  # only --chart needs it, and the backend must be set before pyplot loads

    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt

    methods = list(dict.fromkeys(r["method"] for r in results))
    categories = [*dict.fromkeys(r["category"] for r in results if r["category"] != "overall"), "overall"]
    cell = {(r["method"], r["category"]): r for r in results}
    shown = [m for m in methods if m != BASELINE]

    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(15, 5.2), gridspec_kw={"width_ratios": [4, 1]})
    width = 0.8 / max(len(shown), 1)
    top = 1.0
    for i, m in enumerate(shown):
        xs = [j + (i - (len(shown) - 1) / 2) * width for j in range(len(categories))]
        ys = [(cell.get((m, c)) or {}).get("speedup") or 0.0 for c in categories]
        ax.bar(xs, ys, width, label=m)
        top = max([top, *ys])
    ax.axhline(1.0, color="black", linewidth=0.8, linestyle="--")
    ax.set_xticks(range(len(categories)), categories, rotation=30, ha="right")
    ax.set_ylabel(f"speedup over {BASELINE} (tokens/s, prefill included)")
    ax.set_title("speedup by category")
    ax.set_ylim(0, top * 1.3)  # room for the legend above the bars
    ax.legend(fontsize=8, ncol=min(len(shown), 3), loc="upper left")

    acc = [(m, (cell.get((m, "overall")) or {}).get("mean_accepted_tokens")) for m in methods]
    acc = [(m, v) for m, v in acc if v is not None]
    ax2.bar([m for m, _ in acc], [v for _, v in acc], color="tab:gray")
    ax2.set_ylabel("tokens per target forward")
    ax2.set_title("mean accepted length")
    ax2.tick_params(axis="x", rotation=45)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 2:
        print("usage: python -m specdraft.bench.chart REPORT.json OUT.png", file=sys.stderr)
        return 2
    report = json.loads(Path(argv[0]).read_text())
    draw(report["results"], Path(argv[1]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
