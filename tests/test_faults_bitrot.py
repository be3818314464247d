"""Bit rot: one flipped bit in a stored chunk is refused on load, naming the variable and the
chunk. Every numeric array of a zarr store carries a CRC32C per chunk (a numcodecs filter);
every one of a netCDF file a fletcher32 checksum per HDF5 chunk. Real files, real flips.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import attncoda as ac


@pytest.fixture
def both():
    return ac.testing.synthetic_rows(n_samples=3, n_layers=2, n_heads=3, length=8)


def _flip(path: Path, offset: int, bit: int = 0) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 1 << bit
    path.write_bytes(bytes(data))


def _zarr_chunk(store: Path, name: str) -> Path:
    return sorted(p for p in (store / name).iterdir() if not p.name.startswith("."))[0]


@pytest.mark.parametrize("name", ["log_attn", "sink_share", "entropy", "sample", "query"])
@pytest.mark.parametrize("where", [0.0, 0.5, 0.99])
def test_a_flipped_bit_in_a_zarr_chunk_is_refused_naming_it(tmp_path, both, name, where):
    store = ac.save(both, tmp_path / "c.zarr")
    chunk = _zarr_chunk(store, name)
    _flip(chunk, min(int(chunk.stat().st_size * where), chunk.stat().st_size - 1), bit=3)
    with pytest.raises(ac.SchemaError, match=rf"variable '{name}', chunk {chunk.name} fails"):
        ac.load(store)


@pytest.mark.parametrize("name", ["log_attn", "sink_share", "balance"])
@pytest.mark.parametrize("where", [0.0, 0.5, 0.99])
def test_a_flipped_bit_in_a_netcdf_chunk_is_refused_naming_it(tmp_path, both, name, where):
    import h5py

    path = ac.save(both, tmp_path / "c.nc")
    with h5py.File(path, "r") as f:
        info = f[name].id.get_chunk_info(0)
    _flip(path, info.byte_offset + min(int(info.size * where), info.size - 1), bit=5)
    with pytest.raises(ac.SchemaError, match=rf"variable '{name}', chunk \[0:.*fletcher32"):
        ac.load(path)


def test_appended_chunks_carry_checksums_too(tmp_path, both):
    store = ac.save(both, tmp_path / "c.zarr")
    ac.save(both, store, append=True)
    chunks = sorted(p for p in (store / "log_attn").iterdir() if not p.name.startswith("."))
    assert len(chunks) == 2
    _flip(chunks[-1], chunks[-1].stat().st_size // 2)
    with pytest.raises(ac.SchemaError, match=rf"chunk {chunks[-1].name} fails its checksum"):
        ac.load(store)


def test_a_lazy_open_still_refuses_a_damaged_chunk_when_it_is_read(tmp_path, both):
    store = ac.save(both, tmp_path / "c.zarr")
    _flip(_zarr_chunk(store, "log_attn"), 40)
    ds = ac.load(store, check_values=False)  # opens at once, reads no chunk
    with pytest.raises(RuntimeError, match="checksum"):
        _ = ds["log_attn"].values  # never a silently changed value


def test_undamaged_stores_load_exactly(tmp_path, both):
    for name in ("c.zarr", "c.nc"):
        back = ac.load(ac.save(both, tmp_path / name))
        assert np.array_equal(back["log_attn"].values, both["log_attn"].values, equal_nan=True)
