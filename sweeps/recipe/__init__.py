"""YAML recipes: read (safe_load only), override (`--set path=value`), validate against the engine's
own declarations of problems and hyperparameters, and turn into trials.

Every error is a `RecipeError` naming the file, the field path, what was found and what was expected,
and the closest valid name for a misspelt problem, algorithm or parameter (every valid name on the `-v` line).

The package's jobs, one module each: loading (YAML, overrides, RecipeError), schema (the recipe's shape, pydantic),
trials (one run: Trial), grid (Recipe: its grids expanded into trials and checked), space (the tune block's search
space), metrics (the metrics the runs evaluate and the blocks name), parsing (the parser, which puts them together:
`parse` checks a document's names and values against the engine's declarations, `load` reads a file,
`check_option` a command-line option that stands for a recipe field); this module names what the others use.
"""
from __future__ import annotations

from .grid import Recipe, grid_points
from .loading import (
    DuplicateKey,
    RecipeError,
    RecipeLoader,
    apply_overrides,
    closest,
    field_paths,
    in_words,
    read_yaml,
    yaml_value,
)
from .metrics import check_metrics, named_metrics
from .parsing import OPTION_FIELDS, assigned, check_option, load, parse
from .schema import (
    DISTRIBUTIONS,
    PHRASES,
    SAMPLERS,
    SECTIONS,
    X_AXES,
    Checkpoints,
    PrunerSpec,
    RecipeModel,
    ReportSpec,
    Resources,
    SelectSpec,
    StrictModel,
    TuneSpec,
    is_seed,
    schema_error,
)
from .space import Dimension, check_space
from .trials import FEDERATION_NAMES, FEDERATION_PARAMS, Trial, metrics_of, stable_hash

__all__ = ["DISTRIBUTIONS", "FEDERATION_NAMES", "FEDERATION_PARAMS", "OPTION_FIELDS",
           "PHRASES", "SAMPLERS", "SECTIONS", "X_AXES", "Checkpoints", "Dimension", "DuplicateKey", "PrunerSpec",
           "Recipe", "RecipeError", "RecipeLoader", "RecipeModel", "ReportSpec", "Resources", "SelectSpec",
           "StrictModel", "Trial", "TuneSpec", "apply_overrides", "assigned", "check_metrics", "check_option",
           "check_space", "closest", "field_paths", "grid_points", "in_words", "is_seed", "load", "metrics_of",
           "named_metrics", "parse", "read_yaml", "schema_error", "stable_hash", "yaml_value"]
