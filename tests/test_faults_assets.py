"""Fault tests of the asset cache: damaged, stale, read-only and half-written copies.

Every cached file is sha256-verified before use; a verified stamp (``.verified/NAME.json`` in the
cache) lets unchanged files pass without being read again. These tests damage scratch caches
(``tmp_path``, through the ``fake_registry`` fixture of test_assets or a copy of a real asset) and
check that damage is refused, listed, found by ``--verify`` and repaired by ``attncoda fetch``.
They never write to the real cache.
"""

from __future__ import annotations

import builtins
import errno
import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import test_assets

from attncoda import cli
from attncoda.hooks import assets
from attncoda.hooks.assets import (
    Asset,
    AssetDamagedError,
    AssetNotFoundError,
    ChecksumError,
    _cache,
    _fetch,
    _packages,
    _registry,
    _stamps,
)

# the fixture of test_assets: a fake corpus served by a fake pip, and ATTNCODA_CACHE in tmp_path
fake_registry = test_assets.fake_registry

CORPUS = "fake-corpus"
OTHER = "fake-other"
MODEL = "fake-model"


def _other_asset() -> Asset:
    return Asset(
        name=OTHER,
        kind="corpus",
        description="a second fake corpus",
        packages=test_assets.FAKE.packages,
        licence="CC0",
    )


@pytest.fixture
def two_corpora(fake_registry, monkeypatch):
    """The fake corpus and a second one, so that fetching one can act on the other."""
    monkeypatch.setitem(assets.ASSETS, OTHER, _other_asset())
    monkeypatch.setitem(_fetch._BUILDERS, OTHER, test_assets._good_builder)
    return fake_registry


@pytest.fixture
def hash_calls(monkeypatch):
    """Every path that ``_sha256_file`` (the one hash function) is called on, in order."""
    calls: list[Path] = []
    real = _cache._sha256_file

    def counting(path, *args, **kwargs):
        calls.append(Path(path))
        return real(path, *args, **kwargs)

    for module in (_cache, _fetch, _packages):  # every module that calls it
        monkeypatch.setattr(module, "_sha256_file", counting)
    return calls


def _inside(calls: list[Path], folder: Path) -> list[str]:
    return [p.relative_to(folder).as_posix() for p in calls if folder in p.parents]


def _manifest_files(folder: Path) -> dict[str, str]:
    manifest = json.loads((folder / "manifest.json").read_text())
    return {f["path"]: f["sha256"] for f in manifest["files"]}


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _tick(folder: Path, probe: Path) -> None:
    """Wait until the file system's clock is past every time of the files in ``folder``.

    A stamp trusts only files older than the clock when it was started (file times are coarse:
    a change within the same tick would keep the key). Not a timing assertion: it only waits.
    """
    newest = max(
        max(p.stat().st_mtime_ns, p.stat().st_ctime_ns) for p in folder.rglob("*") if p.is_file()
    )
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        probe.write_bytes(b"")
        if probe.stat().st_mtime_ns > newest:
            return
        time.sleep(0.002)
    raise AssertionError("the file system clock did not advance")  # pragma: no cover


def _stamped(name: str, root: Path, probe: Path) -> Path:
    """Check the asset once after the clock ticked, so that its stamp trusts every file."""
    folder = assets.asset_path(name)
    _tick(folder, probe)
    assets.asset_path(name)
    return folder


def _overwrite_middle(path: Path, n: int) -> None:
    """Overwrite ``n`` bytes in the middle of ``path`` with 0xFF (NaN as fp32); same size."""
    size = path.stat().st_size
    n = min(n, size // 2)
    with open(path, "r+b") as fh:
        fh.seek(size // 2 - n // 2)
        fh.write(b"\xff" * n)
    assert path.stat().st_size == size


def _main(capsys, *argv: str) -> tuple[int, str, str]:
    code = cli.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def _list_state(out: str, name: str) -> str:
    for line in out.splitlines():
        cols = line.split()
        if cols and cols[0] == name:
            return cols[2]
    raise AssertionError(f"{name} not in --list output:\n{out}")


def _one_line_error(err: str) -> str:
    assert err.startswith("attncoda: error: ") and err.count("\n") == 1, err
    assert "Traceback" not in err
    return err


# --------------------------------------------------------------------------------------------
# A model-like fake asset: a tiny Llama checkpoint with a tokenizer
# --------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny_checkpoint(tmp_path_factory) -> Path:
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from tokenizers import Tokenizer, models, pre_tokenizers

    folder = tmp_path_factory.mktemp("tiny-llama")
    config = transformers.LlamaConfig(
        vocab_size=8,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
    )
    torch.manual_seed(0)
    transformers.LlamaForCausalLM(config).save_pretrained(folder)
    vocab = {"[UNK]": 0, "it": 1, "is": 2, "a": 3, "truth": 4}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    transformers.PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]").save_pretrained(
        folder
    )
    assert (folder / "model.safetensors").is_file() and (folder / "config.json").is_file()
    return folder


