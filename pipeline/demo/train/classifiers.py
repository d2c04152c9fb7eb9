"""Stage ``classifiers``: the linear model (TorchScript and torch.export), the small ResNet and the small ViT on the clean train digits."""

from __future__ import annotations

import json
from typing import Any

import torch
import torch.nn.functional as F

from pipeline.demo import world_data as W
from pipeline.demo import world_models as M
from pipeline.models.exported import export_classifier
from pipeline.demo.train.common import CLASSIFIER_SETTINGS, Ctx, cosine_lr, half_state, quantize, seeded, translate


# --------------------------------------------------------------------------- classifiers
def stage_classifiers(ctx: Ctx) -> dict[str, Any]:
    x, y, tr, te = ctx.data
    gen = seeded(10)
    xtr = W.to_rgb(quantize(x[tr]))
    ytr = y[tr]
    norm = lambda t: (t - 0.5) / 0.5  # noqa: E731  (TIMM_OVERLAY mean/std)
    out = ctx.out / "classifiers"
    out.mkdir(parents=True, exist_ok=True)
    record: dict[str, Any] = {}

    # Linear: full-batch softmax regression on grey pixels.
    s = CLASSIFIER_SETTINGS["linear"]
    lin = M.LinearDigits()
    opt = torch.optim.Adam(lin.parameters(), lr=s["lr"], weight_decay=s["weight_decay"])
    xin = norm(xtr)
    for _ in range(s["steps"]):
        loss = F.cross_entropy(lin(xin), ytr)
        opt.zero_grad()
        loss.backward()
        opt.step()
    lin.eval()
    pre = {"input_size": [3, M.RESOLUTION, M.RESOLUTION], "mean": [0.5] * 3, "std": [0.5] * 3, "interpolation": "bilinear"}
    torch.jit.save(torch.jit.script(lin), str(out / "linear.torchscript.pt"), _extra_files={"preprocess.json": json.dumps(pre)})
    # The same model as a torch.export program (classifier kind ``exported``), TorchScript's successor.
    export_classifier(lin, str(out / "linear.pt2"), pre)
    record["linear_train_loss"] = float(loss.detach())

    # Small ResNet and ViT: minibatch AdamW with +-2 px translations.
    for kind in ("cnn", "vit"):
        s = CLASSIFIER_SETTINGS[kind]
        net = M.make_timm_classifier(kind)
        opt = torch.optim.AdamW(net.parameters(), lr=s["lr"], weight_decay=s["weight_decay"])
        n = len(xtr)
        steps = s["epochs"] * (n // s["batch"])
        step = 0
        net.train()
        for _ in range(s["epochs"]):
            perm = torch.randperm(n, generator=gen)
            for lo in range(0, n - s["batch"] + 1, s["batch"]):
                idx = perm[lo : lo + s["batch"]]
                for g in opt.param_groups:
                    g["lr"] = s["lr"] * cosine_lr(step, steps, warmup=20, floor=0.02)
                loss = F.cross_entropy(net(norm(translate(xtr[idx], gen))), ytr[idx])
                opt.zero_grad()
                loss.backward()
                opt.step()
                step += 1
        net.eval()
        torch.save(half_state(net), out / f"{kind}.pth")
        record[f"{kind}_train_loss"] = float(loss)

    # Held-out accuracy through the pipeline's own classifier loaders (PIL in, as in a build).
    record["test_accuracy"] = evaluate_classifiers(ctx, W.to_pil(x[te]), y[te].tolist())
    ctx.log(f"classifiers: held-out accuracy {record['test_accuracy']}")
    return record


def pipeline_classifiers(ctx: Ctx, names: tuple[str, ...] = ("linear", "cnn", "vit")) -> dict[str, Any]:
    from pipeline.config import ClassifierSpec
    from pipeline.labels import label_space
    from pipeline.registry import CLASSIFIERS

    labels = label_space(list(W.DIGIT_NAMES))
    specs = {c["name"]: c for c in M.config_entries(str(ctx.out))["classifiers"]}
    out = {}
    for name in names:
        spec = ClassifierSpec.model_validate(specs[name])  # the spec of its kind
        out[name] = CLASSIFIERS.get(spec.kind)(spec, "cpu", labels)
    return out


def evaluate_classifiers(ctx: Ctx, images: list, labels: list[int], names=("linear", "cnn", "vit")) -> dict[str, float]:
    accs = {}
    for name, clf in pipeline_classifiers(ctx, tuple(names)).items():
        pred = clf.predict(images).argmax(dim=1)
        accs[name] = round(float((pred == torch.tensor(labels)).float().mean()), 4)
    return accs


