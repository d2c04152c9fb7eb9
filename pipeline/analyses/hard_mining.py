"""Analysis ``hard_mining``: ImageNet-D's hard images and their transfer to unseen classifiers.

ImageNet-D keeps the generated images on which several *surrogate* classifiers fail
together ("shared failures") and shows that these images are hard for classifiers that
were never consulted.  Here:

* **Candidates**: the shifted images (scale > 0) that the filter kept (``kept_only``),
  with a prediction of every surrogate.  With ``reference_correct`` only images whose
  plain-prompt reference (scale 0 of the same trajectory) every surrogate classifies
  correctly: the failure is then caused by the nuisance.
* **Rule**: an image is hard when at least ``k`` of the ``n`` surrogates are wrong
  (:func:`hard_mask`; default ``k = n``, all of them).
* **Transfer** (:func:`transfer_table`): for every classifier that is not a surrogate,
  accuracy on all candidates, on the hard set, and on ``repeats`` random subsets of the
  candidates of the hard set's size (mean and sample std, ddof 1); the same subsets for
  every classifier.  Leave-one-out: each surrogate against the hard set mined by the
  others with ``min(k, n - 1)`` of ``n - 1``.
* **Shared failures** (:func:`shared_failures`): per nuisance kind and per nuisance, how
  many candidates and hard images, the hard rate and the share of the hard set.

Writes ``report/hard_set.parquet`` (sample ids and coordinates), ``report/hard_set/``
(a WebDataset export that ``cnsbench evaluate report/hard_set --config CONFIG`` reads:
every hard image with its class, nuisance and seed, as a single-image trajectory at scale
0), ``report/transfer.csv`` and ``report/shared_failures.csv``.

Options (``aggregate.analyses: [{name: hard_mining, surrogates: [a, b, c], k: 2}]``):
see :class:`HardMiningOptions`.
"""

from __future__ import annotations

import io
import json
import logging
import math
from typing import Any

import numpy as np
import pandas as pd
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from pipeline.aggregate.analysis import AnalysisContext, AnalysisResult, read_images
from pipeline.aggregate.page import NA, float_format
from pipeline.errors import CnsbenchError

log = logging.getLogger(__name__)

HARD_SET = "hard_set.parquet"
EXPORT_DIR = "hard_set"
TRANSFER_COLUMNS = [
    "classifier", "role", "surrogates", "k", "n_candidates", "n_hard",
    "acc_all", "acc_hard", "acc_random_mean", "acc_random_std", "drop_vs_random", "repeats",
]


class HardMiningOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")

    surrogates: list[str] | None = Field(None, description="classifier names; default: every classifier")
    k: int | None = Field(None, ge=1, description="hard when >= k surrogates are wrong; default: all of them")
    reference_correct: bool = Field(False, description="only images whose scale-0 reference every surrogate gets right")
    kept_only: bool = Field(True, description="only images the OOC filter kept")
    repeats: int = Field(100, ge=1, description="random same-size subsets per classifier")
    seed: int = Field(0, ge=0, description="seed of the random subsets")
    export: bool = Field(True, description="write report/hard_set/ (WebDataset) with the hard images")


class HardMiningError(CnsbenchError):
    """Options that do not fit the build (unknown surrogate, k > n)."""


# --------------------------------------------------------------------------- the rule
def hard_mask(wrong: np.ndarray, k: int) -> np.ndarray:
    """``wrong[image, surrogate]`` (bool) -> hard (bool per image): at least ``k`` surrogates wrong."""
    w = np.asarray(wrong, dtype=bool)
    if w.ndim != 2:
        raise CnsbenchError(f"wrong must be [images, surrogates], got shape {w.shape}")
    if not 1 <= k <= w.shape[1]:
        raise CnsbenchError(f"k must be in 1..{w.shape[1]} (the number of surrogates), got {k}")
    return w.sum(axis=1) >= k


