"""Lazy registries for pluggable parts (families, sources, masks, filters, classifiers, VQA
protocols, analyses, executors, samplers).

Entries are ``"module:attribute"`` strings, so listing and validating never import
torch or a model library.  An unknown key fails with the valid keys and close matches.
Every registry names its contract (``base``, also a ``"module:attribute"`` string): a base
class its entries derive from, or, for a registry of functions (the analyses), the
``Callable`` type they are.  An entry is checked against it when it is loaded, and one that
does not conform fails naming the entry, where it points and the base it lacks (as
lm-evaluation-harness's ``Registry[type[LM]]``), not deep inside a run.
"""

from __future__ import annotations

import difflib
import importlib
import inspect
from typing import Any, Generic, TypeVar

from pipeline.errors import CnsbenchError, UnknownKey

T = TypeVar("T")


class PluginError(TypeError, CnsbenchError):
    """A registered entry that is not what its registry holds (the message names it)."""


def _load(target: str) -> Any:
    module, _, attr = target.partition(":")
    return getattr(importlib.import_module(module), attr)


def conforms(entry: Any, base: Any) -> bool:
    """Whether ``entry`` meets the contract ``base``: a subclass of a base class; for a
    ``Callable`` type (a registry of functions), a function that takes one argument."""
    if isinstance(base, type):
        return isinstance(entry, type) and issubclass(entry, base)
    if isinstance(entry, type) or not callable(entry):
        return False
    try:
        inspect.signature(entry).bind(None)
    except (TypeError, ValueError):
        return False
    return True


def _base_name(base: Any, target: str) -> str:
    if isinstance(base, type):
        return f"a subclass of {base.__module__}.{base.__qualname__}"
    return f"a function of one argument ({target.replace(':', '.')})"


class Registry(Generic[T]):
    def __init__(self, kind: str, base: str | None = None) -> None:
        self.kind = kind
        self.base = base  # "module:attribute": the contract every entry meets (checked on load)
        self._entries: dict[str, tuple[str, str]] = {}

    def register(self, key: str, target: str, doc: str = "") -> None:
        if key in self._entries:
            raise KeyError(f"{self.kind} {key!r} is already registered")
        self._entries[key] = (target, doc)

    def keys(self) -> list[str]:
        return sorted(self._entries)

    def describe(self) -> dict[str, str]:
        return {k: self._entries[k][1] for k in self.keys()}

    def check(self, key: str) -> None:
        if key not in self._entries:
            close = difflib.get_close_matches(key, self.keys(), n=3)
            hint = f" (did you mean {', '.join(close)}?)" if close else ""
            raise UnknownKey(f"unknown {self.kind} {key!r}{hint}; registered: {', '.join(self.keys())}")

    def get(self, key: str) -> T:
        self.check(key)
        target = self._entries[key][0]
        entry = _load(target)
        if self.base is not None:
            base = _load(self.base)
            if not conforms(entry, base):
                raise PluginError(f"{self.kind} {key!r} ({target}) is not {_base_name(base, self.base)}")
        return entry


# Shift families (``generator.kind``, ``families[].kind``): see pipeline.families.base.
FAMILIES: Registry[type] = Registry("family", base="pipeline.families.base:Family")
FAMILIES.register(
    "slider", "pipeline.families.slider:SliderFamily",
    "SD2 + textual-inversion class token + one LoRA slider per (class, shift); scale = slider multiplier",
)
FAMILIES.register(
    "prompt", "pipeline.families.slider:PromptFamily",
    "prompt-only baseline (2P): 'a picture of a {token}' at scale 0, '... in {shift words}' at every scale > 0",
)
FAMILIES.register(
    "corruption", "pipeline.families.corruption:CorruptionFamily",
    "ImageNet-C corruptions (15 + 4 extra) of the scale-0 image at continuous severity s in [0, 5]",
)
FAMILIES.register(
    "object_edit", "pipeline.families.object_edit:ObjectEditFamily",
    "ImageNet-E attribute edits of the masked object: size, position, rotation, background complexity/simplicity",
)
FAMILIES.register(
    "prompt_nuisance", "pipeline.families.prompt_nuisance:PromptNuisanceFamily",
    "ImageNet-D: the object under a background/texture/material prompt; scale 0 the plain prompt, 1 the nuisance",
)
FAMILIES.register(
    "masked_scenario", "pipeline.families.masked_scenario:MaskedScenarioFamily",
    "XIMAGENET-12 scenarios (background/object blur, colour, overexposure, segmented, random/generated background); scale = strength 0..1",
)

