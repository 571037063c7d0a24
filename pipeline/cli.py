"""The ``pipeline`` command: one thin command per stage, plus listings and benchmarks.

Every stage command reads its section of ``params.yaml`` (``--params``) and applies the
options given on the command line on top. Heavy imports happen inside the commands.
"""

from __future__ import annotations

import json
import logging
import os
import sys
from pathlib import Path
from typing import Annotated

import typer
from typer.core import TyperGroup

from pipeline.cli_checks import check_device, narrowed, origin
from pipeline.cli_errors import RESUME, USER_ERRORS, fail, one_line_warning, usage_line


class _LazyBench(TyperGroup):
    """The stage commands plus ``bench``, whose module (:mod:`pipeline.perf.cli`) is
    imported only when ``bench`` is run or listed: a stage run loads no benchmark code, so
    a DVC stage depends on this module and its own stage's code only."""

    def list_commands(self, ctx) -> list[str]:
        return sorted({*super().list_commands(ctx), "bench"})

    def get_command(self, ctx, name: str):
        if name != "bench":
            return super().get_command(ctx, name)
        from pipeline.perf.cli import bench_app

        group = typer.main.get_command(bench_app)
        group.name = "bench"
        return group


app = typer.Typer(
    cls=_LazyBench,
    add_completion=False,
    no_args_is_help=True,
    help="Precompute-then-score feature cache pipeline for vision-language compositionality.",
)

DEFAULT_PARAMS = Path("params.yaml")


def _resolve_params(value: Path | None) -> Path | None:
    """``--params`` as given (a missing file is then an error, named by the config loader);
    without it ``params.yaml`` when present, else no file (every default)."""
    if value is not None:
        return value
    return DEFAULT_PARAMS if DEFAULT_PARAMS.is_file() else None


Params = Annotated[
    Path | None,
    typer.Option("--params", help="params.yaml to read the stage section from (default: ./params.yaml if present)", callback=_resolve_params),
]
Quiet = Annotated[bool, typer.Option("--quiet", help="no progress bars")]
Device = Annotated[str | None, typer.Option(help="torch device: cpu, cuda, cuda:1, ... (default: the params file's)")]


def _echo_json(obj) -> None:
    typer.echo(json.dumps(obj, indent=2, default=str))


@app.callback()
def main(verbose: Annotated[bool, typer.Option("--verbose", "-v", help="debug logging")] = False) -> None:
    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.INFO,
        format="%(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    if not verbose:
        import warnings

        warnings.formatwarning = one_line_warning


@app.command()
def world(
    params: Params = None,
    out: Annotated[str | None, typer.Option(help="output folder")] = None,
    seed: Annotated[int | None, typer.Option(help="world seed")] = None,
    quiet: Quiet = False,
) -> None:
    """Render the shapes world and write its suite manifests."""
    from pipeline.config import WorldConfig, load_config
    from stages import world as stage

    try:
        cfg = load_config(WorldConfig, params, "world", {"out": out, "seed": seed})
        _echo_json(stage.run(cfg, progress=not quiet))
    except USER_ERRORS as e:
        fail(e)


@app.command()
def toyclip(
    params: Params = None,
    steps: Annotated[int | None, typer.Option(help="training steps")] = None,
    out: Annotated[str | None, typer.Option(help="checkpoint folder")] = None,
    quiet: Quiet = False,
) -> None:
    """Train the toy CLIP on shapes-world scenes (positives + in-batch negatives only)."""
    from pipeline.config import ToyClipConfig, load_config
    from stages import toyclip as stage

    try:
        cfg = load_config(ToyClipConfig, params, "toyclip", {"steps": steps, "out": out})
        _echo_json(stage.run(cfg, progress=not quiet))
    except USER_ERRORS as e:
        fail(e)