def correct_matrix(predictions: pd.DataFrame, sample_ids: list[str], classifiers: list[str]) -> pd.DataFrame:
    """[sample, classifier] correctness (float: 1, 0, NaN when missing) for the given ids and names."""
    p = predictions[predictions["classifier"].isin(classifiers) & predictions["sample_id"].isin(sample_ids)]
    p = p.loc[p["correct"].notna()]
    wide = p.pivot_table(index="sample_id", columns="classifier", values="correct", aggfunc="first")
    wide = wide.astype(float).reindex(index=sample_ids, columns=classifiers)
    return wide


def random_subset_accuracy(correct: np.ndarray, size: int, repeats: int, seed: int) -> tuple[float, float]:
    """Mean and sample std (ddof 1; 0 for one repeat) of accuracy over random subsets of ``size``.

    Subsets are drawn without replacement with ``numpy.random.default_rng(seed)``, so every
    classifier scored with the same seed sees the same subsets.  NaN entries (no prediction)
    are left out of each subset's mean.
    """
    c = np.asarray(correct, dtype=float)
    if size <= 0 or size > len(c):
        return math.nan, math.nan
    rng = np.random.default_rng(seed)
    accs = np.array([np.nanmean(c[rng.choice(len(c), size=size, replace=False)]) for _ in range(repeats)])
    std = float(accs.std(ddof=1)) if repeats > 1 else 0.0
    return float(accs.mean()), std


def _row(name: str, role: str, surrogates: list[str], k: int, col: np.ndarray, hard: np.ndarray, repeats: int, seed: int) -> dict:
    n_hard = int(hard.sum())
    mean, std = random_subset_accuracy(col, n_hard, repeats, seed)
    acc_hard = float(np.nanmean(col[hard])) if n_hard else math.nan
    return {
        "classifier": name,
        "role": role,
        "surrogates": "+".join(surrogates),
        "k": k,
        "n_candidates": int(len(col)),
        "n_hard": n_hard,
        "acc_all": float(np.nanmean(col)) if len(col) else math.nan,
        "acc_hard": acc_hard,
        "acc_random_mean": mean,
        "acc_random_std": std,
        "drop_vs_random": mean - acc_hard if n_hard else math.nan,
        "repeats": repeats,
    }


def transfer_table(
    correct: pd.DataFrame, surrogates: list[str], k: int, repeats: int = 100, seed: int = 0
) -> pd.DataFrame:
    """The transfer measurement on a candidate correctness table ``[image, classifier]``.

    One ``held_out`` row per classifier that is not a surrogate (accuracy on all
    candidates, on the images hard for ``k`` of the surrogates, and on random subsets of
    the same size), then one ``leave_one_out`` row per surrogate (hard set mined by the
    other surrogates with ``min(k, n - 1)``).  Accuracies are fractions in [0, 1].
    """
    missing = [s for s in surrogates if s not in correct.columns]
    if missing:
        raise CnsbenchError(f"surrogates {missing} have no column in the correctness table")
    wrong = correct[surrogates].to_numpy() == 0
    hard = hard_mask(wrong, k)
    rows = []
    for name in correct.columns:
        if name not in surrogates:
            rows.append(_row(name, "held_out", surrogates, k, correct[name].to_numpy(float), hard, repeats, seed))
    if len(surrogates) > 1:
        for name in surrogates:
            others = [s for s in surrogates if s != name]
            k_loo = min(k, len(others))
            hard_loo = hard_mask(correct[others].to_numpy() == 0, k_loo)
            rows.append(_row(name, "leave_one_out", others, k_loo, correct[name].to_numpy(float), hard_loo, repeats, seed))
    return pd.DataFrame(rows, columns=TRANSFER_COLUMNS)