@pytest.fixture
def fake_model(fake_registry, monkeypatch, tiny_checkpoint):
    """A fake model asset (weights, config, tokenizer) built from the tiny checkpoint."""

    def build(asset, files, work, out, report):
        for p in tiny_checkpoint.iterdir():
            shutil.copyfile(p, out / p.name)
        return {"model": {"class": "LlamaForCausalLM", "num_layers": 2}}

    model = Asset(
        name=MODEL,
        kind="model",
        description="a tiny random Llama for tests",
        packages=test_assets.FAKE.packages,
        licence="CC0",
        details={
            "architecture": "LlamaForCausalLM",
            "num_layers": 2,
            "auto_class": "AutoModelForCausalLM",
        },
    )
    monkeypatch.setitem(assets.ASSETS, MODEL, model)
    monkeypatch.setitem(_fetch._BUILDERS, MODEL, build)
    return fake_registry


def _logits(model, tok):
    import torch

    ids = tok("it is a truth", return_tensors="pt")["input_ids"]
    with torch.no_grad():
        return model(input_ids=ids).logits


def test_same_size_overwrite_of_weights_is_refused_listed_verified_and_repaired(fake_model, capsys):
    folder = assets.fetch(MODEL, progress=False)
    model, tok = assets.load_model(MODEL)  # the intact copy loads (control)
    assert bool(_logits(model, tok).isfinite().all())
    weights = folder / "model.safetensors"
    expected = _manifest_files(folder)["model.safetensors"]

    _overwrite_middle(weights, 4096)  # NaN bytes, same size, mtime changes
    actual = _sha(weights)
    assert actual != expected
    with pytest.raises(AssetDamagedError) as info:
        assets.load_model(MODEL)
    msg = str(info.value)
    assert "\n" not in msg
    assert "model.safetensors" in msg and actual[:12] in msg and expected[:12] in msg
    assert f"`attncoda fetch {MODEL}`" in msg and "repair" in msg
    # a damaged copy is still "not usable" for code that catches the older classes
    assert isinstance(info.value, AssetNotFoundError) and isinstance(info.value, ChecksumError)
    assert isinstance(info.value, FileNotFoundError) and info.value.exit_code == 1
    with pytest.raises(AssetDamagedError):
        assets.asset_path(MODEL)
    assert not assets.is_fetched(MODEL)

    code, out, _ = _main(capsys, "fetch", "--list")
    assert code == 0 and _list_state(out, MODEL) == "damaged"
    assert f"`attncoda fetch {MODEL}` to repair it" in out

    code, out, err = _main(capsys, "fetch", "--verify", MODEL)
    assert code == 1
    assert (
        out
        == f"{MODEL}: damaged: model.safetensors has sha256 {actual[:12]}, expected {expected[:12]}\n"
    )
    assert f"run `attncoda fetch {MODEL}` to repair" in _one_line_error(err)

    code, out, err = _main(capsys, "fetch", "-q", MODEL)  # no --force
    assert code == 0 and out == f"{MODEL}: {folder}\n"
    assert f"repaired {MODEL}" in err and "model.safetensors" in err
    assert _sha(weights) == expected
    model, tok = assets.load_model(MODEL)
    assert bool(_logits(model, tok).isfinite().all())
    code, out, _ = _main(capsys, "fetch", "--verify", MODEL)
    assert code == 0 and out.startswith(f"{MODEL}: ok")


