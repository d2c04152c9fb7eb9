"""An output's ``README.md``: the dataset card that tells the ecosystem's loaders which files are which.

An output holds Parquet tables of two schemas (``samples/``, ``predictions/``) beside its
WebDataset tars, so a loader that guesses from file extensions would mix them.  The card's
``configs:`` block (the Hugging Face Hub's dataset-card format) names one config per table:
``datasets.load_dataset(OUTPUT)`` loads ``samples`` (the default), ``load_dataset(OUTPUT,
"predictions")`` the other.  The image tars are WebDataset shards, which a folder's configs
cannot mix with Parquet ones (one builder per folder): ``load_dataset("webdataset",
data_files=f"{OUTPUT}/images/shard-*.tar")`` reads them.

Each config lists the committed files themselves (those the manifests vouch for, not a
glob) and a ``description`` carrying a fingerprint of their SHA-256s.  That is what makes
``load_dataset`` current: for a folder whose card has ``configs:``, ``datasets`` keys its
cache on the card's text (the configs' patterns and fields) and the folder's name, never on
the files, so a glob left it serving the rows of its first load after new predictions, and
two outputs of one folder name shared one cache.  With the files and their fingerprint in
the card, the cache key changes whenever the committed files do, and outputs of one name
share a cache only when their files are byte for byte the same.  The card is rewritten
with the config and after every run that commits shards (:mod:`pipeline.output_run`), so it
names the output's benchmark, config hash and current files.
"""

from __future__ import annotations

import hashlib
from typing import Iterable

from pipeline.io.manifest import ShardManifest

CARD = "README.md"

# config name -> the folder of its files (relative to the output), in the card's order
CONFIGS = {"samples": "samples", "predictions": "predictions"}


def config_files(manifests: Iterable[ShardManifest]) -> dict[str, dict[str, str]]:
    """Config name -> {committed file: its SHA-256} (the manifests' files of its folder)."""
    files: dict[str, dict[str, str]] = {c: {} for c in CONFIGS}
    for m in manifests:
        for rel, meta in m.files.items():
            for config, folder in CONFIGS.items():
                if rel.startswith(folder + "/") and rel.endswith(".parquet"):
                    files[config][rel] = str(meta.get("sha256", ""))
    return files


def _fingerprint(files: dict[str, str]) -> str:
    text = "".join(f"{rel} {sha}\n" for rel, sha in sorted(files.items()))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def dataset_card(name: str, config_hash: str, manifests: Iterable[ShardManifest] = ()) -> str:
    """The card of the output of benchmark ``name`` built with the config of hash
    ``config_hash`` whose committed shards are ``manifests``.  A table without committed
    files keeps its glob (loading it says there are none)."""
    lines = ["---", f"pretty_name: {name}", "task_categories:", "- image-classification", "tags:", "- cnsbench",
             "- robustness", "configs:"]
    for i, (config, files) in enumerate(config_files(manifests).items()):
        lines += [f"- config_name: {config}",
                  f"  description: 'cnsbench {config}: {len(files)} committed files, fingerprint {_fingerprint(files)}'",
                  "  data_files:", "  - split: test"]
        if files:
            lines += ["    path:"] + [f"    - {rel}" for rel in sorted(files)]
        else:
            lines.append(f"    path: {CONFIGS[config]}/shard-*.parquet")
        if i == 0:
            lines.append("  default: true")
    lines += [
        "---", "",
        f"# {name}", "",
        f"A cnsbench benchmark output (config hash `{config_hash}`; the config is `config.yaml`).", "",
        "- `samples` (default): one row per image: `sample_id`, `trajectory_id`, `class_id`, `class_name`, `seed`,",
        "  `shift`, `scale`, the filter's scores and `kept`.",
        "- `predictions`: one row per (image, classifier): `sample_id`, `classifier`, `top1`, `top5`, `p_true`,",
        "  `correct`; join it to `samples` on `sample_id`.",
        "- `images/shard-*.tar`: WebDataset shards, `<sample_id>.png` and `<sample_id>.json` (`label`, `scale`,",
        "  `kept`, ...): `load_dataset(\"webdataset\", data_files=\"images/shard-*.tar\")`.",
        "",
        "Only shards listed in `manifest/` are committed; `pipeline.open_output(path)` reads those alone",
        "(see cnsbench's docs/python.md).",
        "",
    ]
    return "\n".join(lines)
