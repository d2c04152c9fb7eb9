"""peft's mixed-adapter batches behind the ``SliderBank`` interface, the comparison point of
``bench/generation.py``.

peft applies one adapter per batch row (``adapter_names``); this is the nearest thing peft
has to the build's per-row sliders (``pipeline.models.lora.SliderBank``), so the bench
measures the build's bank against it and ``tests/test_lora_peft.py`` checks that both give
the same UNet output.  It serves no build, hence its place here.
"""

from __future__ import annotations

from typing import Sequence

import torch
from torch import nn

from pipeline.models.peft_lora import tuner_layers


class PeftMixedBank:
    """The :class:`~pipeline.models.lora.SliderBank` interface on peft's mixed-adapter batches.

    peft applies one adapter per batch row (``adapter_names``) at that adapter's own scale,
    so a (slider, multiplier) pair is one adapter: :meth:`route` creates the adapter
    ``"<slider>@<multiplier>"`` on first use, loading the slider through diffusers'
    ``load_lora_adapter`` (the same conversion ``pipe.load_lora_weights`` uses), and sets its
    scale to the multiplier.  ``share_weights=True`` points the adapters of one slider at
    the first one's tensors (the closest peft gets to a per-row multiplier without a copy
    per multiplier).  A sampler runs on it unchanged (``sampler.bank = PeftMixedBank(unet)``).
    """

    def __init__(self, unet: nn.Module, share_weights: bool = True) -> None:
        self.unet = unet
        self.share_weights = share_weights
        self._states: dict[str, tuple[dict[str, torch.Tensor], dict[str, float] | None]] = {}
        self._adapters: dict[tuple[str, float], str] = {}
        self._hooks: list = []

    def __contains__(self, name: str) -> bool:
        return name in self._states

    def reserve(self, slots: int) -> None:
        """Nothing to do: every slider added stays (``SliderBank`` keeps a bounded number)."""

    def names(self) -> list[str]:
        return list(self._states)

    def add(self, name: str, state: dict[str, torch.Tensor], source: str = "<state dict>") -> None:
        """Register a published-layout slider under ``name``; adapters are made per multiplier by :meth:`route`."""
        from diffusers import StableDiffusionPipeline

        if "@" in name:
            raise ValueError(f"slider name {name!r}: '@' separates the multiplier in adapter names")
        # kohya-style ``lora_unet_*`` keys -> diffusers/peft keys and per-layer alphas.
        converted, alphas = StableDiffusionPipeline.lora_state_dict(dict(state))
        self._states[name] = (converted, alphas)

    def _adapter(self, name: str, mult: float) -> str:
        key = (name, float(mult))
        if key in self._adapters:
            return self._adapters[key]
        if name not in self._states:
            raise KeyError(f"slider {name!r} is not loaded; loaded: {self.names()}")
        adapter = f"{name}@{float(mult):g}".replace(".", "_")
        converted, alphas = self._states[name]
        # As ``pipe.load_lora_weights`` hands the converted dict to the UNet.
        self.unet.load_lora_adapter(dict(converted), network_alphas=alphas, adapter_name=adapter, prefix="unet")
        first = next((a for (n, _), a in self._adapters.items() if n == name), None)
        for layer in tuner_layers(self.unet, adapter).values():
            layer.set_scale(adapter, float(mult))
            if self.share_weights and first is not None:
                layer.lora_A[adapter].weight = layer.lora_A[first].weight
                layer.lora_B[adapter].weight = layer.lora_B[first].weight
        self._adapters[key] = adapter
        return adapter

    def _lora_layers(self) -> list[nn.Module]:
        from peft.tuners.lora import LoraLayer

        return [m for m in self.unet.modules() if isinstance(m, LoraLayer)]

    def route(self, sliders: Sequence[str | None], multipliers: Sequence[float]) -> None:
        """Set slider and multiplier per batch row for the following UNet calls (as ``SliderBank.route``)."""
        if len(sliders) != len(multipliers):
            raise ValueError("route: sliders and multipliers differ in length")
        names = [
            "__base__" if s is None or m == 0 else self._adapter(s, m) for s, m in zip(sliders, multipliers)
        ]
        self.clear_route()
        if all(n == "__base__" for n in names):
            return

        def pre_hook(_module, args, kwargs):
            kwargs["adapter_names"] = names
            return args, kwargs

        for layer in self._lora_layers():
            layer.enable_adapters(True)
            self._hooks.append(layer.register_forward_pre_hook(pre_hook, with_kwargs=True))

    def route_uniform(self, name: str | None, multiplier: float, batch: int) -> None:
        self.route([name] * batch, [multiplier] * batch)

    def clear_route(self) -> None:
        """No slider on any row: without ``adapter_names`` peft would apply its active adapters."""
        for h in self._hooks:
            h.remove()
        self._hooks = []
        for layer in self._lora_layers():
            layer.enable_adapters(False)
