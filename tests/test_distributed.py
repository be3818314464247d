"""Capture jobs on a dask LocalCluster: one zarr store, resume, and a worker killed mid-job."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
distributed = pytest.importorskip("dask.distributed")

from dask.callbacks import Callback  # noqa: E402

from attncoda.hooks import capture, zoo  # noqa: E402
from attncoda.hooks.distributed import CaptureJob, JobError, _windows, run_jobs  # noqa: E402
from attncoda.testing import DieOnce  # noqa: E402

WORDS = "the sink takes mass while content spreads over many keys and heads".split()


@pytest.fixture
def shards(tmp_path):
    rng = np.random.default_rng(0)
    paths = []
    for i in range(3):
        path = tmp_path / f"shard{i}.txt"
        path.write_text(" ".join(rng.choice(WORDS, 400)))
        paths.append(str(path))
    return paths


@pytest.fixture(scope="module")
def client():
    with (
        distributed.LocalCluster(
            n_workers=2, threads_per_worker=1, processes=True, dashboard_address=":0"
        ) as cluster,
        distributed.Client(cluster) as c,
    ):
        yield c


def in_memory(job, length, max_windows):
    model = zoo.tiny_twin(job.model.split(":", 1)[1])
    ids = torch.as_tensor(_windows(job, length, max_windows))
    with torch.no_grad(), capture(model) as cap:
        model(input_ids=ids, attention_mask=torch.ones_like(ids))
    return cap.dataset


@pytest.mark.slow  # a process cluster: two workers each import torch and attncoda
def test_jobs_on_a_cluster_equal_in_memory_and_survive_a_killed_worker(tmp_path, shards, client):
    jobs = [CaptureJob("twin:llama", p) for p in shards] + [CaptureJob("twin:gpt2", shards[0])]
    store = tmp_path / "jobs.zarr"
    die = DieOnce(tmp_path / "died.flag", store)
    out = run_jobs(jobs, store, client=client, length=24, max_windows=3, _before_marker=die)
    assert (tmp_path / "died.flag").exists()  # a worker really died mid-job
    llama = out["twin_llama"].load()
    assert llama.sizes["sample"] == 9 and (llama.window >= 0).all()
    for i, job in enumerate(jobs[:3]):
        want = in_memory(job, 24, 3)
        got = llama.isel(sample=slice(3 * i, 3 * i + 3))
        np.testing.assert_allclose(got.sink_share.values, want.sink_share.values, atol=1e-6)
        np.testing.assert_allclose(
            got.content_entropy.values, want.content_entropy.values, atol=1e-5
        )
    markers = sorted((store / "_attncoda_jobs").iterdir())
    stamps = [m.stat().st_mtime_ns for m in markers]
    # resuming recomputes nothing
    run_jobs(jobs, store, client=client, length=24, max_windows=3)
    assert [m.stat().st_mtime_ns for m in markers] == stamps


def test_resume_after_an_interrupted_run_without_a_cluster(tmp_path, shards):
    jobs = [CaptureJob("twin:qwen2", p) for p in shards[:2]]
    store = tmp_path / "local.zarr"
    with pytest.raises(SystemExit):
        run_jobs(jobs, store, length=16, max_windows=2, _before_marker=_exit_first(tmp_path))
    assert len(list((store / "_attncoda_jobs").iterdir())) == 1  # the second job has no marker
    done = run_jobs(jobs, store, length=16, max_windows=2)["twin_qwen2"].load()
    np.testing.assert_allclose(
        done.sink_share.values[2:], in_memory(jobs[1], 16, 2).sink_share.values, atol=1e-6
    )


def _exit_first(tmp_path):
    calls = {"n": 0}

    def hook(slot):
        calls["n"] += 1
        if calls["n"] == 2:
            raise SystemExit("interrupted")

    return hook


def test_bad_job_lists(tmp_path, shards):
    with pytest.raises(JobError, match="unique"):
        run_jobs([CaptureJob("twin:llama", shards[0])] * 2, tmp_path / "x.zarr")
    with pytest.raises(JobError, match=r"\.zarr"):
        run_jobs([CaptureJob("twin:llama", shards[0])], tmp_path / "x.nc")
    with pytest.raises(JobError, match="fewer than"):
        run_jobs([CaptureJob("twin:llama", shards[0])], tmp_path / "y.zarr", length=100000)


# ------------------------------------------------------------------------- analysis out of core


class _LargestTask(Callback):
    """dask callback: the largest array any task of a local compute returned (bytes)."""

    def __init__(self):
        super().__init__()
        self.largest = 0

    def _posttask(self, key, result, dsk, state, worker_id):
        self.largest = max(self.largest, int(getattr(result, "nbytes", 0)))


def test_analysis_of_a_dask_backed_store_equals_in_memory_and_stays_out_of_core(tmp_path):
    import xarray as xr

    import attncoda as ac

    model = zoo.tiny_twin("llama")
    ids = torch.randint(
        5, model.config.vocab_size, (4, 20), generator=torch.Generator().manual_seed(0)
    )
    with torch.no_grad(), capture(model, what="rows") as cap:
        model(input_ids=ids)
    rows = cap.dataset
    path = ac.save(rows.chunk({"sample": 1}), tmp_path / "rows.zarr")
    lazy = ac.load(path)
    assert hasattr(lazy["log_attn"].data, "dask")  # opened lazily, one chunk per sample
    per_sample = int(lazy["log_attn"].isel(sample=0).nbytes)

    import dask

    watch = _LargestTask()
    # local scheduler: callbacks see its tasks (a live distributed Client would take them)
    with dask.config.set(scheduler="synchronous"), watch:
        got = {
            "comparisons": ac.head_comparisons(lazy, per_sample=True),
            "profiles": ac.head_profiles(lazy).compute(),
            "distances": ac.head_distances(lazy, "aitchison", "split"),
        }
    # every compute touched at most one sample's rows: the whole array was never assembled
    assert 0 < watch.largest <= per_sample
    want = {
        "comparisons": ac.head_comparisons(rows, per_sample=True),
        "profiles": ac.head_profiles(rows),
        "distances": ac.head_distances(rows, "aitchison", "split"),
    }
    for name in want:
        xr.testing.assert_allclose(got[name], want[name], rtol=1e-12, atol=1e-12)
    flips = ac.flip_rates(got["comparisons"], n_boot=20, seed=0)
    xr.testing.assert_allclose(flips, ac.flip_rates(want["comparisons"], n_boot=20, seed=0))


def test_profiles_of_a_job_store_equal_in_memory(tmp_path, shards):
    import xarray as xr

    import attncoda as ac

    jobs = [CaptureJob("twin:llama", p) for p in shards[:2]]
    lazy = run_jobs(jobs, tmp_path / "jobs.zarr", length=16, max_windows=2)["twin_llama"]
    assert hasattr(lazy["sink_share"].data, "dask")
    loaded = lazy.load()
    xr.testing.assert_allclose(ac.head_profiles(lazy).compute(), ac.head_profiles(loaded))
    xr.testing.assert_allclose(ac.sink_rate(lazy).compute(), ac.sink_rate(loaded))


class _Records:
    """A logging handler that keeps the messages of one logger (the nanny's are not printed
    through pytest's capture: distributed configures its own handlers)."""

    def __init__(self, name):
        import logging

        self.messages = []
        self.handler = logging.Handler()
        self.handler.emit = lambda record: self.messages.append(record.getMessage())
        self.logger = logging.getLogger(name)

    def __enter__(self):
        self.logger.addHandler(self.handler)
        return self

    def __exit__(self, *exc):
        self.logger.removeHandler(self.handler)


@pytest.mark.slow  # a process cluster: two workers each import torch and attncoda
def test_a_cluster_shows_progress_and_closes_without_killing_workers(tmp_path, shards, capfd):
    jobs = [CaptureJob("twin:llama", p) for p in shards[:2]]
    with _Records("distributed.nanny") as nanny:
        with (
            distributed.LocalCluster(
                n_workers=2, threads_per_worker=1, processes=True, dashboard_address=":0"
            ) as cluster,
            distributed.Client(cluster) as c,
        ):
            out = run_jobs(jobs, tmp_path / "p.zarr", client=c, length=16, max_windows=2)
    assert out["twin_llama"].sizes["sample"] == 4
    err = capfd.readouterr().err
    assert "plan (tokenise shards)" in err and "capture jobs: 100%" in err and "2/2" in err
    killed = [m for m in nanny.messages if "killing" in m]
    assert killed == [], killed  # every worker process exited within the nanny's grace period


def test_progress_false_is_quiet(tmp_path, shards, capfd):
    run_jobs(
        [CaptureJob("twin:llama", shards[0])],
        tmp_path / "q.zarr",
        length=16,
        max_windows=1,
        progress=False,
    )
    assert capfd.readouterr().err == ""
