"""Shared plumbing of the stages: lazy setup, Arrow <-> row conversion, device choice."""

from __future__ import annotations

import io
from typing import Any

import pyarrow as pa

from pipeline.config import BuildConfig


def pick_device(prefer: str | None = None) -> str:
    if prefer:
        return prefer
    import torch

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


def encode_image(img, fmt: str, quality: int = 95) -> bytes:
    """A PIL image as the bytes of the output's ``image_format`` (png, or jpeg at ``quality``)."""
    buf = io.BytesIO()
    if fmt == "png":
        img.save(buf, format="PNG")
    else:
        img.save(buf, format="JPEG", quality=quality)
    return buf.getvalue()


class Stage:
    """Base class: subclasses set ``name`` and ``output_schema`` and implement ``setup``,
    ``process`` and ``batch_keys`` (the ids a batch is known by, for crash bookkeeping)."""

    name: str
    output_schema: pa.Schema
    # Whether the stage records attempt markers and gives up on batches that keep killing
    # their worker (pipeline.runtime.faults); the Ray runner retries such stages without limit.
    keeps_attempts: bool = True
    # Whether every batch must hold exactly ``batch_size`` rows (the last one may hold fewer):
    # the writer's batch is one shard.
    exact_batches: bool = False
    # Whether the stage runs torch: a stage that does not (the writer, a disabled filter)
    # never imports it, which spares each of its actors a few CPU-seconds at start.
    uses_torch: bool = True

    def __init__(
        self,
        config: BuildConfig | dict[str, Any],
        output: str | None = None,
        device: str | None = None,
        threads: int | None = None,
    ) -> None:
        self.config = config if isinstance(config, BuildConfig) else BuildConfig.model_validate(config)
        self.output = output  # the build's output store (attempt markers live there)
        self.device_override = device
        self.threads = threads  # torch intra-op threads: the stage's CPUs under every runner (stage_threads)
        self._ready = False
        self._attempts = None

    def batch_keys(self, rows: list[dict[str, Any]]) -> list[str]:
        return [r["trajectory_id"] for r in rows]

    @property
    def attempts_name(self) -> str:
        """Whose attempt markers these are (``attempts/<attempts_name>/``): the stage's name,
        unless the chain holds several stages of one kind, each of which counts its own."""
        return self.name

    def fail_rows(self, rows: list[dict[str, Any]], message: str) -> list[dict[str, Any]]:
        """Output rows marking every item of the batch failed, without processing it.

        Downstream stages pass failed rows through; the writer records them."""
        out = []
        for r in rows:
            row = {**r, "error": message, "scales": [], "sample_ids": [], "images": []}
            for field in self.output_schema:
                if field.name not in row:
                    row[field.name] = [] if pa.types.is_list(field.type) else None
            out.append(row)
        return out

    def setup(self) -> None:  # pragma: no cover - overridden
        pass

    def process(self, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:  # pragma: no cover
        raise NotImplementedError

    def ensure_setup(self) -> None:
        if not self._ready:
            self.own_threads()
            self.setup()
            self._ready = True

    def own_threads(self) -> None:
        """Compute with this stage's torch threads (``resources.<stage>.num_cpus``), set again
        before every batch: stages sharing one process (the in-process runner) each run with
        their own count, as their Ray actors do.  A CPU's reductions depend on the thread
        count, so equal counts are what make both runners write the same pixels."""
        if self.threads and self.uses_torch:
            import torch

            if torch.get_num_threads() != self.threads:
                torch.set_num_threads(self.threads)

    def give_up(self, rows: list[dict[str, Any]], attempts: int) -> pa.Table:
        """What a batch becomes after ``attempts`` tries that each killed the worker: its
        items, failed (downstream stages pass them through, the build reports them and the
        next run retries them)."""
        message = f"[{self.name}] worker crashed {attempts} times while processing this batch"
        return pa.Table.from_pylist(self.fail_rows(rows, message), schema=self.output_schema)

    @property
    def max_attempts(self) -> int:
        return getattr(self.config.resources, self.name).max_retries + 1

    def __call__(self, batch: pa.Table) -> pa.Table:
        from pipeline.runtime import faults
        rows = batch.to_pylist() if isinstance(batch, pa.Table) else pa.Table.from_pydict(batch).to_pylist()
        keys = self.batch_keys(rows) if self.keeps_attempts else []
        if self.output is not None and keys:
            if self._attempts is None:
                from pipeline.io.store import OutputStore

                self._attempts = faults.Attempts(OutputStore(self.output), self.attempts_name)
            before = self._attempts.record(faults.attempt_key(keys))
            if before >= self.max_attempts:
                # Earlier attempts at this very batch killed the worker: give up on it.
                return self.give_up(rows, before)
        self.ensure_setup()
        self.own_threads()
        # A rule for an item fires where the item is processed: failed items pass through.
        faults.inject(self.name, "start", self.batch_keys([r for r in rows if not r.get("error")]) if keys else keys)
        out = self.process(rows)
        return pa.Table.from_pylist(out, schema=self.output_schema)
