"""The per-slider hooks that applied sliders before the stacked bank, kept as the oracle.

``ReferenceSliderHooks`` is the former ``SliderBank`` as it was: each targeted layer's hook
loops over the batch's sliders, passes each slider's rows through its down/up and adds the
delta with an out-of-place ``index_add`` (or ``+`` for a uniform route).  Its cost grows
with the number of distinct sliders in a batch; its arithmetic is the concept-slider
formula written plainly, which is what the stacked bank must equal
(``tests/test_slider_bank.py``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from pipeline.models.lora import TARGETS, lora_key, target_modules


@dataclass
class Adapter:
    down: torch.Tensor
    up: torch.Tensor
    scale: float  # alpha / rank


class ReferenceSliderHooks:
    """Same interface as ``SliderBank`` (add / route / route_uniform / clear_route / detach)."""

    def __init__(self, unet: nn.Module) -> None:
        self.unet = unet
        self.layers: dict[str, nn.Module] = {}
        for targets in TARGETS:
            for path, layer in target_modules(unet, targets, "full").items():
                self.layers[lora_key(path)] = layer
        self.sliders: dict[str, dict[str, Adapter]] = {}
        self.routes: list[tuple[dict[str, Adapter], torch.Tensor | None, torch.Tensor | float]] = []
        self.hooks = [layer.register_forward_hook(self.make_hook(key)) for key, layer in self.layers.items()]

    def add(self, name: str, state: dict[str, torch.Tensor]) -> None:
        param = next(self.unet.parameters())
        grouped: dict[str, dict[str, torch.Tensor]] = {}
        for k, v in state.items():
            base, _, leaf = k.rpartition(".")
            if leaf == "weight":
                base, _, leaf = base.rpartition(".")
            grouped.setdefault(base, {})[leaf] = v
        adapters = {}
        for key, parts in grouped.items():
            down, up = parts["lora_down"], parts["lora_up"]
            rank = down.shape[0]
            alpha = float(parts["alpha"]) if "alpha" in parts else float(rank)
            adapters[key] = Adapter(down.to(param.device, param.dtype), up.to(param.device, param.dtype), alpha / rank)
        self.sliders[name] = adapters

    def route(self, sliders: Sequence[str | None], multipliers: Sequence[float]) -> None:
        param = next(self.unet.parameters())
        routes = []
        for name in sorted({s for s, m in zip(sliders, multipliers) if s is not None and m != 0}):
            rows = [i for i, (s, m) in enumerate(zip(sliders, multipliers)) if s == name and m != 0]
            mult = torch.tensor([multipliers[i] for i in rows], device=param.device, dtype=param.dtype)
            if len(rows) == len(sliders) and bool((mult == mult[0]).all()):
                routes.append((self.sliders[name], None, float(multipliers[rows[0]])))
            else:
                routes.append((self.sliders[name], torch.tensor(rows, device=param.device), mult))
        self.routes = routes

    def route_uniform(self, name: str | None, multiplier: float, batch: int) -> None:
        self.route([name] * batch, [multiplier] * batch)

    def clear_route(self) -> None:
        self.routes = []

    def detach(self) -> None:
        for h in self.hooks:
            h.remove()
        self.hooks = []

    def make_hook(self, key: str):
        is_conv = isinstance(self.layers[key], nn.Conv2d)

        def hook(module: nn.Module, args: tuple, output: torch.Tensor) -> torch.Tensor:
            x = args[0]
            for adapters, rows, mult in self.routes:
                a = adapters.get(key)
                if a is None:
                    continue
                xr = x if rows is None else x.index_select(0, rows)
                if is_conv:
                    h = F.conv2d(xr, a.down, stride=module.stride, padding=module.padding, dilation=module.dilation)
                    d = F.conv2d(h, a.up)
                else:
                    d = F.linear(F.linear(xr, a.down), a.up)
                if rows is None:
                    output = output + d * (mult * a.scale)
                else:
                    shape = (-1,) + (1,) * (d.dim() - 1)
                    output = output.index_add(0, rows, d * (mult * a.scale).view(shape))
            return output

        return hook
