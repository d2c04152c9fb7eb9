"""Typed build configuration: loaded from YAML, validated before any model is touched.

Every section is a pydantic model with ``extra="forbid"`` so a misspelt key is an
error, not a silently ignored setting.  :func:`load_config` turns validation errors
into messages that name the file, the key path, the bad value and what is allowed.

One module per section of the YAML file (``benchmark``, ``generator``, ``filter``,
``classifiers``, ``output``/``aggregate``, ``resources``, ``slider_training``,
``families``/``source``), the whole config in :mod:`.build` and reading it in
:mod:`.loading`.  Relative paths in a config file are resolved against the directory of
that file, so ``configs/demo.yaml`` works from any working directory.  The fully resolved
config (:func:`resolved_dict`) and its hash (:func:`config_hash`) are written next to the
outputs of a build.
"""

from pipeline.config.base import (
    REFERENCE_NEGATIVE_PROMPT,
    REFERENCE_SCALES,
    SHIFT_NAME,
    ConfigError,
    Strict,
)
from pipeline.config.benchmark import BenchmarkSpec
from pipeline.config.build import BuildConfig
from pipeline.config.classifiers import ClassifierEntry, ClassifierSpec, VLMSpec, spec_class
from pipeline.config.families import FamilyGroup, FamilySpec, MaskSpec, SourceSpec
from pipeline.config.filter import (
    ClipModelSpec,
    DinoModelSpec,
    FilterSpec,
    Preprocessing,
    PreprocessSpec,
    Thresholds,
)
from pipeline.config.generator import ClassTokens, GeneratorSpec
from pipeline.config.loading import (
    config_hash,
    deep_merge,
    dump_yaml,
    format_validation_error,
    load_config,
    parse_config,
    resolved_dict,
)
from pipeline.config.output import AggregateSpec, BootstrapSpec, OutputSpec, StripSpec
from pipeline.config.resources import Resources, StageResources
from pipeline.config.sampling import SamplingSpec
from pipeline.config.training import SliderTrainingSpec

__all__ = [
    "REFERENCE_NEGATIVE_PROMPT", "REFERENCE_SCALES", "SHIFT_NAME", "ConfigError", "Strict",
    "BenchmarkSpec", "BuildConfig", "ClassifierEntry", "ClassifierSpec", "VLMSpec", "spec_class", "FamilyGroup", "FamilySpec", "MaskSpec", "SourceSpec",
    "ClipModelSpec", "DinoModelSpec", "FilterSpec", "PreprocessSpec", "Preprocessing", "Thresholds",
    "ClassTokens", "GeneratorSpec", "config_hash", "deep_merge", "dump_yaml", "format_validation_error",
    "load_config", "parse_config", "resolved_dict", "AggregateSpec", "BootstrapSpec", "OutputSpec", "StripSpec",
    "Resources", "StageResources", "SamplingSpec", "SliderTrainingSpec",
]