# Where a transforming family's scale-0 images come from (``source.kind``): pipeline.sources.
SOURCES: Registry[type] = Registry("source", base="pipeline.sources.base:ImageSource")
SOURCES.register("seed", "pipeline.sources.seed:SeedSource", "text-to-image from the seed with generator.model (scale 0 of the slider trajectories)")
SOURCES.register("folders", "pipeline.sources.collection:FoldersSource", "class folders: the seed-th image of each class")
SOURCES.register("webdataset", "pipeline.sources.collection:WebDatasetSource", "WebDataset tars: the seed-th image of each class")

# Object masks of base images (``source.masks.kind``).
MASKS: Registry[type] = Registry("mask provider", base="pipeline.sources.base:MaskProvider")
MASKS.register("none", "pipeline.sources.masks:NoMasks", "no masks (families that need one refuse the config)")
MASKS.register("folder", "pipeline.sources.masks:FolderMasks", "mask files beside the images: {path}/<class folder>/<image stem>.png, or an XIMAGENET-12 release's own")
MASKS.register("ink_threshold", "pipeline.sources.ink_masks:InkThresholdMasks", "light ink on a dark background: grey >= threshold")
MASKS.register("ink", "pipeline.sources.world_ink:InkMasks", "miniature world: the true digit mask, pixels with grey >= ink_threshold")
MASKS.register(
    "cross_attention", "pipeline.sources.cross_attention:CrossAttentionMasks",
    "generated images: the model's cross-attention to the class token, thresholded, main component",
)

# The filter contract: pipeline.models.filter_base.Filter (imports no torch).
FILTERS: Registry[type] = Registry("filter", base="pipeline.models.filter_base:Filter")
FILTERS.register(
    "ooc4", "pipeline.models.detectors:OOCFilter",
    "four detectors (CLIP text x2, CLIP image and DINOv2 similarity to scale 0), keep if k of 4 pass",
)
FILTERS.register("none", "pipeline.models.keep_all:KeepAll", "keep every image (scores left empty)")

# Classes of the contract pipeline.models.classifier_kind.BaseClassifier (named, not imported: this
# module is below the models); a kind that does not derive from it fails when it is loaded.
CLASSIFIERS: Registry[type] = Registry("classifier", base="pipeline.models.classifier_kind:BaseClassifier")
CLASSIFIERS.register("timm", "pipeline.models.classifiers:TimmClassifier", "any timm model (name.tag or local weights)")
CLASSIFIERS.register(
    "open_clip_zeroshot", "pipeline.models.classifiers:OpenClipZeroShot",
    "open_clip zero-shot over the ImageNet class names with prompt templates",
)
CLASSIFIERS.register(
    "torchscript", "pipeline.models.classifiers:TorchScriptClassifier",
    "a TorchScript file (torch.jit.save) with input size, mean and std; for models timm cannot express",
)
CLASSIFIERS.register(
    "exported", "pipeline.models.exported:ExportedClassifier",
    "a torch.export program (.pt2, torch.export.save) with its preprocess.json stored beside it",
)
CLASSIFIERS.register("torch_hub", "pipeline.models.classifiers:TorchHubClassifier", "a torch.hub entry point ('repo:entry'), e.g. DINOv2 + linear head")
CLASSIFIERS.register("module", "pipeline.models.module:ModuleClassifier", "a torch.nn.Module (or callable) held in memory: cnsbench.evaluate, cnsbench.card")
CLASSIFIERS.register(
    "vlm", "pipeline.models.vlm:VLMClassifier",
    "a vision-language model (transformers image-text-to-text: LLaVA, Qwen2-VL, ...) asked per classifiers[].protocol",
)

# How a vlm classifier is asked and scored (``classifiers[].protocol.kind``): pipeline.models.vqa_protocols.
VQA_PROTOCOLS: Registry[type] = Registry("VQA protocol", base="pipeline.models.vqa_protocols:Protocol")
VQA_PROTOCOLS.register(
    "two_choice", "pipeline.models.vqa_protocols:TwoChoice",
    "ImageNet-D's VQA: truth + the distractor's top-1 (top-2 if right), T=0.2, substring + synonyms; both/neither excluded",
)
VQA_PROTOCOLS.register(
    "multiple_choice", "pipeline.models.vqa_protocols:MultipleChoice",
    "k options: truth + k-1 distractors from a classifier's top-k or the label space, order seeded by the sample id",
)
VQA_PROTOCOLS.register("open", "pipeline.models.vqa_protocols:Open", "a free answer matched to every class name and its synonyms")