def test_same_size_config_edit_is_refused_listed_and_repaired(fake_model, capsys, monkeypatch):
    folder = assets.fetch(MODEL, progress=False)
    config = folder / "config.json"
    text = config.read_text()
    assert '"num_hidden_layers": 2' in text
    config.write_text(text.replace('"num_hidden_layers": 2', '"num_hidden_layers": 3'))
    with pytest.raises(AssetDamagedError, match=r"config\.json has sha256 [0-9a-f]{12}, expected"):
        assets.load_model(MODEL)
    code, out, _ = _main(capsys, "fetch", "--list")
    assert _list_state(out, MODEL) == "damaged"
    code, out, err = _main(capsys, "fetch", "--verify")  # no names: every asset in the cache
    assert code == 1 and out.startswith(f"{MODEL}: damaged: config.json has sha256")
    assert CORPUS not in out  # not fetched: not listed by a bare --verify
    # the repair downloads and rebuilds, without --force
    downloads = []
    real_download = _packages._download
    monkeypatch.setattr(_fetch, "_download", lambda *a: downloads.append(a) or real_download(*a))
    code, _, err = _main(capsys, "fetch", "-q", MODEL)
    assert code == 0 and f"repaired {MODEL}" in err and len(downloads) == 1
    assert '"num_hidden_layers": 2' in config.read_text()
    assert assets.load_model(MODEL)[0].config.num_hidden_layers == 2
    capsys.readouterr()
    # a good copy: fetch does nothing (no download)
    code, _, err = _main(capsys, "fetch", "-q", MODEL)
    assert code == 0 and err == "" and len(downloads) == 1


# --------------------------------------------------------------------------------------------
# The verified stamp
# --------------------------------------------------------------------------------------------


def test_stamp_fast_path_avoids_rehashing(fake_registry, hash_calls, tmp_path, capsys, monkeypatch):
    folder = assets.fetch(CORPUS, progress=False)
    files = sorted(_manifest_files(folder))
    _stamped(CORPUS, fake_registry, tmp_path / "probe")
    stamp = fake_registry / ".verified" / f"{CORPUS}.json"
    assert stamp.is_file()
    # the stamp lives outside the asset folder: the folder holds exactly what the manifest lists
    assert sorted(p.name for p in folder.iterdir()) == sorted([*files, "manifest.json"])

    hash_calls.clear()
    assets.asset_path(CORPUS)
    assert assets.is_fetched(CORPUS)
    assets.load_text(CORPUS)
    monkeypatch.setattr(_fetch, "_download", None)  # a fetch of a good copy downloads nothing
    assert _main(capsys, "fetch", "-q", CORPUS)[0] == 0
    code, out, _ = _main(capsys, "fetch", "--list")
    assert code == 0 and _list_state(out, CORPUS) == "fetched"
    assert _inside(hash_calls, folder) == []  # nothing hashed: every file passed by its stamp
    assert assets.asset_status(CORPUS).hashed == ()

    # a file whose key changed (here only its times) is hashed again, and only that file
    os.utime(folder / "one.txt")
    hash_calls.clear()
    status = assets.asset_status(CORPUS)
    assert status.ok and status.hashed == ("one.txt",)
    assert _inside(hash_calls, folder) == ["one.txt"]

    # --verify ignores the stamp and hashes every file
    hash_calls.clear()
    code, out, _ = _main(capsys, "fetch", "--verify", CORPUS)
    assert code == 0 and out == f"{CORPUS}: ok ({len(files)} files hashed)\n"
    assert sorted(_inside(hash_calls, folder)) == files


#: The fingerprint that attncoda wrote into mobydick's manifest before ``assets`` became a package
#: (registry pins, build recipe version and format version, hashed). A deliberate change of the
#: pins or the recipe changes it, and then every cached copy is rebuilt: update it only then.
MOBYDICK_FINGERPRINT = "57d673497f6383e0"


