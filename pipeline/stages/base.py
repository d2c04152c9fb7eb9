"""Shared plumbing of the stages: lazy setup, Arrow <-> row conversion, device choice."""

from __future__ import annotations

import io
from typing import Any

import pyarrow as pa

from pipeline.config import BuildConfig


def pick_device(prefer: str | None = None) -> str:
    import torch

    if prefer:
        return prefer
    return "cuda" if torch.cuda.is_available() else "cpu"


def pick_dtype(name: str, device: str):
    """bf16/fp16 on GPU as configured; always float32 on CPU (half precision there is slow or unsupported)."""
    import torch

    if device == "cpu":
        return torch.float32
    return {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}[name]


def decode_image(data: bytes):
    from PIL import Image

    img = Image.open(io.BytesIO(data))
    return img.convert("RGB")


class Stage:
    """Base class: subclasses set ``output_schema`` and implement ``setup`` and ``process``."""

    output_schema: pa.Schema

    def __init__(
        self, config: BuildConfig | dict[str, Any], device: str | None = None, threads: int | None = None
    ) -> None:
        self.config = config if isinstance(config, BuildConfig) else BuildConfig.model_validate(config)
        self.device_override = device
        self.threads = threads  # torch intra-op threads; set to the actor's CPUs under Ray
        self._ready = False

    def setup(self) -> None:  # pragma: no cover - overridden
        pass

    def process(self, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:  # pragma: no cover
        raise NotImplementedError

    def ensure_setup(self) -> None:
        if not self._ready:
            if self.threads:
                import torch

                torch.set_num_threads(self.threads)
            self.setup()
            self._ready = True

    def __call__(self, batch: pa.Table) -> pa.Table:
        self.ensure_setup()
        rows = batch.to_pylist() if isinstance(batch, pa.Table) else pa.Table.from_pydict(batch).to_pylist()
        out = self.process(rows)
        return pa.Table.from_pylist(out, schema=self.output_schema)
