"""Speech made offline: Austen passages spoken by Debian's ``espeak-ng`` to 16 kHz WAV files.

espeak-ng writes 16-bit mono WAV at 22,050 Hz; the samples are resampled to Whisper's 16,000 Hz
with a polyphase filter (``scipy.signal.resample_poly``, 160/441) and written as 16-bit WAV. The
voice, the rate and espeak-ng's version go into the corpus manifest: another espeak-ng version
may speak differently, so the audio's sha256 is recorded, not pinned (the text's is pinned).
"""

from __future__ import annotations

import hashlib
import re
import shutil
import subprocess
import wave
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from attncoda import InputError

from ._archives import _deb_data_files, _read_r_lazyload
from ._errors import AssetBuildError, AssetDownloadError
from ._progress import _Reporter
from ._registry import Asset

#: Whisper's sampling rate, and that of every WAV file of a speech corpus.
SAMPLING_RATE = 16_000

#: espeak-ng's voice and rate (words per minute) for the speech corpus.
VOICE, RATE = "en-us", 150


def _check_tools(asset: Asset) -> None:
    """Refuse, in one line, an asset whose system tools are missing (before any download)."""
    for tool in asset.requires:
        if shutil.which(tool) is None:
            raise AssetDownloadError(
                f"{asset.name!r} needs {tool}, which is not installed: run "
                f"`apt-get install {tool}` (Debian/Ubuntu), then `attncoda fetch {asset.name}`"
            )


def espeak_version() -> str:
    """The version of the installed espeak-ng, e.g. ``"1.51"``."""
    proc = subprocess.run(["espeak-ng", "--version"], capture_output=True, text=True, check=False)
    m = re.search(r"text-to-speech:\s*(\S+)", proc.stdout)
    if proc.returncode != 0 or m is None:
        raise AssetBuildError(f"espeak-ng --version failed: {proc.stderr.strip()[:200]}")
    return m.group(1)