@app.command()
def extract(
    params: Params = None,
    model: Annotated[str | None, typer.Option(help="encoder key (see `pipeline encoders`)")] = None,
    pretrained: Annotated[str | None, typer.Option(help="openai | none | /path/to/weights")] = None,
    init_seed: Annotated[int | None, typer.Option(help="seed of the random init (--pretrained none)")] = None,
    suite: Annotated[list[str] | None, typer.Option(help="suite(s) to encode (repeatable)")] = None,
    out: Annotated[str | None, typer.Option(help="store folder")] = None,
    batch_size: Annotated[int | None, typer.Option(help="images per forward pass")] = None,
    device: Device = None,
    repair: Annotated[bool, typer.Option(help="decode every chunk first and re-encode the rows of damaged or missing chunk files")] = False,
    break_lock: Annotated[bool, typer.Option(help="take over a write lock another host left behind, or the lock object a killed extract left on a remote store")] = False,
    scheduler: Annotated[str | None, typer.Option(help="dask.distributed scheduler address, or local:N for a LocalCluster of N single-threaded workers")] = None,
    quiet: Quiet = False,
) -> None:
    """Run the frozen encoder once over every image and caption into a Zarr store."""
    from pipeline.config import ExtractConfig, load_config
    from pipeline.encoders import ENCODERS
    from stages import extract as stage

    try:
        cfg = load_config(
            ExtractConfig,
            params,
            "extract",
            {"model": model, "pretrained": pretrained, "init_seed": init_seed, "suites": suite, "out": out,
             "batch_size": batch_size, "device": device},  # fmt: skip
        )
        check_device(cfg.device)
        ENCODERS.check_known([cfg.model], origin(params, "extract.model", "--model", model))
        if scheduler is not None:
            from pipeline.distributed import extract_distributed

            _echo_json(extract_distributed(cfg, scheduler, progress=not quiet, repair=repair, break_lock=break_lock))
        else:
            _echo_json(stage.run(cfg, progress=not quiet, repair=repair, break_lock=break_lock))
    except USER_ERRORS as e:
        fail(e)


@app.command()
def score(
    params: Params = None,
    variant: Annotated[list[str] | None, typer.Option(help="scorer variant(s) (see `pipeline variants`)")] = None,
    suite: Annotated[list[str] | None, typer.Option(help="suite(s) to score")] = None,
    model: Annotated[str | None, typer.Option(help="encoder whose store to read")] = None,
    device: Device = None,
    scheduler: Annotated[str | None, typer.Option(help="dask.distributed scheduler address, or local:N: one task per (variant, suite)")] = None,
    quiet: Quiet = False,
) -> None:
    """Score suites from the feature cache (never runs the backbone)."""
    from pipeline.config import ExtractConfig, ScoreConfig, load_config
    from pipeline.encoders import ENCODERS
    from stages import score as stage

    try:
        cfg = load_config(ScoreConfig, params, "score", {"variants": variant, "suites": suite, "encoder": model, "device": device})
        stage.check_names(cfg, params, "--variant" if variant else None)
        cfg = narrowed(cfg, variant, suite)
        check_device(cfg.device)
        ENCODERS.check_known([cfg.encoder], origin(params, "score.encoder", "--model", model))
        ext = load_config(ExtractConfig, params, "extract", {"model": cfg.encoder})
        records = _score_on(cfg, ext, scheduler, not quiet) if scheduler is not None else stage.run(cfg, ext, progress=not quiet)
        for rec in records:
            typer.echo(json.dumps(rec))
    except USER_ERRORS as e:
        fail(e)


