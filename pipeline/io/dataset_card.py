"""An output's ``README.md``: the dataset card that tells the ecosystem's loaders which files are which.

An output holds Parquet tables of two schemas (``samples/``, ``predictions/``) beside its
WebDataset tars, so a loader that guesses from file extensions would mix them.  The card's
``configs:`` block (the Hugging Face Hub's dataset-card format) names one config per table:
``datasets.load_dataset(OUTPUT)`` loads ``samples`` (the default), ``load_dataset(OUTPUT,
"predictions")`` the other.  The image tars are WebDataset shards, which a folder's configs
cannot mix with Parquet ones (one builder per folder): ``load_dataset("webdataset",
data_files=f"{OUTPUT}/images/shard-*.tar")`` reads them.  Rewritten with the
config, so it always names the output's benchmark and config hash.
"""

from __future__ import annotations

CARD = "README.md"

# config name -> the files it reads (relative to the output), in the card's order
CONFIGS = {
    "samples": "samples/shard-*.parquet",
    "predictions": "predictions/shard-*.parquet",
}


def dataset_card(name: str, config_hash: str) -> str:
    """The card of the output of benchmark ``name`` built with the config of hash ``config_hash``."""
    lines = ["---", f"pretty_name: {name}", "task_categories:", "- image-classification", "tags:", "- cnsbench",
             "- robustness", "configs:"]
    for i, (config, files) in enumerate(CONFIGS.items()):
        lines += [f"- config_name: {config}", "  data_files:", "  - split: test", f"    path: {files}"]
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
