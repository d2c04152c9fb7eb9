"""``cnsbench prefetch``: download every hub artefact a config names into the standard caches."""

from __future__ import annotations

import argparse

from pipeline.cli.options import add_set_argument, load_cli_config


def run(args: argparse.Namespace) -> int:
    from pipeline.assets.hub import hub_artefacts, hub_id_problems, offline

    cfg = load_cli_config(args)
    bad = hub_id_problems(cfg)
    if bad:  # nothing to fetch for a name that is not one
        print(f"config {args.config}: {len(bad)} problem(s):")
        for p in bad:
            print(f"  - {p}")
        return 2
    artefacts = hub_artefacts(cfg)
    todo = [a for a in artefacts if args.all or not a.cached]
    print(f"config {args.config}: {len(artefacts)} hub artefact(s), {len(todo)} to fetch")
    if not todo:
        return 0
    if offline():
        print("offline (HF_HUB_OFFLINE is set, or huggingface.co cannot be reached): would fetch")
        for a in todo:
            print(f"  {a.line()}")
        print("run this command on a node with internet, then copy or share its caches (HF_HOME, TORCH_HOME)")
        return 2
    failed = 0
    for a in todo:
        print(f"  fetching {a.line()}", flush=True)
        try:
            a.fetch()
        except Exception as err:  # noqa: BLE001 - report every artefact, then fail
            failed += 1
            print(f"    failed: {type(err).__name__}: {err}")
    print(f"fetched {len(todo) - failed} of {len(todo)}" + (f"; {failed} failed" if failed else ""))
    return 1 if failed else 0


def register(sub) -> None:
    s = sub.add_parser(
        "prefetch",
        help="download the hub models a config names (SD2, filter, classifiers) into the standard caches",
        description="Fetch every hub artefact of the config that is not cached here, through the libraries that "
        "load it (Hugging Face hub cache, open_clip, timm, torch hub), so a build can then run offline. "
        "Offline it lists what it would fetch and exits 2.",
    )
    s.add_argument("config")
    add_set_argument(s)
    s.add_argument("--all", action="store_true", help="fetch cached artefacts again too")
    s.set_defaults(func=run)