def test_a_cache_in_the_written_format_is_recognised_without_rehashing(
    tmp_path, monkeypatch, hash_calls, capsys
):
    """A cache laid out byte for byte as attncoda writes it (``corpora/NAME/manifest.json``; the
    stamp ``.verified/NAME.json`` keyed by the manifest's sha256, one ``[size, mtime_ns,
    ctime_ns, sha256]`` per file) is fetched and passes by its stamp: no file is hashed, the
    listing says fetched, the loader reads it, and a full verification agrees."""
    root = tmp_path / "cache"
    folder = root / "corpora" / "mobydick"
    folder.mkdir(parents=True)
    text = "Call me Ishmael.\n\nSome years ago, never mind how long precisely.\n"
    (folder / "mobydick.txt").write_text(text, encoding="utf-8")
    (folder / "COPYRIGHT").write_text("public domain\n", encoding="utf-8")
    files = {rel: _sha(folder / rel) for rel in ("COPYRIGHT", "mobydick.txt")}
    manifest = {
        "asset": "mobydick",
        "kind": "corpus",
        "description": "Herman Melville, Moby-Dick",
        "licence": "public domain (text); package MIT",
        "fingerprint": MOBYDICK_FINGERPRINT,
        "format": 1,
        "attncoda_version": "0.1.0",
        "created": "2026-12-03T15:47:43Z",
        "sources": [],
        "documents": [
            {"name": "mobydick", "file": "mobydick.txt", "sha256": files["mobydick.txt"]}
        ],
        "files": [
            {"path": rel, "bytes": (folder / rel).stat().st_size, "sha256": sha}
            for rel, sha in files.items()
        ],
    }
    raw = json.dumps(manifest, indent=2).encode()
    (folder / "manifest.json").write_bytes(raw)
    stats = {rel: (folder / rel).stat() for rel in files}
    stamp = {
        "files": {
            rel: [stats[rel].st_size, stats[rel].st_mtime_ns, stats[rel].st_ctime_ns, sha]
            for rel, sha in files.items()
        },
        "manifest_sha256": hashlib.sha256(raw).hexdigest(),
        "version": 1,
    }
    (root / ".verified").mkdir()
    (root / ".verified" / "mobydick.json").write_text(json.dumps(stamp, indent=1, sort_keys=True))
    monkeypatch.setenv("ATTNCODA_CACHE", str(root))

    status = assets.asset_status("mobydick")
    assert (status.state, status.hashed, status.folder) == ("fetched", (), folder)
    assert assets.is_fetched("mobydick") and assets.asset_path("mobydick") == folder
    assert assets.load_text("mobydick") == text
    assert hash_calls == []  # every file passed by its stamp
    code, out, _ = _main(capsys, "fetch", "--list")
    assert code == 0 and _list_state(out, "mobydick") == "fetched"
    full = assets.asset_status("mobydick", full=True)
    assert full.state == "fetched" and sorted(full.hashed) == sorted(files)
    assert sorted(p.name for p in hash_calls) == sorted(files)


def test_stamp_of_another_manifest_or_unreadable_is_ignored(fake_registry, hash_calls, tmp_path):
    assets.fetch(CORPUS, progress=False)
    folder = _stamped(CORPUS, fake_registry, tmp_path / "probe")
    stamp = fake_registry / ".verified" / f"{CORPUS}.json"
    for garbage in (b"{not json", b"[]", json.dumps({"version": 99, "files": {}}).encode()):
        stamp.write_bytes(garbage)
        hash_calls.clear()
        assert assets.asset_status(CORPUS).hashed == ("one.txt",)
        assert _inside(hash_calls, folder) == ["one.txt"]
    # a stamp written for another manifest (an earlier build) is not used for this one
    assets.asset_path(CORPUS)
    saved = json.loads(stamp.read_text())
    assert saved["files"]  # trusted entries were written again
    saved["manifest_sha256"] = "0" * 64
    stamp.write_text(json.dumps(saved))
    assert assets.asset_status(CORPUS).hashed == ("one.txt",)


def test_stamp_does_not_trust_a_file_as_new_as_its_clock(fake_registry, tmp_path):
    # file times are coarse (a clock tick): a file changed in the tick the stamp's clock was read
    # could change again in that tick without changing its key, so it is not stamped
    folder = assets.fetch(CORPUS, progress=False)
    _tick(folder, tmp_path / "probe")
    writer = _stamps._StampWriter(fake_registry, CORPUS)
    assert writer.tmp is not None and writer.clock == writer.tmp.stat().st_mtime_ns
    assert writer.trusts((folder / "one.txt").stat())  # older than the clock
    assert not writer.trusts(writer.tmp.stat())  # created at the clock: same tick
    writer.discard()
    assert not list((fake_registry / ".verified").glob("*.tmp"))


