"""How a vision-language model is asked about an image and how its answer is scored.

A protocol turns (image's true class, the class names, an optional ranking of classes by
another classifier, an optional question from a released ``questions/*.csv``) into a
:class:`Question` (the prompt and the options offered), and a free-text answer into a
:class:`Scored` verdict: ``TRUE`` (names the true class only), ``FALSE`` (names a wrong
option only), or an exclusion: ``BOTH`` (several options) or ``NEITHER`` (none).
Excluded answers count neither way: accuracy is TRUE / (TRUE + FALSE), as ImageNet-D's.

Three protocols (``pipeline.registry.VQA_PROTOCOLS``), chosen per classifier by ``protocol.kind``:

``two_choice``       ImageNet-D's VQA protocol (``LLaVA/llava/serve/eval_imagenet_d.py`` and
                     ``LLaVA/compute_accuracy.py`` of chenshuang-zhang/imagenet_d): the
                     distractor is the release's (``questions``: CLIP's top-1 guess, or its
                     top-2 when the top-1 is the true class), a classifier's of the pool by
                     the same rule, or a random class; the prompt offers the true class
                     first, then the distractor; sampling at temperature 0.2, top-k 50; an
                     option is named when its name or one of its synonyms
                     (:data:`IMAGENET_D_SYNONYMS`) occurs in the lower-cased answer (a
                     substring, as the original); pen / can opener and plate / drying rack
                     for plates, where one name contains the other, are decided by the
                     longer name.
``multiple_choice``  k options: the truth and k-1 distractors from a classifier's ranking
                     (then the label space) or from the label space alone, in an order
                     seeded by the sample id.
``open``             a free answer, matched to every class name and its synonyms.

The last two match names as whole words (an optional plural ``s`` / ``es``): "An open
laptop." names "laptop", not "pen".

Distractor sources (``distractors``), explicit: ``questions`` (the release's
``questions/*.csv``; an image without a question is not asked and is excluded as
:data:`UNASKED`), ``classifier:NAME`` (a ranking classifier of the pool) or ``random``
(seeded by the sample id).  A bare classifier name is read as ``classifier:NAME`` and
``labels`` as ``random``; the resolved config records the explicit form.

Nothing here imports torch; a config's protocol entry is filled in and checked at parse time by
:func:`pipeline.config.vqa.resolve_protocol`.
"""

from __future__ import annotations

import hashlib
import random
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from pipeline.config.vqa import (  # noqa: F401 (the entry's checks, at parse time: pipeline.config.vqa)
    CLASSIFIER,
    DISTRACTOR_FILE,
    RANDOM,
    ProtocolError,
    check_distractor_sources,
    distractor_classifier,
    resolve_protocol,
)
from pipeline.registry import VQA_PROTOCOLS

# The released category names (``category_words`` of pipeline.labels.imagenet_d) -> other names an
# answer may use for them, as compute_accuracy.py's word_mapping_dict.
IMAGENET_D_SYNONYMS: dict[str, tuple[str, ...]] = {
    "dishcloth": ("dishrag",),
    "weight (exercise)": ("dumbbell", "weight"),
    "nail (fastener)": ("nail",),
    "tv": ("television",),
    "iron (for clothes)": ("iron",),
    "t shirt": ("t-shirt", "shirt"),
    "laptop (open)": ("laptop",),
    "dress shoe (men)": ("dress shoe",),
    "binder (closed)": ("binder",),
    "portable heater": ("heater",),
    "computer mouse": ("mouse",),
    "still camera": ("camera",),
    "lampshade": ("lamp shade",),
    "trash bin": ("trash can",),
    "winter glove": ("glove",),
    "band aid": ("band-aid", "bandaid"),
    "toilet paper roll": ("roll of toilet paper",),
    "pill bottle": ("pill",),
    "soup bowl": ("bowl of soup",),
    "water bottle": ("bottle of water",),
    "pop can": ("can of",),
    "weight scale": ("scale",),
    "sandal": ("flip flop",),
    "swimming trunks": ("swimming trunk",),
    "bread loaf": ("bread",),
    "coffee or french press": ("coffee press", "french press", "coffee machine", "coffee maker"),
    "mixing or salad bowl": ("mixing bowl", "salad bowl"),
    "alarm clock": ("clock",),
    "wheel": ("bicycle wheel",),
    "ladle": ("spoon",),
    "matchstick": ("match",),
    "cellphone": ("cell phone", "mobile phone"),
}

# (truth, distractor) pairs where the shorter name is inside the longer one ("pen" in "can
# opener", "plate" in "drying rack for plates"): the longer name is tested first.
_DISTRACTOR_FIRST = {("pen", "can opener"), ("plate", "drying rack for plates")}
_TRUTH_FIRST = {(b, a) for a, b in _DISTRACTOR_FIRST}

