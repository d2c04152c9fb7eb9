"""Lazy registries for pluggable parts (generators, filters, classifiers).

Entries are ``"module:attribute"`` strings, so listing and validating never import
torch or a model library.  An unknown key fails with the valid keys and close matches.
"""

from __future__ import annotations

import difflib
import importlib
from typing import Any


class Registry:
    def __init__(self, kind: str) -> None:
        self.kind = kind
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
            raise KeyError(f"unknown {self.kind} {key!r}{hint}; registered: {', '.join(self.keys())}")

    def get(self, key: str) -> Any:
        self.check(key)
        module, _, attr = self._entries[key][0].partition(":")
        return getattr(importlib.import_module(module), attr)


GENERATORS = Registry("generator")
GENERATORS.register(
    "slider", "pipeline.models.sampler:SliderSampler",
    "SD2 + textual-inversion class token + one LoRA slider per (class, shift), continuous scales",
)

GENERATORS.register(
    "prompt", "pipeline.models.sampler:PromptSampler",
    "prompt-only baseline (2P): 'a picture of a {token}' at scale 0, '... in {shift words}' at every scale > 0",
)

FILTERS = Registry("filter")
FILTERS.register(
    "ooc4", "pipeline.models.detectors:OOCFilter",
    "four detectors (CLIP text x2, CLIP image and DINOv2 similarity to scale 0), keep if k of 4 pass",
)
FILTERS.register("none", "pipeline.models.detectors:KeepAll", "keep every image (scores left empty)")

CLASSIFIERS = Registry("classifier")
CLASSIFIERS.register("timm", "pipeline.models.classifiers:TimmClassifier", "any timm model (name.tag or local weights)")
CLASSIFIERS.register(
    "open_clip_zeroshot", "pipeline.models.classifiers:OpenClipZeroShot",
    "open_clip zero-shot over the ImageNet class names with prompt templates",
)
CLASSIFIERS.register(
    "torchscript", "pipeline.models.classifiers:TorchScriptClassifier",
    "a TorchScript file (torch.jit.save) with input size, mean and std; for models timm cannot express",
)
