"""Progress lines of a fetch, on stderr (stdout keeps only results)."""

from __future__ import annotations

import sys

# --------------------------------------------------------------------------------------------
# Fetching
# --------------------------------------------------------------------------------------------


class _Reporter:
    """Prints progress lines to stderr when enabled."""

    def __init__(self, enabled: bool, name: str) -> None:
        self.enabled = enabled
        self.name = name

    def __call__(self, message: str) -> None:
        if self.enabled:
            print(f"attncoda fetch {self.name}: {message}", file=sys.stderr, flush=True)
