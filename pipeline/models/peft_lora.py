"""A concept slider as a peft LoRA adapter: injected into a diffusers UNet, exported in the published layout.

Slider training (:mod:`pipeline.train.sliders`) builds its LoRA with peft: a
``LoraConfig`` whose ``target_modules`` are exactly the module paths the published
slider layout adapts (:func:`pipeline.models.lora.target_modules` -- attention, plus the
convolution targets for ``attn_conv``, minus cross-attention for ``noxattn``), rank and
``lora_alpha`` from ``slider_training``, no dropout, no bias.  peft's LoRA computes
``base(x) + lora_B(lora_A(x)) * lora_alpha / r`` -- the concept-slider formula at
multiplier 1 -- and for a Conv2d its ``lora_A`` keeps the layer's kernel, stride and
padding while ``lora_B`` is 1x1, which is the published conv layout too.  So the mapping
to a slider file is a renaming only::

    <module path>.lora_A.weight  <->  lora_unet_<module path, '.' -> '_'>.lora_down.weight
    <module path>.lora_B.weight  <->  lora_unet_<...>.lora_up.weight
    LoraConfig.lora_alpha        <->  lora_unet_<...>.alpha

Initialisation follows the reference rather than peft's default: ``lora_down``
kaiming-uniform with ``a=1`` (peft uses ``a=sqrt(5)``), ``lora_up`` zero, drawn by the
caller from a seeded CPU generator (:func:`pipeline.train.sliders.init_slider_params`)
and copied in with :meth:`PeftSlider.load_published`, so a seed gives the same start as
before training moved onto peft.  The adapter keeps the UNet's dtype (the reference
trains its LoRA in bf16 next to a bf16 UNet); peft's float32 up-casting belongs to
``PeftModel`` and is not applied here.

:meth:`PeftSlider.remove` puts the original layers back, so the UNet leaves training as
it came in.  Inference in a build uses :class:`pipeline.models.lora.SliderBank` (per-row
sliders and multipliers); ``bench/generation.py`` measures it against peft's
mixed-adapter batches (``bench/peft_bank.py``), see ``docs/lora.md``.
"""

from __future__ import annotations

import torch
from torch import nn

from pipeline.errors import CnsbenchError
from pipeline.models.lora import lora_key, target_modules

ADAPTER = "cns_slider"
_A, _B = ".lora_A.weight", ".lora_B.weight"


def tuner_layers(unet: nn.Module, adapter: str) -> dict[str, nn.Module]:
    """Module path -> peft LoRA layer that holds ``adapter``."""
    from peft.tuners.lora import LoraLayer

    return {n: m for n, m in unet.named_modules() if isinstance(m, LoraLayer) and adapter in m.lora_A}


def peft_to_published(state: dict[str, torch.Tensor], alpha: float | dict[str, float]) -> dict[str, torch.Tensor]:
    """peft adapter weights (``<path>.lora_A.weight`` / ``.lora_B.weight``, adapter name
    stripped as ``get_peft_model_state_dict`` returns them) -> published slider state dict.

    ``alpha`` is one value for every layer or a ``{module path: alpha}`` map.
    """
    out: dict[str, torch.Tensor] = {}
    for k, v in state.items():
        if k.endswith(_A):
            path, leaf = k[: -len(_A)], "lora_down"
        elif k.endswith(_B):
            path, leaf = k[: -len(_B)], "lora_up"
        else:
            raise CnsbenchError(f"peft state key {k!r} is not a LoRA A/B weight (bias and DoRA are not slider layouts)")
        key = lora_key(path)
        out[f"{key}.{leaf}.weight"] = v
        a = alpha[path] if isinstance(alpha, dict) else alpha
        out[f"{key}.alpha"] = torch.tensor(float(a))
    return dict(sorted(out.items()))


