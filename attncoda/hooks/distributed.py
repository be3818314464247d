"""Capture at scale: (model, text shard) jobs on a dask.distributed cluster, one zarr store.

The driver tokenises every shard into fixed-length windows, lays out one zarr group per model
whose ``sample`` axis holds every window of every shard (one chunk per window), and submits one
task per job. Each worker loads the model once, captures summaries (or rows) for its windows and
writes *its own region* of the store; only then does it write the job's completion marker
(created under a temporary name and renamed, so it exists whole or not at all). Consequences:

- **resume**: running the same jobs again skips every job with a marker;
- **no corruption**: regions are disjoint and chunk-aligned, so a worker that dies mid-write
  leaves other jobs' data untouched, and its own job has no marker and is written again in full
  (by dask's retry on another worker, or by the next run).

Examples
--------
Without a ``client`` the jobs run in this process (same store layout, same resume rules); a
tiny random model and a generated text keep this example fast:

>>> import tempfile, pathlib
>>> from attncoda.hooks.distributed import CaptureJob, run_jobs
>>> tmp = pathlib.Path(tempfile.mkdtemp())
>>> _ = (tmp / "shard.txt").write_text("the sink takes most of the mass " * 40)
>>> out = run_jobs([CaptureJob("twin:llama", str(tmp / "shard.txt"))], tmp / "store.zarr",
...                length=16, max_windows=2)
>>> out["twin_llama"].sizes["sample"], type(out["twin_llama"].sink_share.data).__name__
(2, 'Array')

On a cluster, pass a ``dask.distributed.Client`` (see the "Running on a cluster" docs page):

>>> from dask.distributed import Client, LocalCluster  # doctest: +SKIP
>>> with LocalCluster(n_workers=2, threads_per_worker=1) as cluster, Client(cluster) as client:  # doctest: +SKIP
...     ds = run_jobs(jobs, "austen.zarr", client=client, length=512, max_windows=16)
"""

from __future__ import annotations

import json
import os
import re
import tempfile
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import xarray as xr

from attncoda import EXIT_USAGE, AttncodaError

__all__ = ["CaptureJob", "JobError", "load_store", "plan", "run_jobs", "worker_device"]

MARKERS = "_attncoda_jobs"


class JobError(AttncodaError, RuntimeError):
    """A job list or store cannot be used as asked."""

    exit_code: ClassVar[int] = EXIT_USAGE


@dataclass(frozen=True)
class CaptureJob:
    """One unit of work: capture ``model`` on one text shard.

    Parameters
    ----------
    model : str
        A zoo or asset name (``"smollm2-135m"``), a local checkpoint directory, a hub id, or
        ``"twin:<family>"`` for a tiny random twin (tests).
    corpus : str
        An offline corpus name (``"austen"``) or the path of a UTF-8 text file.
    document : str, optional
        A document of the corpus (``"emma"``); default: the whole corpus.
    """

    model: str
    corpus: str
    document: str | None = None

    @property
    def name(self) -> str:
        raw = f"{self.model}__{Path(self.corpus).name}__{self.document or 'all'}"
        return re.sub(r"[^A-Za-z0-9._-]+", "_", raw)


def _text(job: CaptureJob) -> str:
    path = Path(job.corpus)
    if path.is_file():
        return path.read_text(encoding="utf-8")
    from . import assets

    return assets.load_text(job.corpus, job.document)


# per worker process: (name, device, dtype) -> (model, tokenizer)
_MODELS: dict[tuple[str, str, str], tuple[Any, Any]] = {}


def worker_device(device: str = "auto") -> str:
    """The device a worker captures on: ``"auto"`` is this process's first visible GPU, else CPU.

    One worker per GPU is the usual layout: dask-cuda's ``LocalCUDACluster`` (or a jobqueue
    worker started with ``CUDA_VISIBLE_DEVICES`` set) gives each worker process its own GPU as
    ``cuda:0``.

    Examples
    --------
    >>> worker_device("cpu")
    'cpu'
    >>> worker_device() in ("cpu", "cuda")
    True
    """
    if device != "auto":
        return device
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def _load(name: str, device: str = "cpu", dtype: str = "float32") -> tuple[Any, Any]:
    """The worker's model, loaded once per process (and per device and dtype)."""
    key = (name, device, dtype)
    if key not in _MODELS:
        from . import zoo

        _MODELS[key] = zoo.load(name, device=device, dtype=dtype)
    return _MODELS[key]


