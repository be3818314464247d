"""attncoda: attention rows as compositional data.

The public namespace is flat (``import attncoda as ac; ac.clr(...)``); modules behind it are
private. See the documentation for the maths, the xarray schema and capture.
"""

from importlib.metadata import PackageNotFoundError, version

from ._coda import (
    add_learned_sink,
    aitchison_distance,
    aitchison_norm,
    alr,
    alr_inv,
    closure,
    clr,
    clr_inv,
    group_basis,
    ilr,
    ilr_inv,
    inner,
    multi_replace,
    pairwise_aitchison,
    perturb,
    perturb_inv,
    pivot_basis,
    power,
    sbp_basis,
)
from ._data import (
    DIMS,
    SUMMARY_VARIABLES,
    SchemaError,
    load,
    make_dataset,
    save,
    validate_dataset,
)
from ._decompose import (
    AitchisonSplit,
    EntropyChange,
    GroupDecomposition,
    GroupedEntropyChange,
    SinkContent,
    aitchison_split,
    attribute_entropy_change,
    attribute_grouped_entropy_change,
    binary_entropy,
    decompose,
    entropy,
    entropy_change,
    group_decompose,
    pairwise_aitchison_split,
)
from ._errors import (
    CompositionError,
    DeviceMismatchError,
    NegativePartError,
    NonFiniteError,
    NotClosedError,
    ShapeMismatchError,
    TooFewPartsError,
    ZeroPartError,
)

try:
    __version__ = version("attncoda")
except PackageNotFoundError:  # pragma: no cover - running from a source tree without install
    __version__ = "0+unknown"

__all__ = [
    "DIMS",
    "SUMMARY_VARIABLES",
    "AitchisonSplit",
    "CompositionError",
    "DeviceMismatchError",
    "EntropyChange",
    "GroupDecomposition",
    "GroupedEntropyChange",
    "NegativePartError",
    "NonFiniteError",
    "NotClosedError",
    "SchemaError",
    "ShapeMismatchError",
    "SinkContent",
    "TooFewPartsError",
    "ZeroPartError",
    "__version__",
    "add_learned_sink",
    "aitchison_distance",
    "aitchison_norm",
    "aitchison_split",
    "alr",
    "alr_inv",
    "attribute_entropy_change",
    "attribute_grouped_entropy_change",
    "binary_entropy",
    "closure",
    "clr",
    "clr_inv",
    "decompose",
    "entropy",
    "entropy_change",
    "group_basis",
    "group_decompose",
    "ilr",
    "ilr_inv",
    "inner",
    "load",
    "make_dataset",
    "multi_replace",
    "pairwise_aitchison",
    "pairwise_aitchison_split",
    "perturb",
    "perturb_inv",
    "pivot_basis",
    "power",
    "save",
    "sbp_basis",
    "validate_dataset",
]