def test_mtime_restored_edit_is_caught_by_ctime(fake_registry, tmp_path, capsys):
    folder = assets.fetch(CORPUS, progress=False)
    _stamped(CORPUS, fake_registry, tmp_path / "probe")
    doc = folder / "one.txt"
    before = doc.stat()
    doc.write_bytes(doc.read_bytes().upper())  # same size
    os.utime(doc, ns=(before.st_atime_ns, before.st_mtime_ns))  # mtime put back
    after = doc.stat()
    assert (after.st_size, after.st_mtime_ns) == (before.st_size, before.st_mtime_ns)
    # utime itself sets the ctime, which the stamp also records: the fast path hashes the file
    with pytest.raises(AssetDamagedError, match=r"one\.txt has sha256"):
        assets.asset_path(CORPUS)
    assert assets.asset_status(CORPUS).state == "damaged"


def test_change_invisible_to_stat_passes_fast_path_but_not_verify(
    fake_registry, tmp_path, capsys, monkeypatch
):
    # the documented limit: a change below the file system (bit rot, a raw-device write) keeps
    # size, mtime and ctime, so only a full hash (fetch --verify) sees it
    folder = assets.fetch(CORPUS, progress=False)
    _stamped(CORPUS, fake_registry, tmp_path / "probe")
    doc = folder / "one.txt"
    key = _stamps._file_key(doc.stat())
    doc.write_bytes(doc.read_bytes().upper())  # same size
    real_key = _stamps._file_key
    for module in (_cache, _stamps):  # where stamps are checked and written
        monkeypatch.setattr(
            module, "_file_key", lambda st: key if st.st_ino == doc.stat().st_ino else real_key(st)
        )
    assert assets.asset_path(CORPUS) == folder  # passes by its stamp: the limit
    assert assets.asset_status(CORPUS, full=True).state == "damaged"
    code, out, err = _main(capsys, "fetch", "--verify")
    assert code == 1 and out.startswith(f"{CORPUS}: damaged: one.txt has sha256")
    _one_line_error(err)
    # --verify dropped the file from the stamp: from now on the fast path hashes it too
    with pytest.raises(AssetDamagedError):
        assets.asset_path(CORPUS)


def _read_only(mp: pytest.MonkeyPatch, root: Path) -> None:
    """Make ``root`` read-only: permissions, and for root (who ignores them) failing writes."""
    for p in sorted(root.rglob("*"), reverse=True):
        p.chmod(0o555 if p.is_dir() else 0o444)
    root.chmod(0o555)
    if os.geteuid() != 0:
        return

    def inside(path) -> bool:
        try:
            return Path(os.fsdecode(path)).resolve().is_relative_to(root.resolve())
        except (TypeError, ValueError):
            return False

    def refuse(path):
        raise OSError(errno.EROFS, os.strerror(errno.EROFS), os.fsdecode(path))

    def guard(real, writes=lambda *a, **k: True):
        def fn(path, *args, **kwargs):
            if inside(path) and writes(*args, **kwargs):
                refuse(path)
            return real(path, *args, **kwargs)

        return fn

    write_flags = os.O_WRONLY | os.O_RDWR | os.O_CREAT
    for name in ("mkdir", "unlink", "rmdir", "rename", "replace", "utime", "chmod"):
        mp.setattr(os, name, guard(getattr(os, name)))
    mp.setattr(os, "open", guard(os.open, lambda flags, *a, **k: bool(flags & write_flags)))
    mp.setattr(
        builtins,
        "open",
        guard(builtins.open, lambda mode="r", *a, **k: any(c in mode for c in "wax+")),
    )


def _writable(root: Path) -> None:
    for p in [root, *root.rglob("*")]:
        if p.is_dir():
            p.chmod(0o755)


def _snapshot(root: Path) -> dict[str, tuple[int, int]]:
    return {
        p.relative_to(root).as_posix(): (p.stat().st_size, p.stat().st_mtime_ns)
        for p in root.rglob("*")
    }