def shared_failures(candidates: pd.DataFrame, hard: np.ndarray) -> pd.DataFrame:
    """Per nuisance kind, then per nuisance (``shift``): candidates, hard images, rates.

    ``candidates`` needs ``kind`` and ``shift`` columns aligned with ``hard``.  Rows are
    sorted by hard count (descending) within each level.
    """
    df = candidates[["kind", "shift"]].copy()
    df["hard"] = np.asarray(hard, dtype=bool)
    total = int(df["hard"].sum())
    out = []
    for level, keys in (("kind", ["kind"]), ("nuisance", ["kind", "shift"])):
        g = df.groupby(keys, sort=True)["hard"].agg(n_candidates="size", n_hard="sum").reset_index()
        g["level"] = level
        if level == "kind":
            g["shift"] = ""
        g["n_hard"] = g["n_hard"].astype(int)
        g["hard_rate"] = g["n_hard"] / g["n_candidates"]
        g["share_of_hard"] = g["n_hard"] / total if total else 0.0
        out.append(g.sort_values(["n_hard", "hard_rate"], ascending=False, kind="stable"))
    cols = ["level", "kind", "shift", "n_candidates", "n_hard", "hard_rate", "share_of_hard"]
    return pd.concat(out, ignore_index=True)[cols]


# --------------------------------------------------------------------------- the analysis
def parse_options(options: dict[str, Any], classifiers: list[str]) -> tuple[HardMiningOptions, list[str], int]:
    """Validated options, the surrogates and k; HardMiningError names the bad key."""
    try:
        opts = HardMiningOptions.model_validate(options)
    except ValidationError as err:
        detail = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in err.errors())
        raise HardMiningError(f"aggregate.analyses[hard_mining]: {detail}") from None
    surrogates = list(opts.surrogates) if opts.surrogates is not None else list(classifiers)
    unknown = [s for s in surrogates if s not in classifiers]
    if unknown or not surrogates or len(set(surrogates)) != len(surrogates):
        raise HardMiningError(
            f"aggregate.analyses[hard_mining].surrogates: {surrogates} must be distinct classifier names of the "
            f"build ({', '.join(classifiers)})"
        )
    k = opts.k if opts.k is not None else len(surrogates)
    if k > len(surrogates):
        raise HardMiningError(f"aggregate.analyses[hard_mining].k: {k} > the {len(surrogates)} surrogates")
    return opts, surrogates, k


def _kinds(ctx: AnalysisContext, samples: pd.DataFrame) -> pd.Series:
    """Nuisance kind per sample: the family's record (params ``kind``), else the vocabulary of a
    ``prompt_nuisance`` family, else the shift itself (e.g. the released layout's kinds)."""
    from pipeline.families.prompt_nuisance import nuisance_kinds

    by_shift: dict[str, str] = {}
    for group in getattr(ctx.config, "family_groups", lambda: [])():
        if group.kind == "prompt_nuisance":
            by_shift.update(nuisance_kinds(group.options, list(group.shifts)))
    kinds = pd.Series([by_shift.get(s, s) for s in samples["shift"]], index=samples.index, dtype=object)
    raw = samples.get("params")
    if raw is not None:
        for idx, value in raw.items():
            if isinstance(value, str) and value:
                kind = json.loads(value).get("kind")
                if isinstance(kind, str) and kind:
                    kinds[idx] = kind
    return kinds


def candidates_of(ctx: AnalysisContext, opts: HardMiningOptions, surrogates: list[str]) -> pd.DataFrame:
    """The candidate images (see the module docstring), sorted by sample id, with a ``kind`` column."""
    s = ctx.samples
    cand = s[s["scale"] != 0]
    if opts.kept_only:
        cand = cand[cand["kept"].fillna(False).astype(bool)]
    cand = cand.assign(kind=_kinds(ctx, cand)).sort_values("sample_id", kind="stable")
    ids = cand["sample_id"].tolist()
    have = correct_matrix(ctx.predictions, ids, surrogates).notna().all(axis=1).to_numpy()
    cand = cand[have]
    if opts.reference_correct:
        ref = s[s["scale"] == 0].set_index("trajectory_id")["sample_id"]
        ref_ids = cand["trajectory_id"].map(ref)
        ok = correct_matrix(ctx.predictions, ref_ids.dropna().unique().tolist(), surrogates)
        all_right = (ok == 1).all(axis=1)
        cand = cand[ref_ids.map(all_right).fillna(False).astype(bool).to_numpy()]
    return cand.reset_index(drop=True)


