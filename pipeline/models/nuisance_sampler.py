"""Sampler of the ``prompt_nuisance`` family: the prompt baseline with a template per nuisance.

:class:`~pipeline.models.sampler.PromptSampler` already runs a (class, seed) unit as one
batched group: the plain prompt (scale 0) and every shift prompt are branches of the same
UNet calls from the same initial noise.  This subclass only changes the shift prompt: the
template of the nuisance's kind, filled with the class token and the nuisance's words.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pipeline.models.sampler import PromptSampler


class NuisanceSampler(PromptSampler):
    """The prompt baseline's batched sampler with one prompt template per nuisance.

    ``prompts``: shift -> (template, nuisance words); the template has the placeholders
    ``{token}``, ``{class_name}`` and ``{nuisance}`` (the family picks it by the nuisance's
    kind).  ``plain_prompt`` replaces ``generator.prompt`` at scale 0 when given.
    """

    def __init__(
        self, spec: Any, device: str, dtype: Any, prompts: Mapping[str, tuple[str, str]], plain_prompt: str | None = None
    ) -> None:
        if plain_prompt:
            spec = spec.model_copy(update={"prompt": plain_prompt})
        super().__init__(spec, device, dtype)
        self.prompts = dict(prompts)

    def plain_text(self, class_id: int) -> str:
        return self.spec.prompt.format(token=self.tokens[class_id])

    def nuisance_text(self, class_id: int, shift: str) -> str:
        template, words = self.prompts[shift]
        return template.format(token=self.tokens[class_id], class_name=self.labels.name(class_id), nuisance=words)

    def _shift_embeds(self, class_id: int, shift: str):
        key = (class_id, shift)
        cache = self.__dict__.setdefault("_shift_cache", {})
        if key not in cache:
            pos, _ = self.pipe.encode_prompt(
                self.nuisance_text(class_id, shift), self.device, 1, True, negative_prompt=self.spec.negative_prompt
            )
            cache[key] = pos
        return cache[key]

    def reference_image(self, class_id: int, seed: int, shift: str | None, scale: float):
        """One image with the plain diffusers pipeline call and the prompt of its scale (the oracle)."""
        prompt = self.plain_text(class_id) if shift is None or scale == 0 else self.nuisance_text(class_id, shift)
        return self._pipeline_call(prompt, seed)