def test_read_only_cache_still_verifies(fake_registry, hash_calls, capsys):
    folder = assets.fetch(CORPUS, progress=False)
    shutil.rmtree(fake_registry / ".verified")  # a copy made elsewhere: no stamp
    dead = fake_registry / ".tmp" / "fake-gone" / "build-1"
    dead.mkdir(parents=True)
    try:
        with pytest.MonkeyPatch.context() as mp:
            _read_only(mp, fake_registry)
            before = _snapshot(fake_registry)
            hash_calls.clear()
            assert assets.asset_path(CORPUS) == folder
            assert assets.load_text(CORPUS).startswith("First")
            assert assets.fetch(CORPUS, progress=False) == folder  # no crash, nothing to do
            code, out, _ = _main(capsys, "fetch", "--list")
            assert code == 0 and _list_state(out, CORPUS) == "fetched"
            assert "leftover:" in out and "fake-gone" in out
            assert _main(capsys, "fetch", "--verify", CORPUS)[0] == 0
            # no stamp could be written, so every check hashed the file again, and nothing changed
            assert _inside(hash_calls, folder).count("one.txt") >= 5
            assert _snapshot(fake_registry) == before
        # damage made while writable is still refused when read-only
        _writable(fake_registry)
        doc = folder / "one.txt"
        doc.chmod(0o644)
        doc.write_bytes(doc.read_bytes().upper())
        with pytest.MonkeyPatch.context() as mp:
            _read_only(mp, fake_registry)
            with pytest.raises(AssetDamagedError, match=r"one\.txt"):
                assets.asset_path(CORPUS)
            assert _main(capsys, "fetch", "--verify", CORPUS)[0] == 1
    finally:
        _writable(fake_registry)


# --------------------------------------------------------------------------------------------
# Damaged, stale, half-present copies
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("damage", "needle"),
    [
        (lambda f: (f / "one.txt").unlink(), r"one\.txt is missing"),
        (lambda f: (f / "manifest.json").write_text("{not json"), "no readable manifest"),
        (lambda f: (f / "manifest.json").unlink(), "incomplete"),
        (
            lambda f: (f / "manifest.json").write_text(
                json.dumps({**json.loads((f / "manifest.json").read_text()), "files": "x"})
            ),
            "no valid file list",
        ),
    ],
    ids=["file-deleted", "manifest-garbled", "manifest-deleted", "file-list-garbled"],
)
def test_half_present_copy_is_damaged_and_repaired(fake_registry, capsys, damage, needle):
    folder = assets.fetch(CORPUS, progress=False)
    damage(folder)
    with pytest.raises(AssetDamagedError, match=needle):
        assets.asset_path(CORPUS)
    code, out, _ = _main(capsys, "fetch", "--list")
    assert _list_state(out, CORPUS) == "damaged"
    assert _main(capsys, "fetch", "--verify", CORPUS)[0] == 1
    code, out, err = _main(capsys, "fetch", "-q", CORPUS)
    assert code == 0 and f"repaired {CORPUS}" in err
    assert assets.load_text(CORPUS).startswith("First")


def test_stale_copy_is_listed_and_rebuilt(fake_registry, capsys, monkeypatch):
    assets.fetch(CORPUS, progress=False)
    monkeypatch.setitem(_registry._BUILD_VERSIONS, CORPUS, 99)  # the recipe changed
    with pytest.raises(AssetNotFoundError, match="older recipe") as info:
        assets.asset_path(CORPUS)
    assert not isinstance(info.value, AssetDamagedError)
    code, out, _ = _main(capsys, "fetch", "--list")
    assert _list_state(out, CORPUS) == "stale"
    code, out, _ = _main(capsys, "fetch", "--verify", CORPUS)
    assert code == 0 and out.startswith(f"{CORPUS}: stale")  # not damaged
    code, _, err = _main(capsys, "fetch", "-q", CORPUS)
    assert code == 0 and f"rebuilt {CORPUS}" in err
    assert assets.asset_status(CORPUS).ok


