"""A model held in memory as a classifier entry: what ``cnsbench.evaluate`` and ``cnsbench.card`` check.

The model becomes a classifier entry of kind ``module`` (:mod:`pipeline.models.module`) holding it, and
goes the way a configured classifier goes: :meth:`pipeline.output_run.OutputRun.add_classifiers`
adds its predictions to the committed shards (as ``cnsbench evaluate`` / ``card`` do), so the
report, ``refine``, ``compare`` and cards see it.  Everything is checked before anything is
written: the ``preprocess`` and ``label_map``, the model's output on a probe batch, its
weights against those that made the output's earlier predictions under the same name, and
(when the run starts, :mod:`pipeline.stages.probe`) its logits on the output's recorded probe
images against those of the model that made them.  Bad input raises
:class:`pipeline.errors.CnsbenchError` naming the classifier.
"""

from __future__ import annotations

from typing import Any, Callable

from pydantic import ValidationError

from pipeline.errors import CnsbenchError

Echo = Callable[[str], None]


def module_entry(model: Any, *, name: str, preprocess: Any, label_map: dict[int, int] | None = None) -> Any:
    """The classifier entry (kind ``module``) holding ``model``; ``preprocess``: ``"cns"`` or a
    :data:`pipeline.config.Preprocessing` transform (a mapping of resize, crop, interpolation,
    mean, std, or a :class:`pipeline.config.PreprocessSpec`)."""
    from pipeline.config import ClassifierSpec
    from pipeline.models.module import qualified_name

    if not callable(model):
        raise CnsbenchError(f"classifier {name!r}: the model must be a torch.nn.Module or a callable from a float "
                            f"batch [N, C, H, W] to logits [N, K], got a {type(model).__name__}")
    from pipeline.models.module import materialized_problem

    if materialized_problem(model):
        raise CnsbenchError(f"classifier {name!r}: {materialized_problem(model)}")
    if preprocess == "model":
        raise CnsbenchError(f"classifier {name!r}: preprocess 'model' means the model's own transform, which a "
                            "model in memory does not state; give 'cns' or resize, crop, interpolation, mean, std")
    if hasattr(preprocess, "model_dump"):
        preprocess = preprocess.model_dump()
    check_preprocess(name, preprocess)
    try:
        spec = ClassifierSpec(name=name, kind="module", model=qualified_name(model), preprocess=preprocess,
                              label_map=label_map)
    except ValidationError as err:
        detail = "; ".join(f"{'.'.join(map(str, e['loc'])) or '<entry>'}: {e['msg']}" for e in err.errors())
        raise CnsbenchError(f"classifier {name!r}: {detail}"[:900]) from None
    return spec.holding(model)


def held_entry(model: Any, *, name: str | None, preprocess: Any, label_map: dict[int, int] | None, where: str) -> Any:
    """:func:`module_entry` of a model the user passed, its ``name`` and ``preprocess`` required
    (``where``: what the name means there)."""
    if name is None or not str(name).strip():
        raise CnsbenchError(f"a model held in memory needs name= (its name {where})")
    if preprocess is None:
        raise CnsbenchError(f"classifier {name!r}: a model held in memory needs preprocess= ('cns' or a mapping of "
                            "resize, crop, interpolation, mean, std)")
    return module_entry(model, name=name, preprocess=preprocess, label_map=label_map)


def check_preprocess(name: str, preprocess: Any) -> None:
    """Refuse a ``preprocess`` naming the documented form it was meant as and what is wrong:
    the word ``'cns'``, or the numbers (a mapping of resize, crop, interpolation, mean, std)."""
    from pipeline.config import PreprocessSpec

    where = f"classifier {name!r}: preprocess"
    if isinstance(preprocess, str):
        if preprocess != "cns":
            raise CnsbenchError(f"{where} {preprocess!r}: as a word it is 'cns' (CNS-Bench's transform); "
                                "otherwise give the numbers: a mapping of resize, crop, interpolation, mean, std")
        return
    if not isinstance(preprocess, dict):
        raise CnsbenchError(f"{where}: 'cns' or a mapping of resize, crop, interpolation, mean, std, "
                            f"got a {type(preprocess).__name__}")
    try:
        PreprocessSpec.model_validate(preprocess)
    except ValidationError as err:
        detail = "; ".join(f"{'.'.join(map(str, e['loc'])) or 'the mapping'}: {e['msg']}" for e in err.errors())
        raise CnsbenchError(f"{where} (the numbers form: resize, crop, interpolation, mean, std): {detail}"[:900]) from None