def _score_on(cfg, ext, scheduler: str, progress: bool) -> list[dict]:
    """The score stage on a dask cluster: one ``pure=False`` task per (variant, suite) that the
    variant scores (:func:`stages.score.variant_suites`), each
    the stage itself narrowed to that pair (its per-seed runs and image replacements
    included), writing the same files a single process writes (relative paths made
    absolute here, so a worker started in another folder writes them where this one would)."""
    from dataclasses import replace

    from distributed import as_completed
    from tqdm import tqdm

    from pipeline.cache import open_store
    from pipeline.distributed import cluster, for_workers, worker_watch
    from stages import score as stage

    cfg, ext = for_workers(cfg), for_workers(ext)
    stage.check_selection(cfg)  # each task's own selection is a subset by construction
    store = open_store(ext)  # a missing, foreign or damaged store is refused here, before any cluster starts
    for v in cfg.seed_variants:  # and a seed variant with no seeds
        stage.seeds_to_score(v, cfg, store)

    seed_suites = set(cfg.seed_suites or cfg.suites)
    plan = stage.variant_suites(cfg, store)  # no task for a pair the variant does not score
    tasks = []
    for v in cfg.variants:
        for s in plan[v]:
            seeded = v in cfg.seed_variants and s in seed_suites
            tasks.append(replace(
                cfg, variants=[v], suites=[s], seed_variants=[v] if seeded else [], seed_suites=[s] if seeded else [],
                replacement_variants=[], replacements=list(cfg.replacements) if v in cfg.replaced else [],
            ))  # fmt: skip
    records = []
    with cluster(scheduler, quiet=not progress) as client, worker_watch(client, scheduler):
        futures = [client.submit(stage.run, t, ext, False, pure=False) for t in tasks]
        for future in tqdm(as_completed(futures), total=len(futures), desc=f"score on {scheduler}", disable=not progress):
            records += future.result()
    return records


@app.command()
def train(
    params: Params = None,
    variant: Annotated[str | None, typer.Option(help="trainable scorer variant (default: every one in train.variants)")] = None,
    steps: Annotated[int | None, typer.Option(help="optimisation steps")] = None,
    seed: Annotated[list[int] | None, typer.Option(help="training seed(s) (repeatable)")] = None,
    device: Device = None,
    quiet: Quiet = False,
) -> None:
    """Train a scorer from the feature cache (the family's objectives, dev selection)."""
    from pipeline.config import (
        ExtractConfig,
        OptionsError,
        load_config,
        load_train_config,
        train_variants,
    )
    from pipeline.scorers import SCORERS
    from pipeline.training.loop import check_trainable
    from stages import train as stage

    try:
        variants = [variant] if variant else train_variants(params)
        if not variants:
            raise ValueError(f"{params} lists no train.variants; pass --variant")
        SCORERS.check_known(variants, "--variant" if variant else f"{params}: train.variants")
        for name in variants:
            check_trainable(name)
        overrides = {"steps": steps, "seeds": seed, "device": device}
        configs = [load_train_config(params, name, overrides) for name in variants]  # every section checked first
        for cfg in configs:
            check_device(cfg.device)
            ext = load_config(ExtractConfig, params, "extract", {"model": cfg.encoder})
            try:
                _echo_json(stage.run(cfg, ext, progress=not quiet))
            except OptionsError as e:  # train.<variant>.scorer / objective: the file they come from
                raise OptionsError(f"{params}: {e}") from None
    except USER_ERRORS as e:
        fail(e)


@app.command()
def ridge(
    params: Params = None,
    lam: Annotated[float | None, typer.Option(help="ridge penalty")] = None,
) -> None:
    """Fit ridge-fgw's phrase -> object-embedding map on the training split (closed form)."""
    from pipeline.config import ExtractConfig, RidgeConfig, ScoreConfig, load_config
    from stages import ridge as stage

    try:
        cfg = load_config(RidgeConfig, params, "ridge", {"lam": lam})
        if cfg.suite in load_config(ScoreConfig, params, "score").suites:
            raise ValueError(
                f"{params}: ridge.suite = {cfg.suite} is also in score.suites: ridge-fgw would be tested on the items "
                "it was fitted on; fit it on a training split (shapes-train, coco-objects-train)"
            )
        _echo_json(stage.run(cfg, load_config(ExtractConfig, params, "extract", {"model": cfg.encoder})))
    except USER_ERRORS as e:
        fail(e)