def test_verify_missing_and_nothing_fetched(fake_registry, capsys):
    code, out, _ = _main(capsys, "fetch", "--verify", CORPUS)
    assert code == 0 and out == f"{CORPUS}: missing; `attncoda fetch {CORPUS}` fetches it\n"
    code, out, _ = _main(capsys, "fetch", "--verify")
    assert code == 0 and out.startswith("no assets in the cache")


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["--verify", "--force"], "--verify takes asset names"),
        (["--verify", "--all"], "--verify takes asset names"),
        (["--verify", "--list"], "not both"),
        (["--list", "--force"], "--list takes no asset names"),
        (["--verify", "no-such-asset"], "unknown asset"),
    ],
)
def test_fetch_option_combinations_are_refused_before_work(fake_registry, capsys, argv, needle):
    assets.fetch(CORPUS, progress=False)
    doc = assets.asset_path(CORPUS) / "one.txt"
    doc.write_bytes(doc.read_bytes().upper())  # damaged: a --force would rebuild it
    before = _snapshot(fake_registry)
    code, out, err = _main(capsys, "fetch", *argv)
    assert code == 2 and out == ""
    assert needle in _one_line_error(err)
    assert _snapshot(fake_registry) == before


def test_cache_dir_that_is_a_file_is_a_usage_error(tmp_path, capsys):
    not_dir = tmp_path / "file"
    not_dir.write_text("x")
    code, _, err = _main(capsys, "fetch", "--list", "--cache-dir", str(not_dir))
    assert code == 2 and "not a directory" in _one_line_error(err)


# --------------------------------------------------------------------------------------------
# Leftovers of interrupted fetches
# --------------------------------------------------------------------------------------------

_HOLD_LOCK = """
import sys, pathlib
from attncoda.hooks.assets import _locking
root = pathlib.Path(sys.argv[1])
with _locking._locked(root, "fake-live"):
    half = root / ".tmp" / "fake-live" / "build-live" / "asset"
    half.mkdir(parents=True)
    (half / "model.safetensors").write_bytes(b"half")
    print("ready", flush=True)
    sys.stdin.read()
"""


