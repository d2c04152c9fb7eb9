"""Loading the text-to-image model: the diffusers pipeline, class tokens and slider files.

The same code loads ``stabilityai/stable-diffusion-2`` from the hub on a cluster and
the tiny demo model from a local directory: ``from_pretrained`` on either, textual
inversion through diffusers' ``load_textual_inversion``, sliders through
:mod:`pipeline.models.lora`.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from pipeline.config import ClassTokens, GeneratorSpec
from pipeline.errors import CnsbenchError
from pipeline.labels import LabelSpace

HUB_ID = re.compile(r"[A-Za-z0-9][\w.\-]*/[\w.\-]+")  # matched whole (fullmatch)


def is_local_path(model: str) -> bool:
    """A model reference is a local directory unless it looks like ``org/name`` and no such path exists."""
    return os.path.exists(model) or not HUB_ID.fullmatch(model) or model.startswith((".", "/"))


def load_pipeline(model: str, dtype, device: str, text_encoder: bool = True):
    """A ``StableDiffusionPipeline`` (v-prediction for SD2) from a local directory or hub id.

    ``text_encoder=False`` leaves the model's own tokenizer and text encoder unloaded, for
    class tokens that bring their own (``text_encoder_dir``): on SD2 that saves loading
    340 M parameters that would be replaced at once.
    """
    from diffusers import StableDiffusionPipeline

    from pipeline.runtime.progress import quiet_model_libraries

    quiet_model_libraries()
    local = is_local_path(model)
    if local and not (Path(model) / "model_index.json").is_file():
        raise FileNotFoundError(
            f"generator.model: {model!r} is not a diffusers model directory (no model_index.json); "
            "give a local directory saved with save_pretrained or a hub id like 'stabilityai/stable-diffusion-2'"
        )
    pipe = StableDiffusionPipeline.from_pretrained(
        model,
        dtype=dtype,
        safety_checker=None,
        requires_safety_checker=False,
        local_files_only=local or os.environ.get("HF_HUB_OFFLINE") == "1",
        **({} if text_encoder else {"text_encoder": None, "tokenizer": None}),
    )
    pipe.set_progress_bar_config(disable=True)
    return pipe.to(device)


def ti_token(class_id: int, class_name: str) -> str:
    """Dataset-Interfaces token string of a class: ``<great white shark-2>``."""
    return f"<{class_name}-{class_id}>"


def class_token_files(spec: ClassTokens, class_ids: list[int]) -> list[str]:
    """Files the class-token source needs for these classes (for up-front checks)."""
    if spec.kind == "ti_folder":
        return [os.path.join(spec.path, f"{i}.bin") for i in class_ids]
    if spec.kind == "text_encoder_dir":
        return [
            os.path.join(spec.path, "tokens.pt"),
            os.path.join(spec.path, "tokenizer"),
            os.path.join(spec.path, "text_encoder"),
        ]
    return []


def install_class_tokens(pipe, spec: ClassTokens, class_ids: list[int], labels: LabelSpace) -> dict[int, str]:
    """Make each class's token known to the pipeline's tokenizer/text encoder; class id -> token string."""
    import torch

    if spec.kind == "none":
        return {i: labels.name(i) for i in class_ids}
    if spec.kind == "ti_folder":
        embeddings, tokens = [], []
        for i in class_ids:
            path = os.path.join(spec.path, f"{i}.bin")
            if not os.path.isfile(path):
                raise FileNotFoundError(f"generator.class_tokens: missing token file {path}")
            state = torch.load(path, map_location="cpu", weights_only=True)
            if isinstance(state, dict):
                if len(state) != 1:
                    raise CnsbenchError(f"{path}: expected one embedding, found keys {list(state)[:5]}")
                state = next(iter(state.values()))
            embeddings.append(state.reshape(-1, state.shape[-1]).squeeze(0).to(pipe.text_encoder.dtype))
            tokens.append(ti_token(i, labels.name(i)))
        new = [(t, e) for t, e in zip(tokens, embeddings) if t not in pipe.tokenizer.get_vocab()]
        if new:
            # The new rows are overwritten with the tokens' embeddings: grow the table without
            # transformers' default mean/covariance initialisation (and its notice), so
            # load_textual_inversion finds it at the size it needs.
            vectors = sum(e.shape[0] if e.ndim == 2 else 1 for _, e in new)
            pipe.text_encoder.resize_token_embeddings(len(pipe.tokenizer) + vectors, mean_resizing=False)
            pipe.load_textual_inversion([e for _, e in new], token=[t for t, _ in new])
        return dict(zip(class_ids, tokens))
    if spec.kind == "text_encoder_dir":
        from transformers import CLIPTextModel, CLIPTokenizer

        root = Path(spec.path)
        meta_path = root / "tokens.pt"
        if not meta_path.is_file():
            raise FileNotFoundError(f"generator.class_tokens: missing {meta_path}")
        meta = torch.load(meta_path, map_location="cpu", weights_only=True)
        if not isinstance(meta, dict) or "tokens" not in meta:
            raise CnsbenchError(f"{meta_path}: expected a dict with 'tokens' (and 'initializer_words')")
        token_list = list(meta["tokens"])
        if len(token_list) != len(labels):
            raise CnsbenchError(
                f"{meta_path}: expected {len(labels)} tokens (one per class of {labels.key!r}), found {len(token_list)}"
            )
        pipe.tokenizer = CLIPTokenizer.from_pretrained(root / "tokenizer")
        pipe.text_encoder = CLIPTextModel.from_pretrained(root / "text_encoder", dtype=pipe.unet.dtype).to(
            pipe.unet.device
        )
        return {i: token_list[i] for i in class_ids}
    raise CnsbenchError(f"unknown class token source {spec.kind!r}")


def slider_path(spec: GeneratorSpec, class_id: int, shift: str, class_name: str) -> str:
    """File of the (class, shift) slider in the store, from ``generator.slider_pattern``."""
    if not spec.slider_store:
        raise CnsbenchError("generator.slider_store is not set")
    from pipeline.io.fs import safe_relpath

    rel = spec.slider_pattern.format(shift=shift, class_id=class_id, class_name=class_name)
    # The file must stay inside the store whatever a class name contains ('/', '..').
    return safe_relpath(
        spec.slider_store.rstrip("/"), rel, what=f"generator.slider_pattern for ({shift}, {class_id})", follow_symlinks=True
    )