def read_wav(path: Path) -> np.ndarray:
    """A 16-bit mono WAV file as float32 samples in [-1, 1)."""
    with wave.open(str(path), "rb") as w:
        if w.getsampwidth() != 2 or w.getnchannels() != 1:
            raise AssetBuildError(f"{path.name} is not 16-bit mono WAV")
        rate = w.getframerate()
        data = np.frombuffer(w.readframes(w.getnframes()), dtype="<i2")
    if rate != SAMPLING_RATE:
        from scipy.signal import resample_poly

        g = np.gcd(rate, SAMPLING_RATE)
        return resample_poly(data / 32768.0, SAMPLING_RATE // g, rate // g).astype(np.float32)
    return (data / 32768.0).astype(np.float32)


def _write_wav(path: Path, samples: np.ndarray) -> None:
    pcm = np.clip(np.round(samples * 32768.0), -32768, 32767).astype("<i2")
    with wave.open(str(path), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(SAMPLING_RATE)
        w.writeframes(pcm.tobytes())


def speak(text: str, path: Path, *, voice: str = VOICE, rate: int = RATE) -> float:
    """Speak ``text`` with espeak-ng into a 16 kHz mono WAV file; return its seconds."""
    raw = path.with_suffix(".espeak.wav")
    proc = subprocess.run(
        ["espeak-ng", "-v", voice, "-s", str(rate), "-w", str(raw), "--", text],
        capture_output=True,
        text=True,
        check=False,
        stdin=subprocess.DEVNULL,
    )
    if proc.returncode != 0 or not raw.is_file():
        raise AssetBuildError(f"espeak-ng failed: {proc.stderr.strip()[:200] or 'no output'}")
    samples = read_wav(raw)
    raw.unlink()
    _write_wav(path, samples)
    return len(samples) / SAMPLING_RATE


_ABBREV = r"(?<!\bMr)(?<!\bMrs)(?<!\bDr)(?<!\bSt)"
_SENTENCE_END = re.compile(_ABBREV + r"[.!?][\"'\u201d]?(?=\s|$)")


def first_sentence(paragraph: str) -> str:
    """The first sentence of a paragraph (``Mr.``, ``Mrs.``, ``Dr.``, ``St.`` do not end one).

    Examples
    --------
    >>> first_sentence('Mr. Woodhouse was fond of society. He liked it.')
    'Mr. Woodhouse was fond of society.'
    >>> first_sentence('"I do not know, Mrs. Weston," said he, "but no." Then more.')
    '"I do not know, Mrs. Weston," said he, "but no."'
    """
    text = " ".join(paragraph.split())
    m = _SENTENCE_END.search(text)
    return text[: m.end()] if m else text


def chapter_openings(lines: list[str], chapters: tuple[str, ...]) -> dict[str, str]:
    """The first sentence of each chapter named (``"I"``, ``"II"``, ...) of a janeaustenr novel."""
    out: dict[str, str] = {}
    for i, line in enumerate(lines):
        m = re.fullmatch(r"\s*CHAPTER\s+([IVXLC]+)\s*", line)
        if not m or m.group(1) not in chapters or m.group(1) in out:
            continue
        para: list[str] = []
        for nxt in lines[i + 1 :]:
            if nxt.strip():
                para.append(nxt)
            elif para:
                break
        out[m.group(1)] = first_sentence(" ".join(para))
    missing = [c for c in chapters if c not in out]
    if missing:
        raise AssetBuildError(f"chapters {missing} not found")
    return out


def _build_austen_speech(
    asset: Asset, files: Mapping[str, Path], work: Path, out: Path, report: _Reporter
) -> dict[str, Any]:
    pkg = asset.packages[0]
    base = asset.details["rdata_dir"]
    raw = _deb_data_files(files[pkg.name], [base + "Rdata.rdx", base + "Rdata.rdb"], pkg)
    data = _read_r_lazyload(raw[base + "Rdata.rdx"], raw[base + "Rdata.rdb"])
    novel = asset.details["novel"]
    openings = chapter_openings(data[novel], asset.details["chapters"])
    version = espeak_version()
    (out / "text").mkdir()
    (out / "audio").mkdir()
    pinned: Mapping[str, str] = asset.details["text_sha256"]
    docs, recordings = [], []
    for chapter, text in openings.items():
        name = f"{novel}-ch{chapter.lower()}"
        line = (text + "\n").encode("utf-8")  # the text file: one line
        digest = hashlib.sha256(line).hexdigest()
        if digest != pinned[name]:
            raise AssetBuildError(
                f"{pkg.filename}: the opening of {novel} chapter {chapter} is not the pinned text "
                f"(sha256 {digest})"
            )
        (out / "text" / f"{name}.txt").write_bytes(line)
        report(f"speaking {name} ({len(text.split())} words)")
        seconds = speak(text, out / "audio" / f"{name}.wav")
        docs.append(
            {
                "name": name,
                "file": f"text/{name}.txt",
                "chapter": chapter,
                "bytes": len(line),
                "chars": len(text) + 1,
                "lines": 1,
                "words": len(text.split()),
                "sha256": digest,
            }
        )
        recordings.append(
            {
                "name": name,
                "file": f"audio/{name}.wav",
                "text_file": f"text/{name}.txt",
                "seconds": round(seconds, 3),
            }
        )
    return {
        "documents": docs,
        "recordings": recordings,
        "synthesis": {
            "engine": "espeak-ng",
            "version": version,
            "voice": VOICE,
            "rate_wpm": RATE,
            "sampling_rate": SAMPLING_RATE,
            "resampling": "scipy.signal.resample_poly 160/441 from espeak-ng's 22050 Hz",
            "source": f"{pkg.requirement} ({novel})",
        },
    }


def _words(text: str) -> list[str]:
    return re.sub(r"[^0-9a-z']+", " ", text.lower().replace("-", " ")).split()


def word_error_rate(reference: str, hypothesis: str) -> float:
    """Word error rate: word-level edit distance (substitutions, insertions, deletions) over the
    number of reference words.

    Words are compared lower-cased, with punctuation removed and hyphens splitting words; no
    other normalisation (``"twenty-one"`` and ``"21"`` differ, as do ``"Mr."`` and ``"Mister"``).

    Parameters
    ----------
    reference, hypothesis
        The text and its transcription.

    Returns
    -------
    float
        0 for a perfect transcription; can exceed 1 when the hypothesis is much longer.

    Examples
    --------
    >>> word_error_rate("Emma Woodhouse, handsome, clever", "a woodhouse and some clever")
    0.75
    """
    ref, hyp = _words(reference), _words(hypothesis)
    if not ref:
        raise InputError("the reference has no words")
    prev = list(range(len(hyp) + 1))
    for i, r in enumerate(ref, 1):
        cur = [i] + [0] * len(hyp)
        for j, h in enumerate(hyp, 1):
            cur[j] = min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (r != h))
        prev = cur
    return prev[-1] / len(ref)
