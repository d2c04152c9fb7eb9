"""How a model stage's image models run: ``resources.<stage>.precision`` and ``channels_last``.

* ``float32``: float32 weights, inputs and arithmetic.  On a CUDA GPU TF32 is switched off
  for matmuls *and* cuDNN convolutions while the models run (PyTorch's own default runs
  convolutions in TF32 on Ampere and later GPUs), so float32 means the same on every device.
  The paper's numbers (``protocol: cns``) are float32.
* ``tf32``: float32 weights and inputs; on a CUDA GPU, matmuls and convolutions on TF32 tensor
  cores (10-bit mantissa products, float32 sums).  A CPU has no TF32: there it is float32.
* ``bfloat16``: the weights are cast to bfloat16 once when the stage sets up (half the weight
  memory of float32), each input batch is cast, and forwards run under
  ``torch.autocast(bfloat16)``, which keeps the ops it lists as float32 (softmax, norms on CUDA)
  in float32.  On a CPU this needs bfloat16 kernels (AVX-512 BF16 / AMX make them fast).

``channels_last`` puts a model's 4-D weights and each input batch in channels-last memory
format (NHWC), which cuDNN's and oneDNN's convolutions prefer; a transformer's patch
embedding is the only convolution it has.  Whatever the precision, the stages return
float32 logits, scores and embeddings.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any, Iterator

import torch

from pipeline.config.resources import PRECISIONS
from pipeline.errors import CnsbenchError


def _fp32_flags() -> list[tuple[Any, str]]:
    """(backend namespace, attribute) of the switches that let float32 work use TF32."""
    if hasattr(torch.backends.cuda.matmul, "fp32_precision"):  # torch >= 2.9: one switch per backend op
        return [(torch.backends.cuda.matmul, "fp32_precision"), (torch.backends.cudnn.conv, "fp32_precision")]
    return [(torch.backends.cuda.matmul, "allow_tf32"), (torch.backends.cudnn, "allow_tf32")]


@contextlib.contextmanager
def tf32_switched(on: bool) -> Iterator[None]:
    """TF32 on (``on``) or off for CUDA matmuls and cuDNN convolutions inside the block, then
    as before.  The switches are the process's: another stage of the same process (the
    in-process executor) sets its own around its own forwards."""
    flags = _fp32_flags()
    saved = [getattr(ns, attr) for ns, attr in flags]
    for ns, attr in flags:
        setattr(ns, attr, ("tf32" if on else "ieee") if attr == "fp32_precision" else on)
    try:
        yield
    finally:
        for (ns, attr), value in zip(flags, saved):
            setattr(ns, attr, value)


def _device_type(device: str | torch.device) -> str:
    return torch.device(device).type


@dataclass(frozen=True)
class ModelPrecision:
    """The precision and memory format of a stage's models on ``device``."""

    precision: str = "float32"
    channels_last: bool = False

    def __post_init__(self) -> None:
        if self.precision not in PRECISIONS:
            raise CnsbenchError(f"precision must be one of {list(PRECISIONS)}, got {self.precision!r}")

    @classmethod
    def of(cls, resources: Any) -> "ModelPrecision":
        """From a stage's resources (``precision``, ``channels_last``; float32 when absent)."""
        return cls(getattr(resources, "precision", "float32"), bool(getattr(resources, "channels_last", False)))

    def effective(self, device: str | torch.device) -> str:
        """What runs on ``device``: tf32 is float32 off CUDA."""
        if self.precision == "tf32" and _device_type(device) != "cuda":
            return "float32"
        return self.precision

    @property
    def dtype(self) -> torch.dtype:
        """The dtype of weights and inputs."""
        return torch.bfloat16 if self.precision == "bfloat16" else torch.float32

    def prepare(self, module: torch.nn.Module) -> torch.nn.Module:
        """``module`` in this dtype and memory format (in place, as ``Module.to`` does)."""
        if self.precision == "bfloat16":
            module = module.to(torch.bfloat16)
        if self.channels_last:
            module = module.to(memory_format=torch.channels_last)
        return module

    def inputs(self, x: torch.Tensor) -> torch.Tensor:
        """An image batch [N, C, H, W] (already on the device) as the model takes it."""
        if self.channels_last and x.dim() == 4:
            x = x.contiguous(memory_format=torch.channels_last)
        return x.to(self.dtype) if x.is_floating_point() else x

    @contextlib.contextmanager
    def running(self, device: str | torch.device) -> Iterator[None]:
        """The block in which the models' forwards run on ``device``."""
        kind = _device_type(device)
        with contextlib.ExitStack() as stack:
            if kind == "cuda":
                stack.enter_context(tf32_switched(self.precision == "tf32"))
            if self.precision == "bfloat16":
                stack.enter_context(torch.autocast(device_type=kind, dtype=torch.bfloat16))
            yield


FLOAT32 = ModelPrecision()