def export_tar(hard: pd.DataFrame, read_image) -> bytes:
    """The hard images as one WebDataset shard: ``<sample id>.<ext>`` + ``.json`` (class, nuisance, seed)."""
    from pipeline.io.webdataset import build_tar, metadata_json

    ids = hard["sample_id"].tolist()
    images = read_images(read_image, ids)
    members = []
    for r in hard.itertuples(index=False):
        data = images[r.sample_id]
        ext = "png" if data[:8] == b"\x89PNG\r\n\x1a\n" else "jpg"
        meta = {
            "class_id": int(r.class_id), "class_name": r.class_name, "shift": r.shift, "kind": r.kind,
            "seed": int(r.seed), "scale": 0.0, "source_sample_id": r.sample_id,
        }
        members.append((r.sample_id, {ext: data, "json": metadata_json(meta)}))
    return build_tar(members)


def _skip_reason(options: dict[str, Any], classifiers: list[str]) -> str | None:
    wanted = options.get("surrogates")
    if isinstance(wanted, list) and wanted and not set(wanted) & set(classifiers):
        # `cnsbench evaluate --classifiers` on a config that mines with other classifiers.
        return f"none of the surrogates {wanted} is a classifier of this output ({', '.join(classifiers)})"
    return None


def check_options(options: dict[str, Any], cfg: Any) -> list[str]:
    """Problems with the options for this config (``cnsbench validate``/``build`` call it before models load)."""
    classifiers = [c.name for c in cfg.classifiers]
    if _skip_reason(options, classifiers):
        return []
    try:
        parse_options(options, classifiers)
    except HardMiningError as err:
        return [str(err).removeprefix("aggregate.analyses[hard_mining]").lstrip(".: ")]
    return []


def skipped(reason: str) -> AnalysisResult:
    """The section of an output this analysis cannot run on (e.g. an evaluate run without the surrogates)."""
    log.warning("hard_mining skipped: %s", reason)
    return AnalysisResult(title="Hard images", json={"skipped": reason}, html=f"<p>Skipped: {reason}.</p>")


