"""The plan: which images a build makes, their ids and seeds, grouped into work units.

Every id and seed is a pure function of a sample's coordinates (class, seed, shift,
scale), never of run order, so reruns and resumed runs produce identical outputs.

The unit of generation work is a (class, seed) group: all shifts and scales of that
group share the initial noise, the steps before the LoRA window and the scale-0 image,
so one generation call computes them once (see ``pipeline.models.sampler``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Iterable, Iterator

from pipeline.config import BenchmarkSpec

if TYPE_CHECKING:  # pragma: no cover
    from pipeline.config import BuildConfig


def scale_tag(scale: float) -> str:
    """0.5 -> '0500', 2.5 -> '2500', -1.0 -> 'm1000' (the published layout's naming)."""
    milli = round(scale * 1000)
    return f"m{-milli:04d}" if milli < 0 else f"{milli:04d}"


def unit_id(class_id: int, seed: int) -> str:
    return f"{class_id:03d}/seed_{seed:04d}"


def trajectory_id(shift: str, class_id: int, seed: int) -> str:
    return f"{shift}/{class_id:03d}/seed_{seed:04d}"


def sample_id(shift: str, class_id: int, seed: int, scale: float) -> str:
    return f"{shift}/{class_id:03d}/seed_{seed:04d}_scale_{scale_tag(scale)}"


def noise_seed(class_id: int, seed: int) -> int:
    """Seed of the image's ``torch.Generator``.

    The reference seeds every image of every class with the trajectory seed itself;
    the scale-0 image and the shared pre-window steps rely on all (shift, scale) of a
    (class, seed) starting from the same noise, so this must not depend on shift/scale.
    """
    del class_id  # the reference does not mix the class into the seed
    return seed


def field_seed(class_id: int, seed: int, shift: str) -> int:
    """Seed of the random fields a transforming family draws for one (image, seed, shift).

    The same at every scale of the trajectory, so a corruption's noise is drawn once and
    only its strength changes along the trajectory.
    """
    import hashlib

    digest = hashlib.sha256(f"{class_id}/{seed}/{shift}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & ((1 << 63) - 1)


@dataclass(frozen=True)
class WorkUnit:
    """One generation call: a (class, seed) group and the shifts still to make."""

    class_id: int
    seed: int
    shifts: tuple[str, ...]
    class_name: str = ""

    @property
    def id(self) -> str:
        return unit_id(self.class_id, self.seed)

    def to_row(self) -> dict:
        return {
            "unit_id": self.id,
            "class_id": self.class_id,
            "class_name": self.class_name,
            "seed": self.seed,
            "shifts": list(self.shifts),
        }

    @staticmethod
    def from_row(row: dict) -> "WorkUnit":
        return WorkUnit(int(row["class_id"]), int(row["seed"]), tuple(row["shifts"]), row.get("class_name", ""))


def _spec_and_shifts(cfg: "BuildConfig | BenchmarkSpec") -> tuple[BenchmarkSpec, list[str]]:
    """The benchmark and every shift of the build (all families), from a config or a benchmark."""
    if isinstance(cfg, BenchmarkSpec):
        return cfg, list(cfg.shifts)
    return cfg.benchmark, cfg.all_shifts()


def iter_trajectories(cfg: "BuildConfig | BenchmarkSpec") -> Iterator[tuple[int, int, str]]:
    spec, shifts = _spec_and_shifts(cfg)
    for class_id in spec.classes:
        for seed in spec.seeds:
            for shift in shifts:
                yield int(class_id), seed, shift


def plan_units(cfg: "BuildConfig | BenchmarkSpec", done: Iterable[str] = ()) -> list[WorkUnit]:
    """Work units for every trajectory of the build whose id is not in ``done``."""
    spec, shifts = _spec_and_shifts(cfg)
    done_set = done if isinstance(done, (set, frozenset)) else set(done)
    units = []
    for class_id in spec.classes:
        for seed in spec.seeds:
            todo = tuple(s for s in shifts if trajectory_id(s, int(class_id), seed) not in done_set)
            if todo:
                units.append(WorkUnit(int(class_id), seed, todo, spec.class_name(int(class_id))))
    return units


@dataclass(frozen=True)
class PlanSummary:
    n_classes: int
    n_seeds: int
    n_shifts: int
    n_scales: int
    n_trajectories: int
    n_images: int
    n_units: int
    n_sliders: int

    def lines(self) -> list[str]:
        return [
            f"classes x seeds x shifts x scales = {self.n_classes} x {self.n_seeds} x {self.n_shifts} x {self.n_scales}",
            f"trajectories: {self.n_trajectories}",
            f"images: {self.n_images}",
            f"generation units (class, seed): {self.n_units}",
            f"sliders needed (class, shift): {self.n_sliders}",
        ]


def summarize(cfg: "BuildConfig | BenchmarkSpec") -> PlanSummary:
    spec, shifts = _spec_and_shifts(cfg)
    c, s, h, k = len(spec.classes), len(spec.seeds), len(shifts), len(spec.scales)
    if isinstance(cfg, BenchmarkSpec):
        images, sliders = c * s * h * k, c * h
    else:
        images = sum(c * s * len(g.shifts) * len(g.scales) for g in cfg.family_groups())
        from pipeline.registry import FAMILIES  # a family states the slider files it reads

        sliders = sum(FAMILIES.get(g.kind).slider_count(cfg, g) for g in cfg.family_groups())
    return PlanSummary(c, s, h, k, c * s * h, images, c * s, sliders)
