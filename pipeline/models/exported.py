"""Classifier kind ``exported``: a ``torch.export`` program (``.pt2``) with its preprocessing.

The successor of the ``torchscript`` kind (the installed torch deprecates ``torch.jit.save``
and ``torch.jit.load`` and points to ``torch.export``).  ``checkpoint`` is the file written
by ``torch.export.save(program, path, extra_files={"preprocess.json": ...})``: a program
mapping a float tensor ``[N, C, H, W]`` to logits ``[N, K]``, and beside it in the archive
the transform it expects (:mod:`pipeline.models.stored_preprocess`: ``input_size``,
``mean``, ``std``, ``interpolation``; ``model_kwargs`` override them).  Export the program
with a dynamic batch dimension (``torch.export.Dim``) so any batch size runs;
:func:`export_classifier` does that for an ``nn.Module``.  Outputs map to class ids as for
the other kinds (identity when K equals the label space's size, else ``label_map``).

The archive must hold tensors only (:mod:`pipeline.models.pt2_check`): pickled weights or
constants and compiled code are refused before anything is loaded, by the up-front asset
check (:func:`archive_problems`) and again on the bytes the actor reads, once: the
program and its preprocessing are loaded from exactly the members checked.
"""

from __future__ import annotations

import json
import os
from typing import Any

import torch

from pipeline.config import ClassifierSpec
from pipeline.errors import CnsbenchError
from pipeline.labels import LabelSpace
from pipeline.io import zip_archive
from pipeline.io.regular import NotRegularFile, read_bounded, regular_file
from pipeline.models import pt2_check, stored_preprocess
from pipeline.models.classifiers import Classifier, archive_footprint
from pipeline.models.footprint import ModelSize


def read_archive(spec: ClassifierSpec, where: str) -> zip_archive.Members:
    """The entry's archive, read once and checked (:mod:`pipeline.models.pt2_check`): the
    members its preprocessing and its program both come from."""
    if not spec.checkpoint:
        raise CnsbenchError(f"{where}.checkpoint: the exported kind needs the .pt2 file (torch.export.save)")
    if not os.path.lexists(spec.checkpoint):
        raise FileNotFoundError(f"{where}.checkpoint: checkpoint file not found: {spec.checkpoint}")
    data = read_bounded(spec.checkpoint, stored_preprocess.MAX_ARCHIVE_BYTES, f"{where}.checkpoint")
    try:
        return pt2_check.check_archive(data, spec.checkpoint)
    except pt2_check.UnsafeArchive as err:
        raise pt2_check.UnsafeArchive(f"{where}.checkpoint: {err}") from None


class ExportedClassifier(Classifier):
    """A ``torch.export`` program loaded with ``torch.export.load`` (see the module doc)."""

    def __init__(self, spec: ClassifierSpec, device: str, labels: LabelSpace | None = None) -> None:
        super().__init__(spec, device, labels)
        archive = read_archive(spec, self.where)  # one read: the members checked are the members loaded
        saved = stored_preprocess.saved_preprocess(archive, spec.checkpoint)
        self.preprocess_cfg = stored_preprocess.resolve(saved, spec.model_kwargs, self.where, spec.checkpoint, "exported")
        try:
            program = pt2_check.load_members(archive)
        except Exception as err:
            raise RuntimeError(f"{self.where}: could not load torch.export program {spec.checkpoint}: {err}") from err
        problem = output_problem(program, f"{self.where}: the program in {spec.checkpoint}")
        if problem:
            raise CnsbenchError(problem)
        self.model = program.module().to(device)
        self.transform = stored_preprocess.transform(self.preprocess_cfg)
        size = list(self.preprocess_cfg["input_size"])
        try:
            with torch.inference_mode():
                probe = self.model(torch.zeros(2, *size, device=device))
        except Exception as err:
            raise CnsbenchError(
                f"{self.where}: the program in {spec.checkpoint} does not take a batch [N, {', '.join(map(str, size))}] "
                f"(export it with a dynamic batch dimension and that input_size): {err}"[:600]
            ) from None
        if probe.ndim != 2:
            raise CnsbenchError(f"{self.where}: the exported program returns shape {tuple(probe.shape)}, expected [N, K]")
        self._map_outputs(int(probe.shape[1]))

    def _forward(self, x: torch.Tensor) -> torch.Tensor:
        try:
            return self.model(x)
        except Exception as err:  # an exported program checks its input's shape (its guards)
            raise CnsbenchError(
                f"{self.where}: the program in {self.spec.checkpoint} does not take an input of shape {tuple(x.shape)} "
                f"(its preprocess.json: input_size {self.preprocess_cfg['input_size']}; the entry's preprocess "
                f"{self.preprocess_choice!r} makes this one): {err}"[:700]
            ) from None

    @staticmethod
    def footprint(spec: ClassifierSpec, images: int) -> ModelSize:
        return archive_footprint(spec)

    @classmethod
    def file_problems(cls, spec: ClassifierSpec, where: str) -> list[str]:
        return archive_problems(spec, where) or returned_problems(spec, where)

    @classmethod
    def input_transform(cls, spec: ClassifierSpec) -> dict[str, Any] | None:
        return stored_preprocess.archive_transform(spec, "exported")


