"""``cnsbench status``: what an output holds: done/total per stage, failures, damaged shards,
manifest problems and shards lacking a configured classifier's predictions (exit 3 when there
are any, naming what to run), the writer's lease.

A build output is counted against its config's plan and resumed with ``cnsbench build``; an
``evaluate`` output (it has ``source.json``) against the trajectories and images its source
held, and resumed with ``cnsbench evaluate`` on that source.
"""

from __future__ import annotations

import argparse


def run(args: argparse.Namespace) -> int:
    from pipeline import plan
    from pipeline.aggregate.run import evaluated_source, load_output_config, resume_command
    from pipeline.io.lease import lease_status
    from pipeline.io.rollback import pending
    from pipeline.io.shard_check import check_committed
    from pipeline.io.store import OutputStore
    from pipeline.stages.reclassify import missing_classifiers

    store = OutputStore(args.output)
    if args.roll_back:
        from pipeline.output_run import OutputRun

        with OutputRun.claim(args.output, "status --roll-back"):  # claiming rolls back an unfinished addition
            pass
    adding = pending(store)
    cfg = load_output_config(store)
    committed = check_committed(store, deep=args.verify)
    done, failed, problems = committed.done, committed.failed, committed.problems
    source = evaluated_source(store)
    # A shard lacking predictions of a classifier the config lists is not classified (a run
    # that added the classifier was cut short): the config never counts a classifier that did not run.
    names = [c.name for c in cfg.classifiers]
    sound = {m.shard: m for m in committed.sound}
    lacking = [r for r in missing_classifiers(store, names, names) if r["shard"] in sound]
    unclassified = [sound[r["shard"]] for r in lacking]
    if source is not None:  # an evaluation: its source's trajectories, each with the images it held
        total, total_images = source["trajectories"], source["images"]
        images = lambda shards: sum(m.n_samples for m in shards)  # noqa: E731
    else:
        summary = plan.summarize(cfg)
        total, total_images = summary.n_trajectories, summary.n_images
        # Each family has its own scale grid: a trajectory holds as many images as its shift's family has scales.
        n_scales = {shift: len(g.scales) for g in cfg.family_groups() for shift in g.shifts}
        images = lambda shards: sum(n_scales.get(tid.rsplit("/", 2)[0], len(cfg.benchmark.scales))  # noqa: E731
                                    for tid in {t for m in shards for t in m.trajectories} & done)
    reached_images = images(committed.sound)
    # Stages commit together per shard, so a committed trajectory has passed all three;
    # a failed one stopped at the stage its error names.
    failed_at = {s: sum(1 for e in failed.values() if e.startswith(f"[{s}]")) for s in ("generate", "filter", "classify")}

    print(f"{store.uri}")
    print(f"  lease       {lease_status(store)}")
    reached = len(done)
    short = (images(unclassified), len({t for m in unclassified for t in m.trajectories} & done))
    for stage, key in (("generated", "generate"), ("filtered", "filter"), ("classified", "classify")):
        note = f", {failed_at[key]} failed here" if failed_at[key] else ""
        n_images, n = (reached_images - short[0], reached - short[1]) if key == "classify" else (reached_images, reached)
        print(f"  {stage:<11} {n_images}/{total_images} images ({n}/{total} trajectories{note})")
    aggregated = False
    if store.exists("report/metrics.json"):
        import json

        metrics = json.loads(store.read_text("report/metrics.json"))
        # The primary family's counts at the top, every further family's under "families".
        counts = [metrics.get("counts", {})] + [f.get("counts", {}) for f in metrics.get("families", {}).values()]
        aggregated = sum(c.get("n_trajectories_total", 0) for c in counts) == len(done)
    print(f"  {'aggregated':<11} {'yes' if aggregated else 'no (run cnsbench aggregate)'}")
    redo = resume_command(store, cfg)
    if reached < total:
        print(f"  to finish:  run `{redo}` (committed shards are kept)")
    if committed.damaged:
        print(f"  damaged: {len(committed.damaged)} shard(s) not counted; run `{redo}` to move them to "
              "previous/quarantine/ and redo their trajectories")
        for shard, (_, found) in sorted(committed.damaged.items()):
            print(f"    {shard} is damaged: {'; '.join(found)}")
    if adding is not None:
        print(f"  unfinished: adding {', '.join(adding) or 'classifiers'} was cut short; run "
              f"`cnsbench status {store.uri} --roll-back` to put the output back as it was before "
              "(the next command that writes to it does the same)")
    elif lacking:
        missing = sorted({n for r in lacking for n in r["classifiers"]})
        print(f"  unclassified: {len(lacking)} shard(s) lack predictions of {', '.join(missing)}, which the config "
              f"lists; {_remedy(cfg, missing, redo)}")
    if problems:
        print(f"  problems: {len(problems)} manifest(s) not counted (the next build moves them to previous/quarantine/ and redoes their shards)")
        for p in problems:
            print(f"    {p.line()}")
    if failed:
        print(f"  failed trajectories: {len(failed)}")
        for tid, err in sorted(failed.items()):
            print(f"    {tid}: {err.splitlines()[0] if err else ''}")
    return 0 if not (failed or problems or committed.damaged or lacking or adding is not None) else 3


def _remedy(cfg, missing: list[str], redo: str) -> str:
    """What adds the missing classifiers: the resume command, or for a model held in memory
    (kind ``module``, which no config file can name) the Python call that added it."""
    held = [c.name for c in cfg.classifiers if c.name in missing and c.kind == "module"]
    if not held:
        return f"run `{redo}` to add them"
    return (f"{', '.join(held)} {'is a model' if len(held) == 1 else 'are models'} held in memory: evaluate "
            f"{'it' if len(held) == 1 else 'each'} again from Python under the same name "
            "(pipeline.evaluate(model, output, name=...))" + (f"; run `{redo}` for the others" if len(held) < len(missing) else ""))


def register(sub) -> None:
    s = sub.add_parser("status", help="done/total per stage and failed items of a build output")
    s.add_argument("output")
    s.add_argument("--verify", action="store_true", help="also check every committed file's SHA-256")
    s.add_argument("--roll-back", action="store_true",
                   help="first undo an addition of classifiers that was cut short (a killed run), under the output's lease")
    s.set_defaults(func=run)
