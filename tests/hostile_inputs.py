"""Hostile inputs of issue #48, built once for every test that needs them.

Captures that name another file as their data (a netCDF variable in HDF5 external storage, an
external or soft link, a virtual dataset; a zarr store holding a symlinked chunk, metadata file
or variable folder) and an analysis folder turned hostile in every field and file. Used by
``tests/test_faults_data.py`` and ``tests/test_faults_report.py`` (each refusal) and by
``tests/test_faults_opened.py`` (which files the process opened while refusing them).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

import numpy as np

#: The bytes of the file outside a capture (``outside_file``).
OUTSIDE = "OUTSIDE-SECRET-5e1a"


def outside_file(tmp_path: Path) -> Path:
    """A file outside any capture: ``tmp_path/elsewhere/secret.txt``."""
    secret = tmp_path / "elsewhere" / "secret.txt"
    secret.parent.mkdir()
    secret.write_bytes((OUTSIDE * 64).encode())
    return secret


def netcdf_with_external_storage(src: Path, dst: Path, variable: str, where: str) -> Path:
    """``dst``: the capture ``src`` whose ``variable`` keeps its bytes in the file ``where``
    (HDF5 external storage; a relative ``where`` resolves against the reader's directory).
    The variable keeps its attributes and dimension scales, so that a reader that does not
    refuse it reads ``where``'s bytes as its values."""
    import h5py

    shutil.copyfile(src, dst)
    with h5py.File(dst, "r+") as f:
        old = f[variable]
        skip = ("DIMENSION_LIST", "REFERENCE_LIST")
        attrs = {k: v for k, v in old.attrs.items() if k not in skip}
        scales = [axis[0] if len(axis) else None for axis in old.dims]
        for axis, scale in zip(old.dims, scales, strict=True):
            if scale is not None:
                axis.detach_scale(scale)
        dtype = np.dtype("S4") if old.dtype.kind == "O" else old.dtype  # strings: fixed width
        shape = old.shape
        del f[variable]
        size = int(np.prod(shape)) * dtype.itemsize
        new = f.create_dataset(variable, shape, dtype, external=[(where, 0, size)])
        for k, v in attrs.items():
            new.attrs[k] = v
        for axis, scale in zip(new.dims, scales, strict=True):
            if scale is not None:
                axis.attach_scale(scale)
    return dst


def netcdf_with_link(src: Path, dst: Path, other: Path, link: str) -> Path:
    """``dst``: the capture ``src`` with a variable ``notes`` that is an ``external`` link to
    the HDF5 file ``other`` (written here, holding :data:`OUTSIDE`), a ``soft`` link, or a
    ``virtual`` dataset reading ``other``."""
    import h5py

    with h5py.File(other, "w") as f:
        f["data"] = np.frombuffer((OUTSIDE * 8).encode(), np.uint8)
    shutil.copyfile(src, dst)
    with h5py.File(dst, "a") as f:
        if link == "external":
            f["notes"] = h5py.ExternalLink(str(other), "/data")
        elif link == "soft":
            f["notes"] = h5py.SoftLink("/log_attn")
        elif link == "virtual":
            layout = h5py.VirtualLayout(shape=(len(OUTSIDE) * 8,), dtype=np.uint8)
            layout[:] = h5py.VirtualSource(str(other), "data", shape=(len(OUTSIDE) * 8,))
            f.create_virtual_dataset("notes", layout)
        else:
            raise ValueError(link)
    return dst


def zarr_with_symlink(store: Path, secret: Path, what: str) -> Path:
    """Turn the zarr capture ``store`` hostile: its first ``token`` ``chunk`` or the ``token``
    variable's ``metadata`` (``.zattrs``) a symlink to ``secret``, or its ``log_attn``
    ``folder`` moved beside ``secret`` and linked back."""
    if what == "chunk":
        chunk = next(p for p in sorted((store / "token").iterdir()) if not p.name.startswith("."))
        chunk.unlink()
        chunk.symlink_to(secret)
    elif what == "metadata":
        (store / "token" / ".zattrs").unlink()
        (store / "token" / ".zattrs").symlink_to(secret)
    elif what == "folder":
        moved = secret.parent / "log_attn"
        shutil.move(store / "log_attn", moved)
        (store / "log_attn").symlink_to(moved)
    else:
        raise ValueError(what)
    return store


# --------------------------------------------------------------------------------------------
# a hostile analysis folder (the report's input)

#: The text of the files outside a hostile analysis folder.
SECRET = "TOPSECRET-8c1f2e"

#: Hostile markup, each piece marked ``data-hostile`` (or named HOSTILE) so the DOM check finds it.
HOSTILE_SVG = {
    "script": '<script data-hostile="1">document.title="HOSTILE"</script>',
    "img_onerror": '<img data-hostile="1" src="x" onerror="document.title=\'HOSTILE\'"/>',
    "meta_refresh": '<meta data-hostile="1" http-equiv="refresh" content="0;url=http://127.0.0.1:9/"/>',
    "a_javascript": '<a data-hostile="1" href="javascript:alert(1)"><text>HOSTILE</text></a>',
    "foreign_object": (
        '<foreignObject data-hostile="1"><div xmlns="http://www.w3.org/1999/xhtml">'
        "HOSTILE</div></foreignObject>"
    ),
    "use_remote": '<use data-hostile="1" href="http://127.0.0.1:9/x.svg#a"/>',
    "xlink_image": (
        '<image data-hostile="1" xmlns:xlink="http://www.w3.org/1999/xlink" '
        'xlink:href="http://127.0.0.1:9/x.png" width="9" height="9"/>'
    ),
    "on_attribute": '<rect data-hostile="1" x="1" y="1" width="5" height="5" onclick="x()"/>',
    "on_attribute_known_tag": '<rect x="1" y="1" width="5" height="5" onmouseover="x()"/>',
    "style_import": '<style data-hostile="1">@import url(http://127.0.0.1:9/x.css);</style>',
    "style_attr_url": '<rect x="1" y="1" width="5" height="5" style="fill:url(http://127.0.0.1:9/)"/>',
    "animate_href": '<set data-hostile="1" attributeName="href" to="javascript:alert(1)"/>',
    "iframe": '<iframe data-hostile="1" src="http://127.0.0.1:9/"/>',
    "html_namespace": '<h:b xmlns:h="http://www.w3.org/1999/xhtml" data-hostile="1">HOSTILE</h:b>',
}

HOSTILE_TEXT = (
    '"><script data-hostile="1">document.title="HOSTILE"</script><img data-hostile="1" src=x '
    "onerror=alert(1)><meta http-equiv=refresh content=0;url=http://127.0.0.1:9/>"
)


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def forge_stamp(folder: Path, names: list[str]) -> None:
    """What an attacker would do: list the names with their hashes (followed through links)."""
    from attncoda import _atomic

    stamp = json.loads((folder / _atomic.STAMP).read_text())
    for name in names:
        target = folder / name
        if target.exists():
            stamp["files"].append(name)
            stamp["sha256"][name] = sha(target)
    (folder / _atomic.STAMP).write_text(json.dumps(stamp))


def good_analysis_folder(parent: Path) -> Path:
    """A small analysis folder written by ``ac.analyze`` (synthetic rows), in ``parent``."""
    import attncoda as ac

    out = parent / "analysis"
    rows = ac.testing.synthetic_rows(n_samples=2, n_layers=2, n_heads=3, length=6)
    ac.analyze(rows, out, n_boot=0, progress=False)
    return out


def hostile_analysis_folder(good: Path, tmp_path: Path) -> Path:
    """``tmp_path/analysis``: a copy of the real analysis folder ``good``, every field and file
    turned hostile. Outside it, ``tmp_path/outside`` holds ``secret.{svg,csv,txt,png}`` (each
    holding :data:`SECRET` but the PNG), which the folder names by absolute path, by ``../``,
    by ``~/``, through symlinked files and a symlinked folder (``linkdir``), with the stamp
    forged to list them with their hashes."""
    from attncoda import _atomic
    from attncoda._report import MANIFEST

    outside = tmp_path / "outside"
    outside.mkdir()
    secret_svg = (good / "sink_grid_view.svg").read_text().replace("</svg>", "")
    secret_svg += f"<text>{SECRET}</text></svg>"
    (outside / "secret.svg").write_text(secret_svg)
    (outside / "secret.csv").write_text(f"a,b\n{SECRET},1\n")
    (outside / "secret.txt").write_text(SECRET)
    shutil.copy(good / "sink_grid.png", outside / "secret.png")
    folder = tmp_path / "analysis"
    shutil.copytree(good, folder)
    view = (folder / "sink_grid_view.svg").read_text()
    for key, markup in HOSTILE_SVG.items():
        (folder / f"evil_{key}.svg").write_text(view.replace("</svg>", markup + "</svg>"))
    (folder / "evil_doctype.svg").write_text(
        f'<!DOCTYPE svg [<!ENTITY s SYSTEM "file://{outside}/secret.txt">]>'
        + view.replace("</svg>", "<text>&s;</text></svg>")
    )
    (folder / "evil_changed.svg").write_text(view)
    for kind in ("svg", "csv", "png", "txt"):
        os.symlink(outside / f"secret.{kind}", folder / f"link.{kind}")
    os.symlink(outside, folder / "linkdir")
    evil = [f"evil_{k}.svg" for k in HOSTILE_SVG] + ["evil_doctype.svg", "evil_changed.svg"]
    forge_stamp(folder, [*evil, "link.svg", "link.csv", "link.png", "link.txt"])
    stamp = json.loads((folder / _atomic.STAMP).read_text())
    for kind in ("svg", "csv"):  # through a linked folder; and names that are paths out
        stamp["sha256"][f"linkdir/secret.{kind}"] = sha(outside / f"secret.{kind}")
        stamp["sha256"][str(outside / f"secret.{kind}")] = sha(outside / f"secret.{kind}")
        stamp["sha256"][f"../outside/secret.{kind}"] = sha(outside / f"secret.{kind}")
    (folder / _atomic.STAMP).write_text(json.dumps(stamp))
    (folder / "evil_changed.svg").write_text(
        view.replace("</svg>", HOSTILE_SVG["script"] + "</svg>")
    )

    manifest = json.loads((folder / MANIFEST).read_text())
    views = [
        *evil,
        str(outside / "secret.svg"),
        "../outside/secret.svg",
        "link.svg",
        "linkdir/secret.svg",
        "~/secret.svg",
        "javascript:alert(1)",
    ]
    tables = [
        str(outside / "secret.csv"),
        "../outside/secret.csv",
        "link.csv",
        "linkdir/secret.csv",
        "link.txt",
    ]
    stems = [str(outside / "secret"), "../outside/secret", "link", HOSTILE_TEXT]
    manifest["title"] = HOSTILE_TEXT
    manifest["summary"] = [HOSTILE_TEXT]
    manifest["meta"] = {HOSTILE_TEXT: HOSTILE_TEXT, "nested": {"x": HOSTILE_TEXT}}
    manifest["numbers"].update(
        sink_tokens=[HOSTILE_TEXT], sink_rate_threshold=HOSTILE_TEXT, mean_sink_share="x"
    )
    manifest["files"] = [
        str(outside / "secret.txt"),
        "../outside/secret.txt",
        "javascript:alert(1)",
        HOSTILE_TEXT,
        "link.txt",
    ]
    manifest["sections"].append(
        {
            "heading": HOSTILE_TEXT,
            "text": [HOSTILE_TEXT],
            "figures": [{"stem": "sink_grid", "caption": HOSTILE_TEXT, "view": v} for v in views]
            + [{"stem": s, "caption": HOSTILE_TEXT} for s in stems],
            "tables": [{"file": t, "caption": HOSTILE_TEXT, "max_rows": 5} for t in tables],
        }
    )
    (folder / MANIFEST).write_text(json.dumps(manifest))
    return folder


#: A process that swaps ``FOLDER/sub`` with a symlink to ``OUTSIDE`` for ``SECONDS``, as fast as
#: it can (``python -c SYMLINK_TOGGLER FOLDER OUTSIDE SECONDS``); it prints ``go`` when it starts.
SYMLINK_TOGGLER = """
import os, sys, time
folder, outside, seconds = sys.argv[1], sys.argv[2], float(sys.argv[3])
sub, real = os.path.join(folder, "sub"), os.path.join(folder, "sub.real")
print("go", flush=True)
end = time.monotonic() + seconds
while time.monotonic() < end:
    os.rename(sub, real)
    os.symlink(outside, sub)
    os.unlink(sub)
    os.rename(real, sub)
"""


def raced_analysis_folder(good: Path, tmp_path: Path, reads: int) -> Path:
    """``tmp_path/analysis``: a copy of ``good`` whose manifest shows the table ``sub/t.csv``
    ``reads`` times, listed in a forged stamp with the hash of ``tmp_path/outside/t.csv``
    (which holds :data:`SECRET`); ``sub`` is an empty folder, for :data:`SYMLINK_TOGGLER` to
    swap with a symlink to ``outside`` while the report reads it."""
    from attncoda import _atomic
    from attncoda._report import MANIFEST

    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "t.csv").write_text(f"a,b\n{SECRET},1\n")
    folder = tmp_path / "analysis"
    shutil.copytree(good, folder)
    (folder / "sub").mkdir()
    stamp = json.loads((folder / _atomic.STAMP).read_text())
    stamp["files"].append("sub/t.csv")
    stamp["sha256"]["sub/t.csv"] = sha(outside / "t.csv")
    (folder / _atomic.STAMP).write_text(json.dumps(stamp))
    manifest = json.loads((folder / MANIFEST).read_text())
    table = {"file": "sub/t.csv", "caption": "raced", "max_rows": 5}
    manifest["sections"].append({"heading": "raced", "text": [], "tables": [table] * reads})
    (folder / MANIFEST).write_text(json.dumps(manifest))
    return folder
