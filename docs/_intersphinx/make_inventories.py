"""Write the intersphinx inventories of the docs from the installed packages, offline.

The docs build has no network, so it cannot download the ``objects.inv`` of numpy, scipy,
xarray, torch, pandas, matplotlib and Python. This script writes small ones instead: the public
names of the installed packages (the modules attncoda's docstrings refer to), each pointing at
the page where that project's published documentation puts it. The URL patterns are the
projects' own autosummary layouts (``reference/generated/numpy.NAME.html``,
``generated/xarray.DataArray.METHOD.html``, ...), read off their sites; they are not checked
here (no network), so a name the project documents elsewhere links to a missing page. Names
outside these lists are not linked (the build does not warn about them).

Run from the repository root after upgrading one of those packages, and commit the result::

    python docs/_intersphinx/make_inventories.py
"""

from __future__ import annotations

import builtins
import importlib
import inspect
import zlib
from collections.abc import Iterable, Iterator
from pathlib import Path

HERE = Path(__file__).resolve().parent

#: Project -> base URL of its published documentation (conf.py's intersphinx_mapping).
BASES = {
    "python": "https://docs.python.org/3/",
    "numpy": "https://numpy.org/doc/stable/",
    "scipy": "https://docs.scipy.org/doc/scipy/",
    "xarray": "https://docs.xarray.dev/en/stable/",
    "torch": "https://docs.pytorch.org/docs/stable/",
    "pandas": "https://pandas.pydata.org/docs/",
    "matplotlib": "https://matplotlib.org/stable/",
}

Entry = tuple[str, str, str]  # (name, domain:role, uri relative to the base)


def _public(obj: object) -> list[str]:
    names = getattr(obj, "__all__", None) or dir(obj)
    return sorted(n for n in names if not n.startswith("_"))


def _role(obj: object) -> str | None:
    if inspect.isclass(obj):
        return "py:exception" if issubclass(obj, BaseException) else "py:class"
    if callable(obj):
        return "py:function"
    return None


def _members(cls: type, prefix: str, page: str) -> Iterator[Entry]:
    """Methods and attributes of a class, each on its own generated page ``page``."""
    for n in _public(cls):
        attr = inspect.getattr_static(cls, n, None)
        role = "py:property" if isinstance(attr, property) else "py:method"
        if not callable(getattr(cls, n, None)) and role == "py:method":
            role = "py:attribute"
        yield f"{prefix}.{n}", role, page.format(name=f"{prefix}.{n}")


def _module(modname: str, page: str, module_page: str | None = None) -> Iterator[Entry]:
    """Every public callable and class of a module, on the page ``page`` of its full name."""
    mod = importlib.import_module(modname)
    if module_page is not None:
        yield modname, "py:module", module_page
    for n in _public(mod):
        obj = getattr(mod, n, None)
        role = _role(obj)
        if role is not None and not inspect.ismodule(obj):
            yield f"{modname}.{n}", role, page.format(name=f"{modname}.{n}")


def python() -> Iterator[Entry]:
    for n in dir(builtins):
        obj = getattr(builtins, n)
        if n.startswith("_"):
            continue
        if inspect.isclass(obj) and issubclass(obj, BaseException):
            yield n, "py:exception", f"library/exceptions.html#{n}"
        elif callable(obj):
            yield (
                n,
                "py:class" if inspect.isclass(obj) else "py:function",
                (f"library/functions.html#{n}"),
            )
    for modname in ("pathlib", "os", "collections.abc", "typing", "dataclasses", "json"):
        mod = importlib.import_module(modname)
        yield modname, "py:module", f"library/{modname}.html#module-{modname}"
        for n in _public(mod):
            role = _role(getattr(mod, n, None))
            if role is not None:
                yield f"{modname}.{n}", role, f"library/{modname}.html#{modname}.{n}"


def numpy() -> Iterator[Entry]:
    import numpy as np

    yield from _module("numpy", "reference/generated/{name}.html#{name}", "reference/index.html")
    yield from _members(np.ndarray, "numpy.ndarray", "reference/generated/{name}.html#{name}")
    yield from _module("numpy.random", "reference/random/generated/{name}.html#{name}")


def scipy() -> Iterator[Entry]:
    for sub in ("special", "stats", "linalg", "optimize", "cluster.hierarchy", "spatial.distance"):
        name = f"scipy.{sub}"
        yield from _module(name, "reference/generated/{name}.html#{name}", f"reference/{sub}.html")


def xarray() -> Iterator[Entry]:
    import xarray as xr

    page = "generated/{name}.html#{name}"
    yield from _module("xarray", page, "api.html")
    for cls in (xr.DataArray, xr.Dataset):
        yield from _members(cls, f"xarray.{cls.__name__}", page)


def torch() -> Iterator[Entry]:
    import torch as t

    page = "generated/{name}.html#{name}"
    for name, role, uri in _module("torch", page, "torch.html"):
        if name in ("torch.Tensor",):
            uri = "tensors.html#torch.Tensor"
        elif name in ("torch.device", "torch.dtype", "torch.layout", "torch.memory_format"):
            uri = f"tensor_attributes.html#{name}"
        yield name, role, uri
    yield from _members(t.Tensor, "torch.Tensor", page)
    yield from _module("torch.nn", page, "nn.html")
    yield from _members(t.nn.Module, "torch.nn.Module", page)
    yield from _module("torch.nn.functional", page, "nn.functional.html")


def pandas() -> Iterator[Entry]:
    import pandas as pd

    page = "reference/api/{name}.html#{name}"
    yield from _module("pandas", page, "reference/index.html")
    yield from _members(pd.DataFrame, "pandas.DataFrame", page)


def matplotlib() -> Iterator[Entry]:
    page = "api/_as_gen/{name}.html#{name}"
    for modname, cls in (("matplotlib.figure", "Figure"), ("matplotlib.axes", "Axes")):
        yield f"{modname}.{cls}", "py:class", page.format(name=f"{modname}.{cls}")
    yield "matplotlib.colors.LogNorm", "py:class", page.format(name="matplotlib.colors.LogNorm")


def write(project: str, version: str, entries: Iterable[Entry], path: Path) -> int:
    """Write an ``objects.inv`` (Sphinx inventory version 2); return the number of entries."""
    seen: dict[str, Entry] = {}
    for name, role, uri in entries:
        seen.setdefault(f"{role} {name}", (name, role, uri))
    lines = [f"{name} {role} 1 {uri} -" for name, role, uri in sorted(seen.values())]
    header = (
        "# Sphinx inventory version 2\n"
        f"# Project: {project}\n"
        f"# Version: {version}\n"
        "# The remainder of this file is compressed using zlib.\n"
    )
    body = zlib.compress(("\n".join(lines) + "\n").encode("utf-8"), 9)
    path.write_bytes(header.encode("utf-8") + body)
    return len(lines)


def main() -> None:
    import platform

    makers = {
        "python": (python, platform.python_version()),
        "numpy": (numpy, None),
        "scipy": (scipy, None),
        "xarray": (xarray, None),
        "torch": (torch, None),
        "pandas": (pandas, None),
        "matplotlib": (matplotlib, None),
    }
    for project, (make, version) in makers.items():
        if version is None:
            version = importlib.import_module(project).__version__
        n = write(project, version, make(), HERE / f"{project}.inv")
        print(f"{project} {version}: {n} names")


if __name__ == "__main__":
    main()