@app.command("compare-encoders")
def compare_encoders(
    params: Params = None,
    encoder: Annotated[list[str] | None, typer.Option(help="encoder(s) to compare (repeatable; default: compare.encoders)")] = None,
    variant: Annotated[list[str] | None, typer.Option(help="variant(s) (repeatable; default: compare.variants)")] = None,
    quiet: Quiet = False,
) -> None:
    """The same variants on several encoders: for each, train it (the toy), extract, train
    the variants and score; then summarise (reports/encoders/summary.json; the report shows it)."""
    from pipeline.config import (
        CompareConfig,
        ExtractConfig,
        ParamsError,
        ScoreConfig,
        ToyClipConfig,
        load_config,
        load_train_config,
        train_variants,
    )
    from stages import compare as stage

    try:
        cfg = load_config(CompareConfig, params, "compare", {"encoders": encoder, "variants": variant})
        trainable = set(train_variants(params))
        sections = (
            load_config(ToyClipConfig, params, "toyclip"),
            load_config(ExtractConfig, params, "extract"),
            {v: load_train_config(params, v) for v in cfg.variants if v in trainable},
            load_config(ScoreConfig, params, "score"),
        )
        try:
            summary = stage.run(cfg, *sections, progress=not quiet)
        except ParamsError as e:  # compare.toyclip's overrides and training options, checked by the stage
            raise ParamsError(f"{params}: {e}") from None
        _echo_json({e: {v: r["means"] for v, r in s["variants"].items()} for e, s in summary["encoders"].items()})
    except USER_ERRORS as e:
        fail(e)


@app.command()
def report(params: Params = None) -> None:
    """Write reports/report.md with tables, CIs, figures and examples."""
    from pipeline.config import ExtractConfig, ReportConfig, ScoreConfig, load_config
    from stages import report as stage

    try:
        cfg = load_config(ReportConfig, params, "report")
        score = load_config(ScoreConfig, params, "score")
        path = stage.run(
            cfg,
            score,
            load_config(ExtractConfig, params, "extract", {"model": score.encoder}),  # the store score read
        )
        typer.echo(str(path))
    except USER_ERRORS as e:
        fail(e)


@app.command()
def manifest(
    suite: Annotated[str, typer.Option(help="suite name (see `pipeline suites`)")],
    root: Annotated[Path, typer.Option(help="folder with the official annotation files")],
    out: Annotated[str, typer.Option(help="output Parquet manifest; a folder gets <out>/<suite>.parquet")],
) -> None:
    """Build a suite's manifest from its annotation files alone (no images needed)."""
    from pipeline.benchmarks import SUITES
    from pipeline.manifests import source_hashes, write_manifest

    try:
        if not out:
            raise ValueError("--out is empty; name the manifest file to write, e.g. --out cache/manifests/<suite>.parquet")
        out = Path(out) / f"{suite}.parquet" if out.endswith(("/", os.sep)) or Path(out).is_dir() else Path(out)
        df = SUITES.get(suite).build_manifest(root)
        write_manifest(df, out, source_hashes(root), SUITES.get(suite).category_coverage(df))
        typer.echo(f"{suite}: {len(df)} items -> {out}")
    except USER_ERRORS as e:
        fail(e)


@app.command()
def manifests(params: Params = None) -> None:
    """Build every suite of manifests.roots from its official annotation files (no images)."""
    from pipeline.config import ManifestsConfig, load_config
    from stages import manifests as stage

    try:
        _echo_json(stage.run(load_config(ManifestsConfig, params, "manifests")))
    except USER_ERRORS as e:
        fail(e)


@app.command()
def images(
    params: Params = None,
    out: Annotated[str, typer.Option(help="the JSON record to write")] = "cache/images.json",
) -> None:
    """Record which images extract's suites name are present (stat only, no image opened)."""
    from pipeline.config import ExtractConfig, load_config
    from stages import images as stage

    try:
        _echo_json(stage.run(load_config(ExtractConfig, params, "extract"), out))
    except USER_ERRORS as e:
        fail(e)