def archive_problems(spec: ClassifierSpec, where: str) -> list[str]:
    """What the up-front asset check refuses in an ``exported`` entry's archive: not a regular
    file, not a torch.export archive, or anything but tensors (:mod:`pipeline.models.pt2_check`)."""
    if not spec.checkpoint or not os.path.lexists(spec.checkpoint):
        return []  # missing: the asset check's own line
    try:
        path = regular_file(spec.checkpoint, f"{where}.checkpoint")
        pt2_check.check_archive(read_bounded(path, stored_preprocess.MAX_ARCHIVE_BYTES, f"{where}.checkpoint"),
                                spec.checkpoint)
    except (NotRegularFile, pt2_check.UnsafeArchive, OSError) as err:
        return [f"{where}.checkpoint: {err}"]
    return []


def output_problem(program: Any, what: str) -> str | None:
    """Why ``program`` (a ``torch.export`` program) is no classifier: it returns something other
    than one logits tensor ``[N, K]`` (a dict, a tuple, another rank), named; None when it is one."""
    spec = program.call_spec.out_spec
    outputs = [n for n in program.graph.nodes if n.op == "output"][0].args[0]
    shapes = [tuple(getattr(o, "meta", {}).get("val").shape) if hasattr(getattr(o, "meta", {}).get("val"), "shape")
              else None for o in outputs]
    if spec is not None and not spec.is_leaf():
        kind = spec.type.__name__ if spec.type is not None else "structure"
        return (f"{what} returns a {kind} of {spec.num_leaves} value(s) (shapes {shapes}), "
                "not a logits tensor [N, K]; return the logits alone")
    if len(shapes) == 1 and shapes[0] is not None and len(shapes[0]) != 2:
        return f"{what} returns a tensor of rank {len(shapes[0])}, not logits [N, K]"
    return None


def returned_problems(spec: ClassifierSpec, where: str) -> list[str]:
    """What the up-front check refuses in what an archive's program returns (:func:`output_problem`),
    read from its graph without running it."""
    if not spec.checkpoint or not os.path.isfile(spec.checkpoint):
        return []
    try:
        with open(spec.checkpoint, "rb") as fh:
            program = pt2_check.load_checked(fh.read(), spec.checkpoint)
    except Exception:  # noqa: BLE001 - an archive that does not load: the classify stage names why
        return []
    problem = output_problem(program, f"{where}.checkpoint: the program in {spec.checkpoint}")
    return [problem] if problem else []


def export_classifier(module: torch.nn.Module, path: str, preprocess: dict[str, Any]) -> str:
    """Write ``module`` (eval mode, ``[N, C, H, W] -> [N, K]``) as a ``.pt2`` program with a
    dynamic batch dimension and ``preprocess`` stored beside it; returns ``path``."""
    cfg = stored_preprocess.resolve(json.dumps(preprocess), {}, "export_classifier", path, "exported")
    module = module.eval()
    example = (torch.zeros(2, *cfg["input_size"]),)
    batch = torch.export.Dim("batch", min=1)
    program = torch.export.export(module, example, dynamic_shapes=({0: batch},))
    problem = output_problem(program, f"export_classifier: {type(module).__name__}")
    if problem:
        raise CnsbenchError(problem)
    torch.export.save(program, path, extra_files={stored_preprocess.PREPROCESS_FILE: json.dumps(cfg)})
    return path
