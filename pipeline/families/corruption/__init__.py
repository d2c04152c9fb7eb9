"""Family ``corruption``: the ImageNet-C corruptions at continuous severity.

Shifts are corruption names (:data:`.params.ALL`: the 15 benchmark corruptions and the 4
extra ones); a scale is a severity ``s`` in [0, 5] (:func:`.params.severity_plan`).  The
family transforms the scale-0 image of each (class, seed) unit: with a slider or prompt
family in the same build that is exactly their scale-0 image (a matched baseline), with
``source.kind`` a collection it is the collection's image.

All severities of one (image, corruption) are one tensor batch (CPU or GPU); the random
fields of an (image, seed, corruption) are drawn once from a seed derived from those
coordinates (:func:`pipeline.plan.field_seed`) and reused at every severity, so a
trajectory changes smoothly.  Each image's ``params`` record the corruption, severity,
the table parameters used and the blend, if any.

Corrupted images bypass the OOC filter by default (``options.ooc_filter``): ImageNet-C
keeps every corrupted image, and the filter's detectors would judge the corruption,
not the class.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field

from pipeline.errors import CnsbenchError
from pipeline.families.base import CardHeadline, Family, ShiftImages, UnitContext
from pipeline.families.corruption import params as P


class CorruptionOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")

    work_size: int | None = Field(
        None, ge=8, description="corrupt at this square size (ImageNet-C: 224) and resize back; None: at the image's size"
    )
    frost_dir: str | None = Field(None, description="folder of frost images (.png/.jpg); default: procedural frost")
    ooc_filter: bool = Field(False, description="run the OOC filter on corrupted images (ImageNet-C does not)")
    device: str | None = Field(None, description="torch device of the corruption batches; default: the stage's")


def functions() -> dict[str, Callable[..., Any]]:
    """Corruption name -> ``f(x, params, fields)`` batched implementation."""
    from pipeline.families.corruption import noise_blur as nb
    from pipeline.families.corruption import weather_digital as wd

    return {
        "gaussian_noise": nb.gaussian_noise,
        "shot_noise": nb.shot_noise,
        "impulse_noise": nb.impulse_noise,
        "speckle_noise": nb.speckle_noise,
        "defocus_blur": nb.defocus_blur,
        "glass_blur": nb.glass_blur,
        "motion_blur": nb.motion_blur,
        "zoom_blur": nb.zoom_blur,
        "gaussian_blur": nb.gaussian_blur,
        "snow": wd.snow,
        "frost": wd.frost,
        "fog": wd.fog,
        "spatter": wd.spatter,
        "brightness": wd.brightness,
        "contrast": wd.contrast,
        "elastic_transform": wd.elastic_transform,
        "pixelate": wd.pixelate,
        "jpeg_compression": wd.jpeg_compression,
        "saturate": wd.saturate,
    }


def corrupt_batch(name: str, x, severities: Sequence[float], fields: Sequence[Any], frost_dir: str | None = None):
    """Corruption ``name`` of every row of ``x`` (B, 3, H, W in [0, 1]) at integer-table severities in [1, 5].

    ``severities`` must be table severities (integer, or any value in [1, 5] for the
    corruptions outside :data:`.params.BLEND`); ``fields[i]`` are row i's random fields.
    """
    fn = functions()[name]
    rows = [P.params_at(name, s) for s in severities]
    if name == "frost":
        return fn(x, rows, fields, frost_dir=frost_dir)
    return fn(x, rows, fields)


def corrupt(name: str, x, severities: Sequence[float], fields: Sequence[Any], frost_dir: str | None = None):
    """``x`` (B, 3, H, W) at any severities in [0, 5] (row i at ``severities[i]``), with blends and identity."""
    import torch

    steps = [P.severity_plan(name, s) for s in severities]
    needed = sorted({v for st in steps for v in (st.lo, st.hi) if v > 0})
    out = x.clone()
    if not needed:
        return out
    # One batch per needed table severity; rows whose step uses it.
    by_sev: dict[float, dict[int, Any]] = {}
    for sev in needed:
        rows = [i for i, st in enumerate(steps) if sev in (st.lo, st.hi)]
        made = corrupt_batch(name, x[rows], [sev] * len(rows), [fields[i] for i in rows], frost_dir)
        by_sev[sev] = {i: made[k] for k, i in enumerate(rows)}
    for i, st in enumerate(steps):
        if st.severity == 0:
            continue
        hi = by_sev[st.hi][i]
        lo = x[i] if st.lo == 0 else by_sev[st.lo][i]
        out[i] = hi if st.weight == 1.0 else st.weight * hi + (1.0 - st.weight) * lo
    return out.clamp(0, 1) if isinstance(out, torch.Tensor) else out


def describe(name: str, severity: float) -> dict[str, Any]:
    """What severity ``severity`` of ``name`` means, for the ``params`` column."""
    st = P.severity_plan(name, severity)
    info: dict[str, Any] = {"corruption": name, "severity": float(severity)}
    if st.severity == 0:
        info["identity"] = True
        return info
    info["table"] = [round(v, 6) for v in P.params_at(name, st.hi)]
    if st.weight != 1.0:
        info["blend"] = {"lo": st.lo, "hi": st.hi, "weight": round(st.weight, 6)}
    return info


class CorruptionFamily(Family):
    kind = "corruption"
    headline = CardHeadline("corruptions", "pipeline.card.headline:corruptions", {"mce": False})
    continuous_scale = True  # severity s in [0, 5], interpolated between ImageNet-C's levels
    Options = CorruptionOptions
    scale_meaning = "ImageNet-C severity in [0, 5] (integers: the published table; between: linear)"
    default_scales: ClassVar[list[float] | None] = [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]
    generates_base = False
    ooc_filter = False
    analyses = ("corruption_error", "family_comparison")

    @classmethod
    def uses_ooc_filter(cls, options: BaseModel) -> bool:
        return bool(getattr(options, "ooc_filter", False))

    @classmethod
    def check_shifts(cls, shifts: list[str], options: BaseModel) -> list[str]:
        known = set(P.ALL)
        return [f"unknown corruption {s!r}; known: {', '.join(P.ALL)}" for s in shifts if s not in known]

    @classmethod
    def check_scales(cls, scales: list[float]) -> list[str]:
        return [f"severity {s} is outside [0, 5]" for s in scales if not 0.0 <= s <= P.MAX_SEVERITY]

    @classmethod
    def missing_files(cls, config, group, pairs) -> list[str]:
        problems = []
        names = [c.name for c in config.classifiers]
        for i, (name, opts) in enumerate(config.aggregate.analysis_entries()):
            base = opts.get("baseline")
            if name == "corruption_error" and base is not None and base not in names:
                problems.append(
                    f"aggregate.analyses[{i}].baseline: {base!r} is not a classifier of this build ({', '.join(names)})"
                )
        return problems + cls._frost_problems(group)

    @classmethod
    def _frost_problems(cls, group) -> list[str]:
        d = group.options.frost_dir
        if d and "frost" in group.shifts:
            from pathlib import Path

            p = Path(d)
            if not p.is_dir():
                return [f"{group.where}.options.frost_dir: folder not found: {d}"]
            if not any(f.suffix.lower() in (".png", ".jpg", ".jpeg") for f in p.iterdir()):
                return [f"{group.where}.options.frost_dir: no .png/.jpg images in {d}"]
        return []

    def setup(self) -> None:
        opts = self.options
        self._device = opts.device or self.device or "cpu"

    def generate(self, ctx: UnitContext, shifts: list[str], scales: list[float]) -> dict[str, ShiftImages]:
        import time

        import numpy as np
        import torch
        from PIL import Image

        from pipeline import plan
        from pipeline.families.corruption.ops import Fields

        problems = self.check_scales(list(scales))
        if problems:
            raise CnsbenchError("; ".join(problems))
        base = ctx.base()
        image = base.image.convert("RGB")
        size = image.size
        opts = self.options
        work = image if opts.work_size is None else image.resize((opts.work_size, opts.work_size), Image.BICUBIC)
        x0 = torch.from_numpy(np.asarray(work, dtype=np.float32) / 255.0).permute(2, 0, 1).to(self._device)
        out: dict[str, ShiftImages] = {}
        for shift in shifts:
            t0 = time.perf_counter()
            fields = Fields(plan.field_seed(ctx.class_id, ctx.seed, shift))
            x = x0.unsqueeze(0).expand(len(scales), -1, -1, -1).contiguous()
            y = corrupt(shift, x, list(scales), [fields] * len(scales), opts.frost_dir)
            arr = torch.round(y.clamp(0, 1) * 255.0).to(torch.uint8).permute(0, 2, 3, 1).cpu().numpy()
            images = []
            for s, a in zip(scales, arr):
                if s == 0:
                    images.append(base.image)  # the very input, shared with the other shifts
                    continue
                img = Image.fromarray(a)
                images.append(img if opts.work_size is None else img.resize(size, Image.BICUBIC))
            info = {k: v for k, v in base.info.items() if isinstance(v, (str, int, float, bool))}
            if opts.work_size is not None:
                info["work_size"] = opts.work_size
            params = [{**info, **describe(shift, s)} for s in scales]
            out[shift] = ShiftImages(images=images, params=params, seconds=time.perf_counter() - t0)
        return out