# Aggregation (``aggregate.analyses``): see pipeline.aggregate.analysis.
ANALYSES: Registry[Any] = Registry("analysis", base="pipeline.aggregate.analysis:Analysis")
ANALYSES.register(
    "cns", "pipeline.analyses.cns:run",
    "accuracy drop per scale, failure points and their ratios, margins, shift realisation (CNS-Bench)",
)
ANALYSES.register("shift_views", "pipeline.analyses.shift_views:run", "per shift: accuracy small multiples, failure-point heat map, ranking")
ANALYSES.register("strips", "pipeline.analyses.strips:run", "per shift a contact sheet of trajectories x scales with failure marks")
# Every report has these sections (after the configured analyses), unless configured explicitly.
ANALYSES.register(
    "vlm_answers", "pipeline.analyses.vlm_answers:run",
    "vlm classifiers: TRUE / FALSE / excluded answers per shift and scale, accuracy = TRUE / (TRUE + FALSE)",
)
ANALYSES.register(
    "refined_failure_points", "pipeline.analyses.refined:run",
    "failure points bisected below the grid by `cnsbench refine`: finer histogram and cumulative curve beside the grid's",
)
REPORT_ANALYSES = ("shift_views", "strips", "vlm_answers", "refined_failure_points")

ANALYSES.register(
    "corruption_error", "pipeline.analyses.corruption:run",
    "ImageNet-C corruption error per corruption, mCE (unnormalised, by a baseline classifier or AlexNet), relative mCE",
)
ANALYSES.register(
    "family_comparison", "pipeline.analyses.family_comparison:run",
    "per classifier: accuracy drop and mean failure point under each family, Spearman rank correlation between families",
)
ANALYSES.register(
    "attributes", "pipeline.analyses.attributes:run",
    "ImageNet-E: accuracy per attribute and level, drop vs the unedited image, failure points, mean drop at published levels",
)
ANALYSES.register(
    "hard_mining", "pipeline.analyses.hard_mining:run",
    "ImageNet-D hard set: images >= k of n surrogates get wrong; transfer to held-out classifiers, shared failures",
)
ANALYSES.register(
    "release_protocol", "pipeline.analyses.release_protocol:run",
    "a released benchmark's evaluation protocol (docs/protocol.md): each classifier's inputs, overrides flagged",
)

ANALYSES.register(
    "robustness_score", "pipeline.analyses.robustness_score:run",
    "XIMAGENET-12: per-scenario accuracy C(i), linear-probe C'(i), S = 1 - (var_cross + var_inner), scenario curves",
)
ANALYSES.register(
    "scenario_regression", "pipeline.analyses.scenario_regression:run",
    "XIMAGENET-12: OLS of accuracy on classifier, scenario and class (estimates, p-values)",
)
ANALYSES.register("mask_quality", "pipeline.analyses.mask_quality:run", "object masks: area share, components, usability, IoU vs true masks")

# How stages run (``--runner``): see pipeline.executors.
EXECUTORS: Registry[type] = Registry("executor", base="pipeline.executors.base:Executor")
EXECUTORS.register("ray_data", "pipeline.executors.ray_data:RayDataExecutor", "Ray Data actor pools, streaming (--runner ray)")
EXECUTORS.register("in_process", "pipeline.executors.in_process:InProcessExecutor", "every stage in this process (--runner local)")
EXECUTOR_ALIASES = {"ray": "ray_data", "local": "in_process"}

# The text-to-image sampler of a generator kind (``generator.kind``; a family reads its own
# kind's sampler): pipeline.models.sampler.
SAMPLERS: Registry[type] = Registry("sampler", base="pipeline.models.sampler:TextToImageSampler")
SAMPLERS.register("slider", "pipeline.models.sampler:SliderSampler", "SD2 with the class token and the (class, shift) LoRA slider")
SAMPLERS.register("prompt", "pipeline.models.sampler:PromptSampler", "SD2 with the class token and the shift's words in the prompt")

# What `cnsbench ls` prints, in order.
ALL: dict[str, Registry] = {
    "families (generator.kind, families[].kind)": FAMILIES,
    "sources (source.kind)": SOURCES,
    "mask providers (source.masks.kind)": MASKS,
    "filters (filter.kind)": FILTERS,
    "classifiers (classifiers[].kind)": CLASSIFIERS,
    "VQA protocols (classifiers[].protocol.kind, kind vlm)": VQA_PROTOCOLS,
    "analyses (aggregate.analyses)": ANALYSES,
    "executors (--runner)": EXECUTORS,
    "samplers (generator.kind of the text-to-image families)": SAMPLERS,
}
