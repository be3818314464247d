"""``attncoda explore``: the attention explorer of a saved rows capture, as one HTML file."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import attncoda as ac

from ._common import (
    add_force,
    add_out,
    analysis_folder,
    check_selection,
    load_dataset,
    parse_index,
    usage,
)

#: What the default output's name adds to the dataset's name (``rows.nc`` -> ``rows-explorer.html``).
SUFFIX = "-explorer.html"


def register(subparsers: Any) -> None:
    """Register ``attncoda explore``."""
    p = subparsers.add_parser(
        "explore",
        help="write the attention explorer of a rows capture: one offline HTML page",
        description=(
            "Write one self-contained HTML page to explore a capture with rows (log_attn, "
            "from `attncoda capture --what rows` or ac.save): every layer x head as a "
            "thumbnail, one head large with tokens on both axes and a tooltip (p, the sink "
            "share s, c/(1 - s)), the kept/dropped/split conventions as a switch, two heads "
            "side by side and their entropy split H = H_b(s) + (1 - s) H(c). The page loads "
            "nothing from the network; its script is pinned by its Content-Security-Policy."
        ),
    )
    p.add_argument("dataset", metavar="DATASET", help="a .nc or .zarr capture with rows")
    add_out(p, "the HTML file", metavar="FILE", shown="DATASET's name without suffix + " + SUFFIX)
    p.add_argument(
        "--sample",
        type=parse_index,
        metavar="SEL",
        help="samples to include: 0,3,-1, a slice 0:4 or all; the file grows with each "
        "(default: all)",
    )
    p.add_argument("--layer", type=int, metavar="L", help="layer shown first (default: the last)")
    p.add_argument("--head", type=int, metavar="H", help="head shown first (default: the first)")
    p.add_argument("--title", metavar="TEXT", help="the page's title (default: names the model)")
    add_force(p)
    p.set_defaults(func=_cmd_explore, _parser=p)


def _cmd_explore(args: argparse.Namespace) -> int:
    if args.out:
        out = Path(args.out)
    else:
        folder = analysis_folder(args.dataset)  # the one rule for default outputs
        out = folder.with_name(folder.name + SUFFIX)
    if out.suffix.lower() not in (".html", ".htm"):
        raise usage(f"--out {args.out!r} must name an .html file")
    if not Path(args.dataset).exists():
        raise usage(f"no such dataset: {args.dataset}")
    ac.Explorer.check_target(out, overwrite=args.force)
    ds = load_dataset(args.dataset)
    if "log_attn" not in ds.data_vars:
        raise usage(
            f"{args.dataset} has no rows (log_attn); capture them with "
            "`attncoda capture --what rows` (or both)"
        )
    samples = check_selection("--sample", args.sample, ds.sizes["sample"], args.dataset, "samples")
    explorer = ac.explore(ds, sample=samples, layer=args.layer, head=args.head, title=args.title)
    target = explorer.save(out, overwrite=args.force)
    size = target.stat().st_size / 1e6
    print(f"explorer: {target}  ({size:.1f} MB, {explorer!r}; open it in a browser, offline)")
    return 0
