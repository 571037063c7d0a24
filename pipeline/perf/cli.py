"""``pipeline bench …``: one command per measurement behind the README's and the report's
figures, each writing ``reports/bench/<name>.json`` (the command that made it and its
results) for the report's performance sections. Heavy imports happen inside the commands.

Option values the benches cannot run with are command-line mistakes, refused while the
options are parsed, before any bench sets torch's threads or builds a tensor: ``--threads``
outside 1 to :data:`pipeline.config.MAX_THREADS` (the stage configs' cap; 10**5 threads
exhaust OpenMP's memory or crash the solvers), an empty ``--out`` (which would write into the
current folder) and counts below 1.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Annotated

import typer

from pipeline.config import MAX_THREADS

bench_app = typer.Typer(add_completion=False, no_args_is_help=True, help="Measurements behind the README/report figures.")
DEFAULT_OUT = "reports/bench"  # the shapes report's bench folder (report.out / "bench")
OUT = {"folder": DEFAULT_OUT}  # this run's --out
# Every bench's --threads: torch intra-op threads, capped as the stage configs' `threads` are.
Threads = Annotated[int, typer.Option(min=1, max=MAX_THREADS, help="torch intra-op threads (at most the free cores)")]


def one_line(command):
    """A bench command whose user errors (an unknown model, a folder that is a file, a
    missing params file) print one ``error:`` line and exit 1, as every pipeline command's."""

    @functools.wraps(command)
    def run(*args, **kwargs):
        from pipeline.cli_errors import USER_ERRORS, fail

        try:
            return command(*args, **kwargs)
        except USER_ERRORS as e:
            fail(e)

    return run


def not_empty(out: str) -> str:
    """``bench --out``, refused when empty: ``""`` would write into the current folder
    (``extract --out ""`` is refused too)."""
    if not out.strip():
        raise typer.BadParameter(f"is empty: give the folder the <name>.json files go in (default {DEFAULT_OUT})")
    return out


@bench_app.callback()
def bench_options(
    out: Annotated[str, typer.Option("--out", callback=not_empty, help="folder of the <name>.json files: the report's out folder + /bench (the real report: ../reports/real/bench from real/)")] = DEFAULT_OUT,
) -> None:
    """Measurements behind the README/report figures."""
    OUT["folder"] = out


def write_bench(name: str, command: str, results: dict, folder: str | None = None) -> None:
    """Write ``results`` and the command that made them to ``<folder>/<name>.json`` (default:
    ``--out``) and echo them; a command run with ``--out`` records it."""
    from pipeline.perf.common import write_bench as write

    if folder is None:
        folder = OUT["folder"]
        if folder != DEFAULT_OUT:
            command = command.replace("pipeline bench ", f"pipeline bench --out {folder} ", 1)
    out = write(name, command, results, folder)
    typer.echo(json.dumps(results, indent=2, default=str))
    typer.echo(f"-> {out}", err=True)


@bench_app.command("extract")
@one_line
def bench_extract(
    toy_images: Annotated[int, typer.Option(min=1, help="images for the toy encoder")] = 512,
    vit_images: Annotated[int, typer.Option(min=0, help="images for ViT-L-14-336 (0 = skip)")] = 8,
    scheduler: Annotated[list[str] | None, typer.Option(help="instead: distributed throughput per scheduler (repeatable, e.g. local:1 local:2)")] = None,
    repeats: Annotated[int, typer.Option(min=1, help="with --scheduler: runs of each scheduler (the median speed-up is reported)")] = 3,
) -> None:
    """Extract wall time vs a bare forward pass (toy and ViT-L-14-336, random init); with
    --scheduler, distributed extract throughput against the single process (identical stores)."""
    from pipeline.perf.extract import extract_overhead, extract_scaling

    if scheduler:
        flags = " ".join(f"--scheduler {s}" for s in scheduler)
        write_bench("extract-distributed", f"pipeline bench extract --toy-images {toy_images} {flags} --repeats {repeats}",
                     extract_scaling(toy_images, tuple(scheduler), repeats=repeats))  # fmt: skip
        return

    results = {"toy": extract_overhead("toy", toy_images, batch_size=64)}
    if vit_images:
        results["ViT-L-14-336"] = extract_overhead("ViT-L-14-336", vit_images, batch_size=4, repeats=1)
    write_bench("extract", f"pipeline bench extract --toy-images {toy_images} --vit-images {vit_images}", results)


@bench_app.command("cli")
@one_line
def bench_cli(
    model: Annotated[str, typer.Option(help="encoder (random init saved as a weights file)")] = "ViT-B-32",
    items: Annotated[int, typer.Option(min=1, help="SugarCrepe-style items scored")] = 100,
    repeats: Annotated[int, typer.Option(min=1, help="timed calls (median)")] = 3,
) -> None:
    """One `pipeline score` call against its scoring time: imports, params, store open and fingerprint (goal: <= 3 s)."""
    from pipeline.perf.overhead import score_overhead
    from stages import score as stage

    write_bench("cli", f"pipeline bench cli --model {model} --items {items} --repeats {repeats}", score_overhead(stage.run, model, items, repeats))


