"""attncoda: attention rows as compositional data.

The public namespace is flat (``import attncoda as ac; ac.clr(...)``); modules behind it are
private, except :mod:`attncoda.testing` (sample data and fault injectors for your own tests, as
:mod:`xarray.testing`), :mod:`attncoda.native` (attncoda's compiled kernels: whether they run,
and the kernels on numpy arrays) and :mod:`attncoda.hooks` (the model side). See the
documentation for the maths, the xarray schema and capture.
"""

from . import native as native
from . import testing as testing
from ._accessor import CodaAccessor
from ._aitchison_split import AitchisonSplit, aitchison_split, pairwise_aitchison_split
from ._atomic import StagingFolder, atomic_output, check_output, staging_folder
from ._attribution import attribute_entropy
from ._bases import group_basis, pivot_basis, sbp_basis
from ._closure import add_learned_sink, closure
from ._clustering import cluster_heads
from ._comparisons import head_comparisons, head_distances
from ._conventions import (
    CONVENTIONS,
    METRICS,
    VIEWS,
    AnalysisError,
    DatasetMismatchError,
    RowsRequiredError,
    UnknownConventionError,
    UnknownMetricError,
)
from ._data import (
    DIMS,
    SUMMARY_VARIABLES,
    SchemaError,
    check_save,
    load,
    make_dataset,
    save,
    validate_dataset,
)
from ._decompose import SinkContent, decompose
from ._entropy import binary_entropy, binary_entropy_from_logs, entropy
from ._entropy_change import (
    EntropyChange,
    GroupedEntropyChange,
    attribute_entropy_change,
    attribute_grouped_entropy_change,
    entropy_change,
)
from ._errors import (
    EXIT_FAILURE,
    EXIT_INTERNAL,
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_USAGE,
    AttncodaError,
    CompositionError,
    DeviceMismatchError,
    InputError,
    NegativePartError,
    NonFiniteError,
    NotClosedError,
    OutputError,
    OutputExistsError,
    ShapeMismatchError,
    TooFewPartsError,
    ZeroPartError,
    require_int,
    require_real,
)
from ._explore import Explorer, explore
from ._flips import FlipCount, flip_rates, verdict_flips
from ._geometry import aitchison_distance, aitchison_norm, paired_inner, perturb, perturb_inv, power
from ._groups import GroupDecomposition, group_decompose
from ._logratio import alr, alr_inv, clr, clr_inv, ilr, ilr_inv
from ._pairwise import inner, pairwise_aitchison
from ._plot import (
    plot_dendrograms,
    plot_entropy_attribution,
    plot_flip_table,
    plot_rows,
    plot_sink_grid,
    plot_sink_vs_content,
    save_figure,
)
from ._profiles import head_profiles, sink_rate
from ._progress import quiet_tqdm_auto as _quiet_tqdm_auto
from ._report import Analysis, ReportError, analyze, check_report, load_analysis, write_report
from ._tables import read_table, write_table
from ._version import __version__
from ._view import HeadView, head_view
from ._zeros import multi_replace

__all__ = [
    "CONVENTIONS",
    "DIMS",
    "EXIT_FAILURE",
    "EXIT_INTERNAL",
    "EXIT_INTERRUPTED",
    "EXIT_OK",
    "EXIT_USAGE",
    "METRICS",
    "SUMMARY_VARIABLES",
    "VIEWS",
    "AitchisonSplit",
    "Analysis",
    "AnalysisError",
    "AttncodaError",
    "CodaAccessor",
    "CompositionError",
    "DatasetMismatchError",
    "DeviceMismatchError",
    "EntropyChange",
    "Explorer",
    "FlipCount",
    "GroupDecomposition",
    "GroupedEntropyChange",
    "HeadView",
    "InputError",
    "NegativePartError",
    "NonFiniteError",
    "NotClosedError",
    "OutputError",
    "OutputExistsError",
    "ReportError",
    "RowsRequiredError",
    "SchemaError",
    "ShapeMismatchError",
    "SinkContent",
    "StagingFolder",
    "TooFewPartsError",
    "UnknownConventionError",
    "UnknownMetricError",
    "ZeroPartError",
    "__version__",
    "add_learned_sink",
    "aitchison_distance",
    "aitchison_norm",
    "aitchison_split",
    "alr",
    "alr_inv",
    "analyze",
    "atomic_output",
    "attribute_entropy",
    "attribute_entropy_change",
    "attribute_grouped_entropy_change",
    "binary_entropy",
    "binary_entropy_from_logs",
    "check_output",
    "check_report",
    "check_save",
    "closure",
    "clr",
    "clr_inv",
    "cluster_heads",
    "decompose",
    "entropy",
    "entropy_change",
    "explore",
    "flip_rates",
    "group_basis",
    "group_decompose",
    "head_comparisons",
    "head_distances",
    "head_profiles",
    "head_view",
    "ilr",
    "ilr_inv",
    "inner",
    "load",
    "load_analysis",
    "make_dataset",
    "multi_replace",
    "paired_inner",
    "pairwise_aitchison",
    "pairwise_aitchison_split",
    "perturb",
    "perturb_inv",
    "pivot_basis",
    "plot_dendrograms",
    "plot_entropy_attribution",
    "plot_flip_table",
    "plot_rows",
    "plot_sink_grid",
    "plot_sink_vs_content",
    "power",
    "read_table",
    "require_int",
    "require_real",
    "save",
    "save_figure",
    "sbp_basis",
    "sink_rate",
    "staging_folder",
    "validate_dataset",
    "verdict_flips",
    "write_report",
    "write_table",
]

_quiet_tqdm_auto()  # a kernel without ipywidgets: no red TqdmWarning (see _progress)
