"""LoRA concept sliders on a diffusers UNet, with a per-row slider and multiplier.

A slider is a LoRA network in the published concept-slider layout: a state dict with
``lora_unet_<module path, '.' -> '_'>.lora_down.weight`` / ``.lora_up.weight`` /
``.alpha`` for every targeted Linear or Conv2d.  Its output is
``lora_up(lora_down(x)) * multiplier * alpha / rank`` added to the layer's output.

:class:`SliderBank` attaches forward hooks to the targeted layers once and holds any
number of loaded sliders.  Before each UNet call, :meth:`SliderBank.route` says which
slider and which multiplier each batch row uses, so one forward can carry several
(shift, scale) branches of a trajectory group -- the reference applies one slider at
one multiplier per pipeline call, which is the special case of a uniform route.

Training builds the same layout with peft (:mod:`pipeline.models.peft_lora`), and
diffusers' ``load_lora_weights`` reads these files as they are (``docs/lora.md``).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Sequence

import torch
import torch.nn.functional as F
from torch import nn

LORA_PREFIX = "lora_unet"

# Module classes whose Linear/Conv children a slider adapts (concept-slider naming).
TARGETS = {
    "attn": ("Attention",),
    # "c3lier": attention plus the convolutions of the resnet and up/down blocks.
    "attn_conv": ("Attention", "ResnetBlock2D", "Downsample2D", "Upsample2D", "DownBlock2D", "UpBlock2D"),
}
METHODS = ("noxattn", "full", "xattn", "selfattn")


def lora_key(module_path: str) -> str:
    return f"{LORA_PREFIX}_{module_path.replace('.', '_')}"


def _excluded(key: str, method: str) -> bool:
    if method == "noxattn":
        return "attn2" in key or "time_embed" in key
    if method == "xattn":
        return "attn2" not in key
    if method == "selfattn":
        return "attn1" not in key
    return False


def target_modules(unet: nn.Module, targets: str = "attn", method: str = "noxattn") -> dict[str, nn.Module]:
    """Module path -> Linear/Conv2d layer that a slider with these settings adapts."""
    if targets not in TARGETS:
        raise ValueError(f"unknown slider targets {targets!r}; choose one of {sorted(TARGETS)}")
    if method not in METHODS:
        raise ValueError(f"unknown slider method {method!r}; choose one of {METHODS}")
    classes = TARGETS[targets]
    found: dict[str, nn.Module] = {}
    for name, module in unet.named_modules():
        if module.__class__.__name__ not in classes:
            continue
        for child_name, child in module.named_modules():
            if not isinstance(child, (nn.Linear, nn.Conv2d)) or not child_name:
                continue
            parts = child_name.split(".")
            if any(p.startswith("lora_") for p in parts):
                continue  # a peft adapter's own A/B layers
            # A layer wrapped by peft (``to_q.base_layer``) keeps its slider key (``to_q``).
            path = f"{name}.{'.'.join(p for p in parts if p != 'base_layer')}"
            if not _excluded(lora_key(path), method):
                found[path] = child
    return dict(sorted(found.items()))


@dataclass
class _Adapter:
    down: torch.Tensor
    up: torch.Tensor
    scale: float  # alpha / rank


def load_slider_file(path: str) -> dict[str, torch.Tensor]:
    """Read a slider state dict from ``.safetensors`` or ``.pt`` (local path or fsspec URI)."""
    import fsspec

    if not (path.endswith(".safetensors") or path.endswith(".pt") or path.endswith(".pth")):
        raise ValueError(f"slider file {path!r}: expected a .safetensors, .pt or .pth file")
    try:
        with fsspec.open(path, "rb") as fh:
            data = fh.read()
    except FileNotFoundError:
        raise FileNotFoundError(f"slider file not found: {path}") from None
    if path.endswith(".safetensors"):
        from safetensors.torch import load as st_load

        return st_load(data)
    import io

    state = torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
    if not isinstance(state, dict):
        raise ValueError(f"slider file {path!r}: expected a state dict, got {type(state).__name__}")
    return state


def save_slider_file(state: dict[str, torch.Tensor], path: str, metadata: dict[str, str] | None = None) -> None:
    """Write a slider atomically (temporary file, then rename) as safetensors or .pt."""
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    tmp = f"{path}.tmp-{os.getpid()}"
    state = {k: v.detach().contiguous().cpu() for k, v in state.items()}
    if path.endswith(".safetensors"):
        from safetensors.torch import save_file

        save_file(state, tmp, metadata=metadata)
    else:
        with open(tmp, "wb") as fh:
            torch.save(state, fh)
    os.replace(tmp, path)


def random_slider(
    unet: nn.Module,
    rank: int = 4,
    alpha: float = 1.0,
    targets: str = "attn",
    method: str = "noxattn",
    seed: int = 0,
    std: float = 0.05,
) -> dict[str, torch.Tensor]:
    """A slider with random non-zero weights (a freshly initialised slider has ``lora_up = 0``
    and changes nothing; tests and the demo need one that provably moves the output)."""
    gen = torch.Generator().manual_seed(seed)
    state: dict[str, torch.Tensor] = {}
    for path, layer in target_modules(unet, targets, method).items():
        key = lora_key(path)
        if isinstance(layer, nn.Linear):
            down = torch.randn(rank, layer.in_features, generator=gen) * std
            up = torch.randn(layer.out_features, rank, generator=gen) * std
        else:
            kh, kw = layer.kernel_size
            down = torch.randn(rank, layer.in_channels, kh, kw, generator=gen) * std
            up = torch.randn(layer.out_channels, rank, 1, 1, generator=gen) * std
        state[f"{key}.lora_down.weight"] = down
        state[f"{key}.lora_up.weight"] = up
        state[f"{key}.alpha"] = torch.tensor(float(alpha))
    return state


class SliderBank:
    """Holds loaded sliders for one UNet and applies them per batch row through hooks."""

    def __init__(self, unet: nn.Module) -> None:
        self.unet = unet
        # Every Linear/Conv2d that any slider could target, by LoRA key.
        self._layers: dict[str, tuple[str, nn.Module]] = {}
        for targets in TARGETS:
            for path, layer in target_modules(unet, targets, "full").items():
                self._layers[lora_key(path)] = (path, layer)
        self._sliders: dict[str, dict[str, _Adapter]] = {}
        self._route: list[tuple[dict[str, _Adapter], torch.Tensor | None, torch.Tensor | float]] = []
        self._hooks = [
            layer.register_forward_hook(self._make_hook(key)) for key, (_, layer) in self._layers.items()
        ]

    # ------------------------------------------------------------------ sliders
    def __contains__(self, name: str) -> bool:
        return name in self._sliders

    def names(self) -> list[str]:
        return list(self._sliders)

    def add(self, name: str, state: dict[str, torch.Tensor], source: str = "<state dict>") -> None:
        """Register a slider state dict under ``name``; unknown modules are an error."""
        param = next(self.unet.parameters())
        grouped: dict[str, dict[str, torch.Tensor]] = {}
        for k, v in state.items():
            base, _, leaf = k.rpartition(".")
            if leaf == "weight":
                base, _, kind = base.rpartition(".")
                leaf = kind
            grouped.setdefault(base, {})[leaf] = v
        unknown = sorted(k for k in grouped if k not in self._layers)
        if unknown:
            raise ValueError(
                f"slider {source}: {len(unknown)} keys match no UNet module, e.g. {unknown[:3]}; "
                "is it a slider for this base model?"
            )
        adapters: dict[str, _Adapter] = {}
        for key, parts in grouped.items():
            if "lora_down" not in parts or "lora_up" not in parts:
                raise ValueError(f"slider {source}: {key} lacks lora_down/lora_up weights")
            down, up = parts["lora_down"], parts["lora_up"]
            rank = down.shape[0]
            alpha = float(parts["alpha"]) if "alpha" in parts else float(rank)
            layer = self._layers[key][1]
            if isinstance(layer, nn.Conv2d) and down.dim() != 4:
                raise ValueError(f"slider {source}: {key} is a Conv2d but lora_down has shape {tuple(down.shape)}")
            adapters[key] = _Adapter(
                down.to(param.device, param.dtype), up.to(param.device, param.dtype), alpha / rank
            )
        self._sliders[name] = adapters

    def remove(self, name: str) -> None:
        self._sliders.pop(name, None)

    def detach(self) -> None:
        for h in self._hooks:
            h.remove()
        self._hooks = []

    # ------------------------------------------------------------------ routing
    def route(self, sliders: Sequence[str | None], multipliers: Sequence[float]) -> None:
        """Set slider and multiplier per batch row for the following UNet calls.

        ``sliders[i] is None`` or ``multipliers[i] == 0`` leaves row ``i`` untouched.
        """
        if len(sliders) != len(multipliers):
            raise ValueError("route: sliders and multipliers differ in length")
        param = next(self.unet.parameters())
        route = []
        active = {(s) for s, m in zip(sliders, multipliers) if s is not None and m != 0}
        for name in sorted(active):
            if name not in self._sliders:
                raise KeyError(f"slider {name!r} is not loaded; loaded: {self.names()}")
            rows = [i for i, (s, m) in enumerate(zip(sliders, multipliers)) if s == name and m != 0]
            mult = torch.tensor([multipliers[i] for i in rows], device=param.device, dtype=param.dtype)
            if len(rows) == len(sliders) and bool((mult == mult[0]).all()):
                route.append((self._sliders[name], None, float(multipliers[rows[0]])))
            else:
                route.append((self._sliders[name], torch.tensor(rows, device=param.device), mult))
        self._route = route

    def route_uniform(self, name: str | None, multiplier: float, batch: int) -> None:
        self.route([name] * batch, [multiplier] * batch)

    def clear_route(self) -> None:
        self._route = []

    def _make_hook(self, key: str):
        layer = self._layers[key][1]
        is_conv = isinstance(layer, nn.Conv2d)

        def hook(module: nn.Module, args: tuple, output: torch.Tensor) -> torch.Tensor:
            if not self._route:
                return output
            x = args[0]
            for adapters, rows, mult in self._route:
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