@bench_app.command("scoring")
@one_line
def bench_scoring(
    params: Annotated[Path | None, typer.Option(help="params.yaml (score.checkpoints, score.batch_size, train.<variant>.scorer; default: ./params.yaml if present)")] = None,
    items: Annotated[int, typer.Option(min=1, help="items (an image, two captions) for the toy encoder")] = 500,
    vit_items: Annotated[int, typer.Option(min=0, help="items for ViT-L-14-336 at random init (0 = skip)")] = 8,
    variants: Annotated[list[str] | None, typer.Option(help="scorer variants (repeatable; default: clip bindclip global-m flowclip flowclip-cimr)")] = None,
    threads: Threads = 2,
    quiet: Annotated[bool, typer.Option("--quiet", help="no progress bars")] = False,
) -> None:
    """Each scorer from the cache vs re-encoding batched as CLIP_benchmark does (toy, ViT-L-14-336)."""
    from pipeline.perf.scoring import VARIANTS
    from pipeline.perf.scoring import bench_scoring as run_bench

    variants = variants or list(VARIANTS)
    from pipeline.cli import _resolve_params  # loaded: it registered this command

    params = _resolve_params(params)  # ./params.yaml when present, as `pipeline score`
    flags = " ".join(f"--variants {v}" for v in variants)
    cmd = f"pipeline bench scoring{f' --params {params}' if params else ''} --items {items} --vit-items {vit_items} {flags} --threads {threads}"
    write_bench("scoring", cmd, run_bench(params, items, vit_items, variants, threads, progress=not quiet))


@bench_app.command("rerank")
@one_line
def bench_rerank(
    queries: Annotated[int, typer.Option(min=1, help="queries reranked per variant")] = 200,
    objects: Annotated[int, typer.Option(min=1, help="objects per query and per image")] = 4,
    dim: Annotated[int, typer.Option(min=1, help="joint-space dimension (toy: 128)")] = 128,
    threads: Threads = 2,
) -> None:
    """Geometry-aware reranking cost: ms per query at K = 20, growth with K and objects, FGW batched vs POT's loop."""
    from pipeline.perf.rerank import bench_rerank as run_bench

    cmd = f"pipeline bench rerank --queries {queries} --objects {objects} --dim {dim} --threads {threads}"
    write_bench("rerank", cmd, run_bench(queries=queries, objects=objects, dim=dim, threads=threads))


@bench_app.command("fgw")
@one_line
def bench_fgw(
    problems: Annotated[int, typer.Option(min=1, help="FGW problems per case")] = 4000,
    pot_batch_problems: Annotated[int, typer.Option(min=1, help="problems POT's batched entropic solver is timed on")] = 1000,
    threads: Threads = 2,
) -> None:
    """Batched exact FGW against POT's per-problem fused_gromov_wasserstein2 and its batched entropic solver, on equal problems."""
    from pipeline.perf.fgw import bench_fgw as run_bench

    cmd = f"pipeline bench fgw --problems {problems} --pot-batch-problems {pot_batch_problems} --threads {threads}"
    write_bench("fgw", cmd, run_bench(n_problems=problems, pot_batch_subset=pot_batch_problems, threads=threads))


@bench_app.command("memory")
@one_line
def bench_memory(
    sizes: Annotated[list[int] | None, typer.Option(min=1, help="image counts (repeatable)")] = None,
) -> None:
    """Peak memory of extract as the number of images grows."""
    from pipeline.perf.extract import extract_memory

    sizes = sizes or [256, 1024, 4096]
    flags = " ".join(f"--sizes {n}" for n in sizes)
    write_bench("memory", f"pipeline bench memory {flags}", extract_memory(sizes))


@bench_app.command("sinkhorn")
@one_line
def bench_sinkhorn(
    problems: Annotated[int, typer.Option(min=1, help="number of OT problems")] = 256,
    rows: Annotated[int, typer.Option(min=1, help="rows per problem")] = 64,
    cols: Annotated[int, typer.Option(min=1, help="columns per problem")] = 1153,
    pot_subset: Annotated[int, typer.Option(min=0, help="problems POT's loop is timed on (0 = all)")] = 0,
    batch_block: Annotated[int, typer.Option(min=-1, help="our solver's problems per block (-1 = automatic: cache-sized on CPU; 0 = one block)")] = -1,
) -> None:
    """Batched log-domain Sinkhorn vs POT's per-problem loop, equal work and results."""
    from pipeline.perf.sinkhorn import bench_sinkhorn as run_bench

    kwargs = {"n_problems": problems, "n": rows, "m": cols, "batch_block": None if batch_block < 0 else batch_block}
    if pot_subset:
        kwargs["pot_subset"] = pot_subset
    cmd = f"pipeline bench sinkhorn --problems {problems} --rows {rows} --cols {cols} --pot-subset {pot_subset} --batch-block {batch_block}"
    write_bench("sinkhorn", cmd, run_bench(**kwargs))