class PeftSlider:
    """One slider as a peft LoRA adapter injected into ``unet`` (removed by :meth:`remove`)."""

    def __init__(
        self,
        unet: nn.Module,
        rank: int = 4,
        alpha: float = 1.0,
        targets: str = "attn",
        method: str = "noxattn",
        adapter: str = ADAPTER,
    ) -> None:
        from peft import LoraConfig, inject_adapter_in_model

        paths = list(target_modules(unet, targets, method))
        if not paths:
            raise CnsbenchError(f"slider targets={targets!r} method={method!r} select no layer of this UNet")
        self.unet = unet
        self.adapter = adapter
        self.alpha = float(alpha)
        self.config = LoraConfig(
            r=rank,
            lora_alpha=alpha,
            target_modules=paths,  # exact module paths: peft matches a name or a '.'-suffix of one
            lora_dropout=0.0,
            bias="none",
            init_lora_weights=True,  # up = 0; down is overwritten with the reference init
        )
        self._had_config = hasattr(unet, "peft_config")
        inject_adapter_in_model(self.config, unet, adapter_name=adapter)
        self.layers = tuner_layers(unet, adapter)
        # peft matches target names as suffixes; it must have hit exactly the slider's layers.
        missing, extra = sorted(set(paths) - set(self.layers)), sorted(set(self.layers) - set(paths))
        if missing or extra:
            self.remove()
            raise RuntimeError(f"peft adapted other layers than the slider's: missing {missing[:3]}, extra {extra[:3]}")
        self.paths = paths

    # ------------------------------------------------------------------ weights
    def parameters(self) -> dict[str, nn.Parameter]:
        """The trainable tensors, keyed like the published state dict (``....lora_down.weight``)."""
        out: dict[str, nn.Parameter] = {}
        for path, layer in self.layers.items():
            key = lora_key(path)
            out[f"{key}.lora_down.weight"] = layer.lora_A[self.adapter].weight
            out[f"{key}.lora_up.weight"] = layer.lora_B[self.adapter].weight
        return out

    @torch.no_grad()
    def load_published(self, state: dict[str, torch.Tensor]) -> None:
        """Copy ``lora_down``/``lora_up`` of a published-layout state dict into the adapter."""
        params = self.parameters()
        unknown = sorted(k for k in state if k.endswith(".weight") and k not in params)
        if unknown:
            raise CnsbenchError(f"slider weights match no injected layer, e.g. {unknown[:3]}")
        for k, p in params.items():
            if k not in state:
                raise CnsbenchError(f"slider weights lack {k}")
            v = state[k]
            if tuple(v.shape) != tuple(p.shape):
                raise CnsbenchError(f"slider weight {k}: shape {tuple(v.shape)}, the layer needs {tuple(p.shape)}")
            p.copy_(v.to(p.device, p.dtype))

    def state_dict(self) -> dict[str, torch.Tensor]:
        """The adapter in the published layout (CPU float32), read through peft's own state-dict export."""
        from peft import get_peft_model_state_dict

        state = get_peft_model_state_dict(self.unet, adapter_name=self.adapter)
        state = {k: v.detach().float().cpu().clone() for k, v in state.items()}
        return peft_to_published(state, self.alpha)

    # ------------------------------------------------------------------ on / off
    def enable(self, on: bool) -> None:
        """LoRA on (multiplier 1) or off in every adapted layer."""
        for layer in self.layers.values():
            layer.enable_adapters(on)

    def remove(self) -> None:
        """Put each adapted layer's original module back; the UNet is as before injection."""
        from peft.tuners.tuners_utils import BaseTunerLayer

        for name, module in list(self.unet.named_modules()):
            if isinstance(module, BaseTunerLayer) and self.adapter in getattr(module, "lora_A", {}):
                parent_name, _, child = name.rpartition(".")
                parent = self.unet.get_submodule(parent_name) if parent_name else self.unet
                setattr(parent, child, module.get_base_layer())
        if not self._had_config and hasattr(self.unet, "peft_config"):
            del self.unet.peft_config
        self.layers = {}