TRUE, FALSE, BOTH, NEITHER = "TRUE", "FALSE", "BOTH", "NEITHER"
UNASKED = "UNASKED"  # no question could be asked (``questions`` and no released question for the image)
EXCLUDED = (BOTH, NEITHER, UNASKED)
TOP_K = 50  # transformers' default top-k, which eval_imagenet_d.py samples with

IMAGENET_D_PROMPT = "What is the main object in this image? Choose from the following list: {options}."
OPEN_PROMPT = "What is the main object in this image? Answer with its name."


@dataclass(frozen=True)
class Question:
    """What one image is asked: the prompt, the class ids offered (in prompt order) and their names."""

    prompt: str
    truth: int
    truth_name: str
    options: tuple[int, ...] = ()
    option_names: tuple[str, ...] = ()


@dataclass(frozen=True)
class Scored:
    """One answer's verdict and the class it names (-1 when excluded)."""

    verdict: str
    chosen: int

    @property
    def excluded(self) -> bool:
        return self.verdict in EXCLUDED

    @property
    def correct(self) -> bool | None:
        """True / False, None for an excluded answer (it counts neither way)."""
        return None if self.excluded else self.verdict == TRUE


def sample_seed(sample_id: str, salt: str = "") -> int:
    """A 63-bit seed from a sample id: the same image gets the same draws in every run."""
    return int.from_bytes(hashlib.sha256(f"{salt}{sample_id}".encode()).digest()[:8], "big") >> 1


def synonyms_of(table: dict[str, tuple[str, ...]], name: str) -> tuple[str, ...]:
    return table.get(name.lower(), ())


def names_option(name: str, answer: str, table: dict[str, tuple[str, ...]]) -> bool:
    """compute_accuracy.py's test: the name, or one of its synonyms, occurs in the lower-cased answer."""
    text = answer.lower()
    return name.lower() in text or any(s in text for s in synonyms_of(table, name))


def two_choice_verdict(truth: str, distractor: str, answer: str, table: dict[str, tuple[str, ...]]) -> str:
    """ImageNet-D's rule for one answer to "... {truth}, {distractor}." -> TRUE / FALSE / BOTH / NEITHER."""
    t = names_option(truth, answer, table)
    d = names_option(distractor, answer, table)
    pair = (truth.lower(), distractor.lower())
    if pair in _DISTRACTOR_FIRST:  # the truth's name is inside the distractor's
        return FALSE if d else TRUE if t else NEITHER
    if pair in _TRUTH_FIRST:  # the distractor's name is inside the truth's
        return TRUE if t else FALSE if d else NEITHER
    if t and d:
        return BOTH
    return TRUE if t else FALSE if d else NEITHER


def named_among(answer: str, names: Sequence[str], table: dict[str, tuple[str, ...]]) -> list[int]:
    """Indices of ``names`` the answer names, each as whole words (an optional plural ``s`` or
    ``es``): "An open laptop." does not name "pen".  Longer names are matched first and their
    text removed, so a name inside another ("pen" in "can opener") is only named on its own."""
    text = answer.lower()
    terms = sorted(
        ((term.lower(), i) for i, n in enumerate(names) for term in (n, *synonyms_of(table, n))),
        key=lambda t: -len(t[0]),
    )
    hit: set[int] = set()
    for term, i in terms:
        if not term:
            continue
        word = re.compile(rf"(?<!\w){re.escape(term)}(?:e?s)?(?!\w)")
        if word.search(text):
            hit.add(i)
            text = word.sub("\0", text)
    return sorted(hit)


def _pick_distractors(truth: int, ranked: Sequence[int] | None, n_classes: int, k: int, rng: random.Random) -> list[int]:
    """``k`` distinct wrong classes: first from ``ranked`` (best first), then at random from the space."""
    out: list[int] = []
    for c in ranked or ():
        if c != truth and c >= 0 and c not in out:
            out.append(int(c))
        if len(out) == k:
            return out
    rest = [c for c in range(n_classes) if c != truth and c not in out]
    return out + rng.sample(rest, min(k - len(out), len(rest)))


# --------------------------------------------------------------------------- protocols
class Protocol:
    """Base: parameters (``params``, resolved with defaults) plus :meth:`ask` and :meth:`score`."""

    kind: str = ""
    defaults: ClassVar[dict[str, Any]] = {}

    def __init__(self, params: dict[str, Any]) -> None:
        self.params = params
        self.synonyms: dict[str, tuple[str, ...]] = _synonym_table(params.get("synonyms"))

    @property
    def temperature(self) -> float:
        return float(self.params["temperature"])

    @property
    def max_new_tokens(self) -> int:
        return int(self.params["max_new_tokens"])

    @property
    def top_k(self) -> int:
        return int(self.params["top_k"])

    @property
    def distractors(self) -> str | None:
        return self.params.get("distractors")

    def ask(self, truth: int, names: Sequence[str], sample_id: str, ranked: Sequence[int] | None = None,
            released: dict[str, Any] | None = None) -> Question | None:  # pragma: no cover - overridden
        """The question for one image; None when it cannot be asked (``questions`` and no
        released question for it): the image is then excluded as :data:`UNASKED`."""
        raise NotImplementedError

    def score(self, q: Question, answer: str) -> Scored:  # pragma: no cover - overridden
        raise NotImplementedError

    def _choice(self, q: Question, answer: str) -> Scored:
        hit = named_among(answer, q.option_names, self.synonyms)
        if len(hit) != 1:
            return Scored(BOTH if hit else NEITHER, -1)
        chosen = q.options[hit[0]]
        return Scored(TRUE if chosen == q.truth else FALSE, chosen)