def output_config(output: str) -> Any:
    from pipeline.aggregate.run import load_output_config
    from pipeline.io.store import OutputStore

    try:
        return load_output_config(OutputStore(output))
    except FileNotFoundError as err:  # not an output: the input's
        raise CnsbenchError(str(err)) from None


def check_label_map(spec: Any, labels: Any) -> None:
    mapping = spec.label_map if isinstance(spec.label_map, dict) else {}
    outside = sorted({v for v in mapping.values() if not 0 <= v < len(labels)})
    if outside:
        raise CnsbenchError(f"classifiers[{spec.name}].label_map: class ids {outside[:10]} are outside the output's "
                            f"label space {labels.key!r} ({len(labels)} classes: 0..{len(labels) - 1})")


def probe(spec: Any, labels: Any) -> None:
    """Build the classifier once here (it runs the model on a probe batch): a model that raises,
    returns no tensor, NaN or logits the label space cannot take is refused before any write."""
    from pipeline.registry import CLASSIFIERS

    CLASSIFIERS.get(spec.kind)(spec, "cpu", labels)  # its refusals are CnsbenchErrors; anything else is a bug


def check_same_weights(output: str, spec: Any) -> None:
    """Refuse a name whose earlier predictions in ``output`` were made by other weights (both digests named)."""
    from pipeline.assets.weights import check_weights, weights_digest
    from pipeline.io.ownership import read_marker
    from pipeline.io.store import OutputStore

    check_weights(output, read_marker(OutputStore(output)), {spec.name: weights_digest(spec)},
                  "pass another name to score these weights (the earlier predictions stay under the old one)")


def with_entry(cfg: Any, spec: Any, batch_size: int | None = None) -> Any:
    """``cfg`` with ``spec`` as its classifier of that name (added, or in place of an entry of the
    same name and kind), holding its model; ``batch_size``: the classify stage's."""
    from pipeline.config import parse_config, resolved_dict

    raw = resolved_dict(cfg)
    entry = spec.model_dump(mode="json", exclude_unset=True)
    names = [c["name"] for c in raw["classifiers"]]
    if spec.name in names:
        existing = raw["classifiers"][names.index(spec.name)]
        if existing.get("kind") != spec.kind:
            raise CnsbenchError(f"classifiers[{spec.name}]: the output already has a classifier of that name "
                                f"(kind {existing.get('kind')!r}); pass another name")
        raw["classifiers"][names.index(spec.name)] = entry
    else:
        raw["classifiers"].append(entry)
    if batch_size is not None:
        raw.setdefault("resources", {}).setdefault("classify", {})["batch_size"] = batch_size
    parsed = parse_config(raw, source=f"the output's config with classifier {spec.name!r}")
    from pipeline.evaluate import attach_held

    return attach_held(parsed, {spec.name: spec.held})


def classifier_metrics(output: str, name: str) -> dict[str, Any]:
    """The report's numbers of classifier ``name`` (``report/metrics.json``'s tables, its rows only)."""
    import json

    from pipeline.io.store import OutputStore

    doc = json.loads(OutputStore(output).read_bytes("report/metrics.json"))
    out: dict[str, Any] = {"classifier": name, "config_hash": doc.get("config_hash"), "counts": doc.get("counts"),
                           "scales": doc.get("scales")}
    for key in ("summary", "accuracy", "failure_point_table"):
        out[key] = [r for r in doc.get(key) or [] if r.get("classifier") == name]
    return out


def check_held(spec: Any, cfg: Any, runner: str) -> None:
    """A model held in memory against a benchmark's config before any write: its label map, its
    output on a probe batch, and whether it can travel to ``runner``'s workers."""
    from pipeline.executors import executor_class

    labels = cfg.benchmark.label_space
    check_label_map(spec, labels)
    probe(spec, labels)
    executor_class(runner).check_held(spec)
