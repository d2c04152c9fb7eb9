"""What a model costs in memory, stated by the model's own class (``footprint(spec, images)``).

Every classifier kind answers ``footprint(spec, images) -> ModelSize`` from its config alone,
building the model on PyTorch's ``meta`` device (shapes only: no weights read, no
download); :mod:`pipeline.perf.memory` turns sizes into actors' memory and groups.
:func:`meta_forward_peak` is the one measurement every meta build shares.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    import torch

log = logging.getLogger(__name__)

# Bytes per value of the dtypes a model runs in (tf32 stores float32: only products are rounded).
DTYPE_BYTES = {"float32": 4, "tf32": 4, "bfloat16": 2, "float16": 2}


@dataclass(frozen=True)
class ModelSize:
    """One model at one batch, before the stage's precision and activation factor are applied.

    ``activation_bytes``: the largest input + output of a leaf module over the batch (in
    float32, scaled to the stage's precision by the caller, unless the model runs in its own
    dtypes), multiplied by the caller's factor for the tensors alive around it;
    ``cache_bytes``: memory known exactly (a vlm's generation cache), added as it is;
    ``weight_bytes``: set by a model that runs in its own dtypes (a vlm), else None: the
    parameters at the stage's precision.
    """

    params: int
    activation_bytes: int
    cache_bytes: int = 0
    weight_bytes: int | None = None

    @property
    def own_dtype(self) -> bool:
        """True when the model runs in its own dtypes, whatever the stage's precision."""
        return self.weight_bytes is not None


def param_count(model: "torch.nn.Module") -> int:
    return sum(p.numel() for p in model.parameters())


def meta_forward_peak(model: "torch.nn.Module", shape: Sequence[int], call: Callable | None = None) -> int:
    """Largest input + output bytes of any leaf module in one forward of a ``shape`` input on ``meta``."""
    import torch

    peak = [0]

    def nbytes(value: Any) -> int:
        if isinstance(value, torch.Tensor):
            return value.numel() * value.element_size()
        if isinstance(value, (list, tuple)):
            return sum(nbytes(v) for v in value)
        return 0

    def hook(_module, inputs, output) -> None:
        peak[0] = max(peak[0], nbytes(inputs) + nbytes(output))

    handles = [m.register_forward_hook(hook) for m in model.modules() if not list(m.children())]
    try:
        with torch.inference_mode():
            x = torch.zeros(*shape, device="meta")
            (call or model)(x)
    except Exception as err:  # noqa: BLE001 - a forward meta tensors cannot run: weights only
        log.debug("meta forward of %s failed: %s", type(model).__name__, err)
    finally:
        for h in handles:
            h.remove()
    return peak[0]


def timm_meta(name: str, model_kwargs: dict[str, Any]) -> "torch.nn.Module":
    """A timm model (the architecture of ``name``, ``arch.tag``) on ``meta``."""
    import timm
    import torch

    with torch.device("meta"):
        return timm.create_model(name.split(".", 1)[0], pretrained=False, **model_kwargs).eval()


def input_side(choice: Any, model: Any, cns_default: Any = None, default: int = 224) -> int:
    """The side of the square input a model sees: its protocol crop (``preprocess`` ``choice``), or its own."""
    from pipeline.config.protocol import CNS_CLASSIFIER, preprocess_of

    p = preprocess_of(choice or "model", cns_default or CNS_CLASSIFIER)
    if p is not None:
        return p.crop
    size = (getattr(model, "pretrained_cfg", None) or {}).get("input_size")
    return int(size[-1]) if size else default


def open_clip_sizes(model_name: str, config_file: str | None, where: str) -> tuple[int, int]:
    """(parameters, activation bytes of one image through the image tower) of an open_clip model."""
    import open_clip
    import torch

    if config_file:
        from pipeline.models.detectors import register_open_clip_config

        register_open_clip_config(config_file, model_name, f"{where}.model_config_file")
    logging.disable(logging.WARNING)  # open_clip warns that no pretrained weights load: none are wanted here
    try:
        with torch.device("meta"):
            model = open_clip.create_model(model_name, pretrained=None, device="meta").eval()
    finally:
        logging.disable(logging.NOTSET)
    size = model.visual.image_size
    side = int(size[0] if isinstance(size, (tuple, list)) else size)
    return param_count(model), meta_forward_peak(model.visual, (1, 3, side, side))


# DINOv2 torch-hub entry points as the timm architectures they match; the ``_lc`` linear
# head reads the class token and the mean patch token (2 x width -> 1000 classes).
_DINOV2_HUB = re.compile(r"dinov2_vit([sblg])14(_reg)?(_lc)?")  # matched whole (fullmatch)
_DINOV2_TIMM = {"s": "vit_small_patch14", "b": "vit_base_patch14", "l": "vit_large_patch14", "g": "vit_giant_patch14"}


def dinov2_timm_arch(entry: str) -> tuple[str, bool] | None:
    """(the timm architecture, whether it has the ``_lc`` linear head) of a DINOv2 torch-hub
    entry point such as ``dinov2_vitb14_reg_lc``; None for any other entry."""
    m = _DINOV2_HUB.fullmatch(entry)
    if not m:
        return None
    return f"{_DINOV2_TIMM[m.group(1)]}{'_reg4' if m.group(2) else ''}_dinov2", bool(m.group(3))
