"""A tiny LLaVA (``LlavaForConditionalGeneration``: CLIP vision tower, projector, Llama) built locally.

:func:`build_tiny_llava` writes a directory that ``AutoProcessor`` and
``AutoModelForImageTextToText.from_pretrained`` load like any released LLaVA: a word-level
tokenizer made here (its vocabulary: the words of the prompts and the answers, plus
``<image>``), a chat template (``USER: <image>\\n{text} ASSISTANT:``), a CLIP image
processor, and the model.  Random weights for the tests and the benchmark; the world's
demo model (:mod:`pipeline.demo.train.vlm`) starts from it with the world's CLIP image
tower and learns to answer.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

SPECIALS = ["<pad>", "<s>", "</s>", "<unk>", "<image>"]
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{% if message['role'] == 'user' %}USER: "
    "{% for part in message['content'] %}"
    "{% if part['type'] == 'image' %}<image>\n{% elif part['type'] == 'text' %}{{ part['text'] }}{% endif %}"
    "{% endfor %} "
    "{% else %}ASSISTANT: {% for part in message['content'] %}{{ part['text'] }}{% endfor %}</s>{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}ASSISTANT:{% endif %}"
)
_WORD = re.compile(r"<image>|</?s>|\w+|[^\w\s]")


def words_of(texts: Iterable[str]) -> list[str]:
    """The distinct lower-case words and punctuation of ``texts``, sorted."""
    return sorted({w for t in texts for w in _WORD.findall(t.lower())} - set(SPECIALS))


def make_tokenizer(vocabulary: Iterable[str]):
    """A word-level fast tokenizer over ``vocabulary`` (lower-cased, split on words and punctuation)."""
    from tokenizers import (
        Regex,
        Tokenizer,
        decoders,
        models,
        normalizers,
        pre_tokenizers,
    )
    from transformers import PreTrainedTokenizerFast

    words = words_of([*vocabulary, ", . : ?"])  # option lists are comma-separated
    roles = ["user", "assistant"]  # the chat template's; a vocabulary holding them keeps one id each
    vocab = {t: i for i, t in enumerate([*SPECIALS, *roles, *(w for w in words if w not in roles)])}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.normalizer = normalizers.Lowercase()
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.WhitespaceSplit(), pre_tokenizers.Split(Regex(r"<image>|</?s>|\w+|[^\w\s]"), behavior="isolated")]
    )
    tok.decoder = decoders.WordPiece(prefix="##", cleanup=True)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>", pad_token="<pad>",
        extra_special_tokens={"image_token": "<image>"}, padding_side="left",
    )


def tiny_llava_config(vocab_size: int, image_size: int = 32, patch_size: int = 4, vision: dict | None = None,
                      text: dict | None = None, image_token_id: int = 4):
    """A LlavaConfig of a tiny CLIP vision tower and a tiny Llama (``vision`` / ``text``: overrides)."""
    from transformers import CLIPVisionConfig, LlamaConfig, LlavaConfig

    v = CLIPVisionConfig(
        **{"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 2,
           "image_size": image_size, "patch_size": patch_size, "projection_dim": 32, **(vision or {})}
    )
    t = LlamaConfig(
        **{"vocab_size": vocab_size, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
           "num_attention_heads": 2, "num_key_value_heads": 2, "max_position_embeddings": 256,
           "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 0, **(text or {})}
    )
    return LlavaConfig(
        vision_config=v, text_config=t, image_token_index=image_token_id, vision_feature_layer=-1,
        vision_feature_select_strategy="default", projector_hidden_act="gelu",
    )


def make_processor(tokenizer, image_size: int, patch_size: int, mean: Any = None, std: Any = None):
    from transformers import CLIPImageProcessor, LlavaProcessor

    images = CLIPImageProcessor(
        size={"shortest_edge": image_size}, crop_size={"height": image_size, "width": image_size},
        do_center_crop=True, **({"image_mean": list(mean), "image_std": list(std)} if mean is not None else {}),
    )
    return LlavaProcessor(
        image_processor=images, tokenizer=tokenizer, patch_size=patch_size, vision_feature_select_strategy="default",
        chat_template=CHAT_TEMPLATE, num_additional_image_tokens=1,
    )


def build_tiny_llava(out: str | Path, vocabulary: Iterable[str], *, seed: int = 0, image_size: int = 32,
                     patch_size: int = 4, vision: dict | None = None, text: dict | None = None, model=None,
                     mean: Any = None, std: Any = None) -> Path:
    """Write a loadable tiny LLaVA to ``out`` (random weights unless ``model`` is given); returns ``out``."""
    import torch
    from transformers import LlavaForConditionalGeneration

    out = Path(out)
    tokenizer = make_tokenizer(vocabulary)
    processor = make_processor(tokenizer, image_size, patch_size, mean, std)
    if model is None:
        torch.manual_seed(seed)
        cfg = tiny_llava_config(len(tokenizer), image_size, patch_size, vision, text,
                                tokenizer.convert_tokens_to_ids("<image>"))
        model = LlavaForConditionalGeneration(cfg).eval()
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.save_pretrained(out)
    processor.save_pretrained(out)
    return out