@app.command()
def suites() -> None:
    """List every registered benchmark suite."""
    from pipeline.benchmarks import SUITES

    for name in SUITES.names():
        s = SUITES.get(name)
        typer.echo(f"{name:20s} {s.task:9s} {', '.join(s.metric_names)}  {s.description}")


@app.command()
def variants() -> None:
    """List every registered scorer variant."""
    from pipeline.scorers import SCORERS

    for name in SCORERS.names():
        doc = (SCORERS.get(name).__doc__ or "").strip().splitlines()
        typer.echo(f"{name:22s} {doc[0] if doc else ''}")


@app.command()
def encoders() -> None:
    """List the encoders `extract --model` accepts."""
    from pipeline.encoders import ENCODERS, open_clip_config

    for name in ENCODERS.names():
        spec = ENCODERS.get(name)
        config = open_clip_config(spec, spec.default_pretrained)
        files = f" (weights files and none: {spec.open_clip_model})" if config != spec.open_clip_model else ""
        typer.echo(f"{name:22s} open_clip {config}, early layer {spec.early_layer}, weights {spec.default_pretrained}{files}")


@app.command("probes")
def probes_command(params: Params = None) -> None:
    """Linear probes of the cached features (colour, front/behind, the text's colour) ->
    <report.out>/probes.json: what the features hold, the ceiling of what a scorer can read."""
    from pipeline.cache import open_store
    from pipeline.config import ExtractConfig, ReportConfig, load_config
    from pipeline.perf.cli import write_bench
    from pipeline.scorers.bindclip.probes import probes

    try:
        store = open_store(load_config(ExtractConfig, params, "extract"))
        missing = [s for s in ("shapes-train", "shapes-aro", "shapes-sugarcrepe") if s not in store.suites()]
        if missing:
            how = " ".join(f"--suite {s}" for s in missing)
            raise ValueError(f"the probes read the shapes world's {', '.join(missing)}, which {store.path} lacks; run `pipeline extract {how}`")
        result = probes(store)
        folder = load_config(ReportConfig, params, "report").out  # where the report reads probes.json
        write_bench("probes", f"pipeline probes --params {params}", result, folder=folder)
    except USER_ERRORS as e:
        fail(e)


def run(argv: list[str] | None = None) -> None:
    """The ``pipeline`` entry point: ``app`` with a command-line mistake (a value of the
    wrong type, an unknown option or command, a missing value) printed as one line
    ``error: ...`` naming the option, the value given and where the help is, exit 2,
    instead of typer's boxed usage block; ``pipeline`` alone still prints the help.

    The usage-error classes are taken from ``typer.BadParameter``'s bases, so they are the
    ones the installed typer raises (click's own, or the copy newer typers carry)."""
    usage_error = typer.BadParameter.__mro__[1]  # click's UsageError
    no_args_is_help = getattr(sys.modules[usage_error.__module__], "NoArgsIsHelpError", ())
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        code = app(args=argv, prog_name="pipeline", standalone_mode=False)
    except no_args_is_help as e:  # typer has printed the help already; click leaves it here
        if e.format_message().strip():
            typer.echo(e.format_message(), err=True)
        code = e.exit_code
    except usage_error as e:
        typer.secho(usage_line(e, argv), fg=typer.colors.RED, err=True)
        code = e.exit_code
    except (KeyboardInterrupt, typer.Abort):  # Ctrl-C (click turns it into Abort)
        code = 130
    if code == 130:  # Ctrl-C: newer typers catch it themselves and return 130
        typer.secho(f"interrupted: {RESUME}", fg=typer.colors.RED, err=True)
    raise SystemExit(code if isinstance(code, int) else 0)


if __name__ == "__main__":  # pragma: no cover
    run()