class TwoChoice(Protocol):
    kind = "two_choice"
    defaults: ClassVar[dict[str, Any]] = {
        "prompt": IMAGENET_D_PROMPT,
        "distractors": None,
        "order": "original",
        "temperature": 0.2,
        "top_k": TOP_K,
        "max_new_tokens": 512,
        "synonyms": "imagenet_d",
    }

    def ask(self, truth, names, sample_id, ranked=None, released=None) -> Question | None:
        source = self.distractors
        if source == DISTRACTOR_FILE:
            if released is None:
                return None
            # The release's question: categories as the file spells them, its rule for the distractor.
            truth_name = str(released["gt_category"])
            top1, top2 = str(released["top1_pred_cate"]), str(released["top2_pred_cate"])
            dname = top1 if top1 != truth_name else top2
            lookup = {n.lower(): i for i, n in enumerate(names)}
            distractor = lookup.get(dname.lower(), -1)
        else:
            if source != RANDOM and ranked is None:
                raise ProtocolError(f"two_choice: no ranking from the distractor classifier for {sample_id}")
            rng = random.Random(sample_seed(sample_id))
            distractor = _pick_distractors(truth, ranked if source != RANDOM else None, len(names), 1, rng)[0]
            truth_name, dname = names[truth], names[distractor]
        pair = [(truth, truth_name), (distractor, dname)]
        if self.params["order"] == "shuffled":
            random.Random(sample_seed(sample_id, "order")).shuffle(pair)
        prompt = self.params["prompt"].format(options=", ".join(n for _, n in pair))
        return Question(prompt, truth, truth_name, tuple(c for c, _ in pair), tuple(n for _, n in pair))

    def score(self, q: Question, answer: str) -> Scored:
        i = q.options.index(q.truth) if q.truth in q.options else q.option_names.index(q.truth_name)
        dname = q.option_names[1 - i]
        verdict = two_choice_verdict(q.truth_name, dname, answer, self.synonyms)
        chosen = {TRUE: q.truth, FALSE: q.options[1 - i]}.get(verdict, -1)
        return Scored(verdict, chosen)


class MultipleChoice(Protocol):
    kind = "multiple_choice"
    defaults: ClassVar[dict[str, Any]] = {
        "prompt": IMAGENET_D_PROMPT,
        "k": 4,
        "distractors": RANDOM,
        "order": "shuffled",
        "temperature": 0.2,
        "top_k": TOP_K,
        "max_new_tokens": 512,
        "synonyms": "imagenet_d",
    }

    def ask(self, truth, names, sample_id, ranked=None, released=None) -> Question:
        rng = random.Random(sample_seed(sample_id))
        wrong = _pick_distractors(truth, ranked if self.distractors != RANDOM else None, len(names),
                                  int(self.params["k"]) - 1, rng)
        options = [truth, *wrong]
        if self.params["order"] == "shuffled":
            random.Random(sample_seed(sample_id, "order")).shuffle(options)
        option_names = tuple(names[c] for c in options)
        prompt = self.params["prompt"].format(options=", ".join(option_names))
        return Question(prompt, truth, names[truth], tuple(options), option_names)

    def score(self, q: Question, answer: str) -> Scored:
        return self._choice(q, answer)


class Open(Protocol):
    kind = "open"
    defaults: ClassVar[dict[str, Any]] = {
        "prompt": OPEN_PROMPT, "temperature": 0.2, "top_k": TOP_K, "max_new_tokens": 512, "synonyms": "imagenet_d",
    }

    def ask(self, truth, names, sample_id, ranked=None, released=None) -> Question:
        return Question(self.params["prompt"], truth, names[truth], tuple(range(len(names))), tuple(names))

    def score(self, q: Question, answer: str) -> Scored:
        return self._choice(q, answer)


def _synonym_table(value: Any) -> dict[str, tuple[str, ...]]:
    if value in (None, "none"):
        return {}
    if value == "imagenet_d":
        return dict(IMAGENET_D_SYNONYMS)
    return {str(k).lower(): tuple(str(s).lower() for s in v) for k, v in dict(value).items()}


def build_protocol(params: dict[str, Any]) -> Protocol:
    """The protocol object of a resolved entry (:func:`resolve_protocol`)."""
    return VQA_PROTOCOLS.get(params["kind"])(params)