def hard_set_sheet(hard: pd.DataFrame, read_image, count: int = 32, thumb: int = 64, per_row: int = 4) -> bytes:
    """PNG contact sheet of the first ``count`` hard images, each after its plain reference (scale 0)."""
    from PIL import Image, ImageDraw

    from pipeline.plan import sample_id

    rows = list(hard.head(count).itertuples(index=False))
    refs = {r.sample_id: sample_id(r.shift, int(r.class_id), int(r.seed), 0.0) for r in rows}
    ids = sorted(set(refs) | set(refs.values()))
    images = read_images(read_image, ids)
    cell_w, cell_h = 2 * thumb + 4, thumb + 14
    n_rows = -(-len(rows) // per_row)
    sheet = Image.new("RGB", (per_row * (cell_w + 8), n_rows * (cell_h + 6)), "white")
    draw = ImageDraw.Draw(sheet)
    for i, r in enumerate(rows):
        x, y = (i % per_row) * (cell_w + 8), (i // per_row) * (cell_h + 6)
        for j, sid in enumerate((refs[r.sample_id], r.sample_id)):
            img = Image.open(io.BytesIO(images[sid])).convert("RGB").resize((thumb, thumb), Image.NEAREST)
            sheet.paste(img, (x + j * (thumb + 4), y))
        draw.text((x, y + thumb + 1), f"{r.class_name} | {r.shift}"[: cell_w // 6], fill=(40, 40, 40))
    buf = io.BytesIO()
    sheet.save(buf, format="PNG")
    return buf.getvalue()


def run(ctx: AnalysisContext) -> AnalysisResult:
    classifiers = [c.name for c in ctx.config.classifiers]
    reason = _skip_reason(ctx.options, classifiers)
    if reason:
        return skipped(reason)
    opts, surrogates, k = parse_options(ctx.options, classifiers)
    cand = candidates_of(ctx, opts, surrogates)
    correct = correct_matrix(ctx.predictions, cand["sample_id"].tolist(), classifiers)
    hard = hard_mask(correct[surrogates].to_numpy() == 0, k) if len(cand) else np.zeros(0, dtype=bool)
    n_wrong = (correct[surrogates].to_numpy() == 0).sum(axis=1) if len(cand) else np.zeros(0, dtype=int)
    cols = ["sample_id", "trajectory_id", "class_id", "class_name", "shift", "kind", "seed", "scale"]
    hard_set = cand.loc[hard, cols].assign(n_wrong=n_wrong[hard].astype(int)).reset_index(drop=True)
    transfer = transfer_table(correct, surrogates, k, opts.repeats, opts.seed) if len(cand) else pd.DataFrame(columns=TRANSFER_COLUMNS)
    shared = shared_failures(cand, hard) if len(cand) else pd.DataFrame()

    result = AnalysisResult(title="Hard images (shared failures of the surrogates) and their transfer")
    buf = io.BytesIO()
    hard_set.to_parquet(buf, index=False)
    result.files[HARD_SET] = buf.getvalue()
    result.tables["transfer"] = transfer
    result.tables["shared_failures"] = shared
    exported = sheet = False
    if opts.export and ctx.read_image is not None and len(hard_set):
        result.files[f"{EXPORT_DIR}/hard_set-000000.tar"] = export_tar(hard_set, ctx.read_image)
        exported = True
    if ctx.read_image is not None and len(hard_set):
        try:
            result.files["hard_set.png"] = hard_set_sheet(hard_set, ctx.read_image)
            sheet = True
        except KeyError as err:  # a reference image that is not in the output (e.g. filtered shards)
            log.warning("hard_mining: no contact sheet: %s", err)
    rule = f"hard when >= {k} of {len(surrogates)} surrogates ({', '.join(surrogates)}) are wrong"
    if opts.reference_correct:
        rule += ", among images whose plain reference all surrogates classify correctly"
    result.json = {
        "rule": rule,
        "surrogates": surrogates,
        "k": k,
        "n_candidates": int(len(cand)),
        "n_hard": int(hard.sum()),
        "exported": exported,
        "transfer": json.loads(transfer.to_json(orient="records")),
    }
    fmt = {c: float_format(3) for c in ("acc_all", "acc_hard", "acc_random_mean", "acc_random_std", "drop_vs_random")}
    top = shared[shared["level"] == "nuisance"].head(10) if len(shared) else shared
    result.html = (
        f"<p>{rule}: <b>{int(hard.sum())}</b> hard images of {len(cand)} candidates "
        f"(<code>{HARD_SET}</code>{', export in <code>' + EXPORT_DIR + '/</code>' if exported else ''}).</p>"
        + (f"<h3>Hard images (plain reference | nuisance image; first {min(32, len(hard_set))})</h3>"
           '<img src="hard_set.png" alt="hard images">' if sheet else "")
        + "<h3>Transfer (accuracy on all candidates, the hard set, random subsets of its size)</h3>"
        + transfer.to_html(index=False, formatters=fmt, na_rep=NA, border=0)
        + "<h3>Nuisances with the most shared failures</h3>"
        + (top.to_html(index=False, border=0, float_format=float_format(3), na_rep=NA) if len(top) else "<p>none</p>")
    )
    return result
