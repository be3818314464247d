"""Tables on disk: one writer and one reader for every CSV attncoda produces.

Tables go through pandas at full precision (a float is written with the shortest text that reads
back to the same float), with ``NaN`` as an empty cell, and atomically (a temporary file beside
the target, then one rename), so a table is either complete or absent.

Examples
--------
>>> import pathlib, tempfile, attncoda as ac
>>> path = pathlib.Path(tempfile.mkdtemp()) / "t.csv"
>>> _ = ac.write_table([{"head": 0, "share": 1 / 3}, {"head": 1, "share": float("nan")}], path)
>>> print(path.read_text(), end="")
head,share
0,0.3333333333333333
1,
>>> bool(ac.read_table(path)["share"].iloc[0] == 1 / 3)
True
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

__all__ = ["read_table", "write_table"]


def write_table(
    table: Any,
    path: str | os.PathLike[str],
    *,
    columns: Sequence[str] | None = None,
) -> Path:
    """Write a table as CSV at full precision, atomically.

    Parameters
    ----------
    table : pandas.DataFrame, sequence of mappings, or mapping of columns
        The rows (records), or the columns. A DataFrame's index is written only if it is named.
    path : path-like
        The CSV file.
    columns : sequence of str, optional
        Column order (default: the order in which columns first appear).

    Returns
    -------
    pathlib.Path

    See Also
    --------
    read_table : Reads such a table back (a float reads back to the same float).
    """
    import pandas as pd

    if isinstance(table, pd.DataFrame):
        frame = table
    elif isinstance(table, Mapping):
        frame = pd.DataFrame(dict(table))
    else:
        rows = list(table)
        order = (
            list(columns)
            if columns is not None
            else list(dict.fromkeys(k for r in rows for k in r))
        )
        frame = pd.DataFrame.from_records(rows, columns=order)
    if columns is not None:
        frame = frame.loc[:, list(columns)]
    from ._atomic import replace_file

    text = frame.to_csv(index=frame.index.name is not None, lineterminator="\n")
    return replace_file(Path(path), text)


def read_table(path: str | os.PathLike[str]) -> Any:
    """Read a table written by :func:`write_table` as a :class:`pandas.DataFrame`.

    See Also
    --------
    write_table : Writes a table this reads.
    """
    import pandas as pd

    return pd.read_csv(path)