def test_leftovers_of_dead_fetches_are_removed_running_ones_kept(two_corpora, capsys):
    root = two_corpora
    root.mkdir()
    dead = root / ".tmp" / "fake-dead" / "build-abc123" / "asset"
    dead.mkdir(parents=True)
    (dead / "model.safetensors").write_bytes(b"half")
    stray = root / ".tmp" / "fake-dead" / "notes.txt"  # not something fetch creates: kept
    stray.write_text("mine")
    live = subprocess.Popen(
        [sys.executable, "-c", _HOLD_LOCK, str(root)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert live.stdout is not None and live.stdout.readline().strip() == "ready"
        running = {p.name: r for p, r in assets.list_leftovers()}
        assert running == {"fake-dead": False, "fake-live": True}
        code, out, _ = _main(capsys, "fetch", "--list")
        assert code == 0
        assert f"leftover: {root / '.tmp' / 'fake-dead'} (left by an interrupted fetch" in out
        assert f"leftover: {root / '.tmp' / 'fake-live'} (a fetch running" in out
        assert (root / ".tmp" / "fake-dead" / "build-abc123").exists()  # --list only looks

        assets.fetch(CORPUS, progress=False)  # a fetch of another asset cleans up
        assert not (root / ".tmp" / "fake-dead" / "build-abc123").exists()
        assert stray.read_text() == "mine"
        assert (root / ".tmp" / "fake-live" / "build-live" / "asset").is_dir()
    finally:
        assert live.stdin is not None
        live.stdin.close()
        live.wait(timeout=60)
    assert live.returncode == 0
    # that fetch has ended (as if killed): its leftover is now dead, and the next fetch, even of
    # a good copy, removes it
    (root / ".tmp" / "fake-live" / "build-live" / "asset" / "more").write_text("x")
    assert assets.list_leftovers() == [
        (root / ".tmp" / "fake-dead", False),
        (root / ".tmp" / "fake-live", False),
    ]
    # a verification killed before its os.replace leaves a stamp temp file: old ones go too
    stamps = root / ".verified"
    (stamps / "fake-x.old.tmp").write_text("{")
    os.utime(stamps / "fake-x.old.tmp", (time.time() - 3 * 86_400,) * 2)
    (stamps / "fake-x.new.tmp").write_text("{")  # may belong to a running check: kept
    assets.fetch(CORPUS, progress=False)
    assert not (root / ".tmp" / "fake-live").exists()
    assert sorted(p.name for p in stamps.glob("*.tmp")) == ["fake-x.new.tmp"]


def test_fetch_killed_between_renames_gets_its_copy_back(two_corpora, monkeypatch):
    root = two_corpora
    folder = assets.fetch(CORPUS, progress=False)
    # killed inside _install: the old copy moved aside, the new one not yet in place
    aside = root / ".tmp" / CORPUS / "old-xyz" / "previous"
    aside.parent.mkdir(parents=True)
    os.replace(folder, aside)
    (root / ".tmp" / CORPUS / "build-xyz" / "asset").mkdir(parents=True)
    with pytest.raises(AssetNotFoundError, match="not fetched"):
        assets.asset_path(CORPUS)
    assets.fetch(OTHER, progress=False)  # the next fetch of any asset
    assert assets.load_text(CORPUS).startswith("First")
    assert not (root / ".tmp").exists()


# --------------------------------------------------------------------------------------------
# The real smollm2-135m weights, copied into a scratch cache
# --------------------------------------------------------------------------------------------


@pytest.mark.real
def test_real_smollm2_damaged_copy_is_refused(tmp_path, monkeypatch, capsys):
    name = "smollm2-135m"
    asset = assets.get_asset(name)
    src = _cache._final_path(asset, assets.default_cache_dir())  # read only, never verified
    if not (src / "manifest.json").is_file():
        pytest.skip(f"asset {name!r} is not fetched; run `attncoda fetch {name}`")
    cache = tmp_path / "cache"
    shutil.copytree(src, _cache._final_path(asset, cache))
    monkeypatch.setenv("ATTNCODA_CACHE", str(cache))
    folder = _cache._final_path(asset, cache)
    nbytes = sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())

    start = time.perf_counter()
    full = assets.asset_status(name, full=True)
    full_s = time.perf_counter() - start
    if not full.ok:
        pytest.skip(f"the real {name} is not intact ({full.reason}); run `attncoda fetch {name}`")
    _tick(folder, tmp_path / "probe")
    assets.asset_status(name)  # stamps every file
    start = time.perf_counter()
    fast = assets.asset_status(name)
    fast_s = time.perf_counter() - start
    assert fast.ok and fast.hashed == ()
    with capsys.disabled():
        print(
            f"\n{name}: {len(full.hashed)} files, {nbytes / 1e6:.0f} MB; full verification "
            f"{full_s:.2f} s ({nbytes / 1e6 / full_s:.0f} MB/s), stamp fast path {fast_s * 1e3:.2f} ms"
        )

    weights = folder / "model.safetensors"
    _overwrite_middle(weights, 4 * 2**20)  # 4 MB of NaN in the middle, same size
    with pytest.raises(AssetDamagedError, match=r"model\.safetensors has sha256"):
        assets.load_model(name)
    code, out, err = _main(capsys, "fetch", "--verify", name)
    assert code == 1 and out.startswith(f"{name}: damaged: model.safetensors has sha256")
    _one_line_error(err)
    assert _list_state(_main(capsys, "fetch", "--list")[1], name) == "damaged"


def test_a_fetch_waiting_on_another_says_who_holds_the_lock(tmp_path: Path) -> None:
    """A second fetch of the same asset waits for the first, and says so (with the holder's
    pid) instead of waiting silently."""
    import threading

    from attncoda.hooks.assets import _locking

    said: list[str] = []
    got = threading.Event()

    def second() -> None:
        with _locking._locked(tmp_path, "austen", on_wait=said.append):
            got.set()

    with _locking._locked(tmp_path, "austen"):
        worker = threading.Thread(target=second)
        worker.start()
        for _ in range(200):
            if said:
                break
            time.sleep(0.01)
        assert not got.is_set()  # still waiting
    worker.join(10)
    assert got.is_set()
    assert len(said) == 1 and f"pid {os.getpid()} on " in said[0] and "'austen'" in said[0]