def _windows(job: CaptureJob, length: int, max_windows: int) -> np.ndarray:
    """Token windows ``(n, length)`` of the job's text (twins: their byte tokenizer)."""
    _, tokenizer = _load(job.model)
    ids = np.asarray(tokenizer(_text(job), add_special_tokens=False)["input_ids"], dtype=np.int64)
    n = min(len(ids) // length, max_windows)
    if n == 0:
        raise JobError(f"job {job.name}: the text has fewer than {length} tokens")
    return ids[: n * length].reshape(n, length)


@dataclass(frozen=True)
class _Slot:
    job: CaptureJob
    group: str
    index: int  # position of the job in its group's job list
    start: int
    count: int


def plan(
    jobs: Sequence[CaptureJob], *, length: int, max_windows: int, progress: bool = False
) -> dict[str, list[_Slot]]:
    """Lay out every job's windows on the ``sample`` axis of its model's group.

    Examples
    --------
    >>> import tempfile, pathlib
    >>> tmp = pathlib.Path(tempfile.mkdtemp())
    >>> _ = (tmp / "a.txt").write_text("one two three four " * 20)
    >>> _ = (tmp / "b.txt").write_text("five six seven eight " * 20)
    >>> jobs = [CaptureJob("twin:gpt2", str(tmp / n)) for n in ("a.txt", "b.txt")]
    >>> [(s.start, s.count) for s in plan(jobs, length=8, max_windows=3)["twin_gpt2"]]
    [(0, 3), (3, 3)]
    """
    if not jobs:
        raise JobError("no jobs given")
    names = [j.name for j in jobs]
    if len(set(names)) != len(names):
        raise JobError("jobs must be unique (same model, corpus and document given twice)")
    from tqdm.auto import tqdm

    layout: dict[str, list[_Slot]] = {}
    for job in tqdm(jobs, desc="plan (tokenise shards)", unit="job", disable=not progress):
        group = re.sub(r"[^A-Za-z0-9._-]+", "_", job.model)
        slots = layout.setdefault(group, [])
        start = slots[-1].start + slots[-1].count if slots else 0
        count = len(_windows(job, length, max_windows))
        slots.append(_Slot(job, group, len(slots), start, count))
    return layout


def _capture_windows(
    job: CaptureJob,
    windows: np.ndarray,
    options: Mapping[str, Any],
    batch_size: int,
    runtime: Mapping[str, str] | None = None,
) -> xr.Dataset:
    import torch

    from . import capture

    runtime = runtime or {}
    device = worker_device(runtime.get("device", "auto"))
    model, _ = _load(job.model, device, runtime.get("dtype", "float32"))
    with torch.no_grad(), capture(model, **options) as cap:
        for i in range(0, len(windows), batch_size):
            ids = torch.as_tensor(windows[i : i + batch_size], device=device)
            model(input_ids=ids, attention_mask=torch.ones_like(ids))
    return cap.dataset


def _marker(store: Path, slot: _Slot) -> Path:
    return store / MARKERS / f"{slot.group}__{slot.job.name}.done"


def _write_marker(path: Path, payload: Mapping[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
    with os.fdopen(fd, "w") as f:
        json.dump(payload, f)
    os.replace(tmp, path)


def _run_slot(
    slot: _Slot,
    store: str,
    length: int,
    max_windows: int,
    options: Mapping[str, Any],
    batch_size: int,
    runtime: Mapping[str, str] | None = None,
    before_marker: Callable[[_Slot], None] | None = None,
) -> str:
    """Worker task: capture one job and write its region, then its marker."""
    windows = _windows(slot.job, length, max_windows)
    if len(windows) != slot.count:
        raise JobError(f"job {slot.job.name}: text changed since planning")
    ds = _capture_windows(slot.job, windows, options, batch_size, runtime)
    region = _region(ds, slot)
    region.to_zarr(
        store, group=slot.group, region={"sample": slice(slot.start, slot.start + slot.count)}
    )
    if before_marker is not None:
        before_marker(slot)
    _write_marker(_marker(Path(store), slot), {"job": asdict(slot.job), "windows": slot.count})
    return slot.job.name


def _region(ds: xr.Dataset, slot: _Slot) -> xr.Dataset:
    """The part of a capture that a region write may carry: variables along ``sample``."""
    out = ds.drop_vars([v for v in ds.variables if "sample" not in ds[v].dims])
    out = out.assign_coords(sample=np.arange(slot.start, slot.start + slot.count))
    out["window"] = ("sample", np.arange(slot.count))
    out["job"] = ("sample", np.full(slot.count, slot.index))
    return out.drop_vars("sample")


def _initialise(store: Path, slots: list[_Slot], template: xr.Dataset) -> None:
    """Create the group with its full ``sample`` axis (one chunk per window), written lazily."""
    import dask.array as da

    total = slots[-1].start + slots[-1].count
    variables: dict[str, Any] = {}
    for key, var in template.data_vars.items():
        name = str(key)
        shape = (total, *var.shape[1:])
        fill = -np.inf if name.endswith("log_attn") else np.nan
        variables[name] = (
            var.dims,
            da.full(shape, fill, dtype=var.dtype, chunks=(1, *var.shape[1:])),
            var.attrs,
        )
    coords = {k: v for k, v in template.coords.items() if "sample" not in v.dims}
    coords["sample"] = np.arange(total)
    n_pos = template.sizes["position"]
    if "token_id" in template.coords:
        coords["token_id"] = (
            ("sample", "position"),
            da.full((total, n_pos), -1, dtype=np.int64, chunks=(1, n_pos)),
        )
    coords["sink_index"] = ("sample", da.zeros(total, dtype=np.int64, chunks=1))
    extra = {
        "window": ("sample", da.full(total, -1, dtype=np.int64, chunks=1)),
        "job": ("sample", da.full(total, -1, dtype=np.int64, chunks=1)),
    }
    attrs = dict(template.attrs)
    attrs["jobs"] = json.dumps([s.job.name for s in slots])  # `job` indexes this list
    ds = xr.Dataset({**variables, **extra}, coords=coords, attrs=attrs)
    ds.to_zarr(store, group=slots[0].group, compute=False, mode="w-", zarr_format=2)


def run_jobs(
    jobs: Iterable[CaptureJob],
    store: str | os.PathLike[str],
    *,
    client: Any = None,
    length: int = 512,
    max_windows: int = 8,
    batch_size: int = 4,
    what: str = "summaries",
    layers: Any = None,
    heads: Any = None,
    queries: Any = None,
    device: str = "auto",
    dtype: str = "float32",
    progress: bool = True,
    _before_marker: Callable[[_Slot], None] | None = None,
) -> dict[str, xr.Dataset]:
    """Run capture jobs (on a dask cluster if ``client`` is given) into one zarr store.

    Parameters
    ----------
    jobs : iterable of CaptureJob
    store : path-like
        A ``.zarr`` directory: one group per model.
    client : dask.distributed.Client, optional
        Without one the jobs run here, one after the other (same layout, same resume rules).
    length, max_windows : int
        Window length in tokens and the most windows taken from one shard.
    batch_size : int
        Windows per forward pass.
    what, layers, heads, queries
        As for :func:`attncoda.hooks.capture`.
    device : str, default "auto"
        Where each worker runs its model: ``"auto"`` takes the worker's GPU if it sees one (one
        worker per GPU, see :func:`worker_device`), else the CPU; or ``"cpu"``, ``"cuda"``.
    dtype : str, default "float32"
        Weight dtype on the workers (``"bfloat16"`` halves GPU memory; summaries are still
        computed in fp32).
    progress : bool, default True
        Progress bars on stderr: the planning (each shard tokenised) and the jobs, counted as
        they finish on the cluster.

    Notes
    -----
    With a ``client``, every worker of its cluster gets a plugin that makes its process exit
    quickly when the cluster closes: a worker that has imported torch otherwise spends seconds
    tearing down its interpreter, past the nanny's 4 s grace, and the close ends with dask's
    "Worker process still alive after 4.0 seconds, killing" warnings.

    Returns
    -------
    dict of model group -> dask-backed :class:`xarray.Dataset` opened from the store.
    """
    jobs = list(jobs)
    store = Path(store)
    if store.suffix != ".zarr":
        raise JobError(f"store must be a .zarr path, got {str(store)!r}")
    if device != "auto":
        import torch

        try:
            torch.device(device)
        except RuntimeError as err:
            raise JobError(
                f"device={device!r} is not a torch device ('auto', 'cpu', 'cuda')"
            ) from err
    options = {"what": what, "layers": layers, "heads": heads, "queries": queries}
    layout = plan(jobs, length=length, max_windows=max_windows, progress=progress)
    for group, slots in layout.items():
        if not (store / group).exists():
            first = slots[0]
            # the layout comes from one window captured here, on the CPU (the driver may
            # have no GPU); every worker writes the same variables and dtypes
            template = _capture_windows(
                first.job,
                _windows(first.job, length, 1),
                options,
                batch_size,
                {"device": "cpu", "dtype": dtype},
            )
            _initialise(store, slots, template)
    todo = [s for slots in layout.values() for s in slots if not _marker(store, s).exists()]
    runtime = {"device": device, "dtype": dtype}
    args = (str(store), length, max_windows, options, batch_size, runtime, _before_marker)
    from tqdm.auto import tqdm

    bar = tqdm(total=len(todo), desc="capture jobs", unit="job", disable=not progress)
    with bar:
        if client is None:
            for slot in todo:
                _run_slot(slot, *args)
                bar.update()
        else:
            from dask.distributed import as_completed

            client.register_plugin(_quick_exit_plugin(), name=_QUICK_EXIT)
            futures = [
                client.submit(
                    _run_slot, slot, *args, key=f"attncoda-{slot.group}-{slot.job.name}", pure=False
                )
                for slot in todo
            ]
            for future in as_completed(futures):
                future.result()  # a job's error is raised here, as client.gather would
                bar.update()
    return {group: load_store(store, group) for group in layout}


_QUICK_EXIT = "attncoda-quick-exit"


def _quick_exit_plugin() -> Any:
    """A dask ``WorkerPlugin`` whose teardown (the worker is closing) freezes the garbage
    collector: the interpreter's teardown then skips traversing every object torch and
    transformers created (measured: 5.1 s -> 0.9 s for a process holding a tiny model, at a
    load of 13 on 2 cores), so the process exits within the nanny's grace period."""
    from distributed import WorkerPlugin

    class QuickExit(WorkerPlugin):
        name = _QUICK_EXIT

        def teardown(self, worker: Any) -> None:
            import gc

            gc.freeze()

    return QuickExit()


def load_store(store: str | os.PathLike[str], group: str) -> xr.Dataset:
    """Open one model group of a job store as a dask-backed dataset.

    Windows of unfinished jobs hold NaN and ``window == -1``; ``ds.window >= 0`` marks the
    finished ones (``ds.isel(sample=(ds.window >= 0).values)`` keeps only those).

    Examples
    --------
    >>> import tempfile, pathlib
    >>> tmp = pathlib.Path(tempfile.mkdtemp())
    >>> _ = (tmp / "a.txt").write_text("one two three four " * 20)
    >>> _ = run_jobs([CaptureJob("twin:gpt2", str(tmp / "a.txt"))], tmp / "s.zarr", length=8,
    ...              max_windows=2)
    >>> ds = load_store(tmp / "s.zarr", "twin_gpt2")
    >>> int((ds.window >= 0).sum()), sorted(ds.sink_share.dims)
    (2, ['head', 'layer', 'query', 'sample'])
    """
    path = Path(store)
    if not (path / group).exists():
        raise JobError(f"no group {group!r} in {str(path)!r}")
    return xr.open_zarr(path, group=group, consolidated=False)
