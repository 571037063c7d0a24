"""Bad inputs of ``pipeline compare-encoders`` and ``pipeline bench`` a new user found: each
is refused with one line naming the input and what is expected, before any encoder is
trained or extracted and before a bench sets torch's threads."""

from __future__ import annotations

import pytest
import torch
import yaml

from pipeline.config import MAX_THREADS, CompareConfig, ToyClipConfig
from tests.test_bad_inputs import cli, refused

pytestmark = pytest.mark.bad_input

TOY = {"steps": 3, "pool_size": 16, "batch_size": 8, "colourless_steps": 0, "warmup": 0}  # a valid override


@pytest.fixture
def no_work(monkeypatch):
    """Make any encoder work (toy training, extraction) and any bench run (torch's threads
    set, a bench function called) fail the test at once: a refusal must come first."""
    import pipeline.encoders.toyclip
    import pipeline.perf.fgw
    import pipeline.perf.rerank
    import pipeline.perf.scoring
    import pipeline.perf.sinkhorn
    import stages.extract

    def started(*args, **kwargs):
        raise AssertionError("work started before the bad input was refused")

    monkeypatch.setattr(pipeline.encoders.toyclip, "train_toyclip", started)
    monkeypatch.setattr(stages.extract, "run", started)
    monkeypatch.setattr(torch, "set_num_threads", started)
    for module, name in (
        (pipeline.perf.rerank, "bench_rerank"),
        (pipeline.perf.fgw, "bench_fgw"),
        (pipeline.perf.scoring, "bench_scoring"),
        (pipeline.perf.sinkhorn, "bench_sinkhorn"),
    ):
        monkeypatch.setattr(module, name, started)


def entry_point(args: list[str], capsys) -> tuple[int, str]:
    """``pipeline ARGS`` through the installed entry point (``cli.run``, which turns a
    command-line mistake into one line); its exit code and its one ``error:`` line."""
    from pipeline.cli import run

    with pytest.raises(SystemExit) as exit_info:
        run(args)
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and err.startswith("error: "), err
    assert "Traceback" not in err and "╭" not in err
    return exit_info.value.code, err.strip()


@pytest.mark.parametrize(
    ("override", "names"),
    [
        ({**TOY, "steps": -5}, ["compare.toyclip.steps = -5", "greater than or equal to 0"]),
        ({"stepz": 2}, ["unknown key compare.toyclip.stepz", "steps"]),
        ({"model": "toy-vit"}, ["compare.toyclip.model = 'toy-vit'", "set per encoder"]),
        ({"out": "elsewhere"}, ["compare.toyclip.out = 'elsewhere'", "set per encoder"]),
        ({"lr": "1e-3"}, ["compare.toyclip.lr = '1e-3'", "a valid number"]),
        ({"threads": MAX_THREADS + 1}, [f"compare.toyclip.threads = {MAX_THREADS + 1}", f"less than or equal to {MAX_THREADS}"]),
    ],
    ids=["negative-steps", "unknown-key", "model", "out", "number-as-text", "threads"],
)
def test_compare_toyclip_overrides_are_refused_before_any_encoder_work(override, names, tmp_path, monkeypatch, no_work):
    """``compare.toyclip`` is checked as the ``toyclip`` section is (no toy "trained" with
    -5 steps, no TypeError), before the first encoder: the toy encoder comes second here,
    after one whose extraction would otherwise run first."""
    monkeypatch.chdir(tmp_path)
    compare = {"encoders": ["tiny-vit", "toy-small"], "pretrained": {"tiny-vit": "none"}, "reuse_pipeline": False,
               "variants": ["clip"], "suites": ["shapes-aro"], "toyclip": override}  # fmt: skip
    (tmp_path / "params.yaml").write_text(yaml.safe_dump({"compare": compare}))
    refused(cli("compare-encoders", "--params", "params.yaml", "--quiet"), "error: params.yaml: ", *names)
    assert not (tmp_path / "cache").exists()


def test_compare_toyclip_overrides_apply_over_the_toyclip_section():
    """A valid override replaces its keys only; the rest stays the ``toyclip`` section's."""
    from stages.compare import toy_settings

    toy = toy_settings(CompareConfig(toyclip={"steps": 3, "lr": 1e-3}), ToyClipConfig(seed=7, pool_size=16, batch_size=8))
    assert (toy.steps, toy.lr, toy.seed, toy.pool_size, toy.model) == (3, 1e-3, 7, 16, "toy-vit")


@pytest.mark.parametrize("command", [["rerank", "--queries", "2", "--objects", "2", "--dim", "16"],
                                     ["fgw", "--problems", "2", "--pot-batch-problems", "1"], ["scoring"]])  # fmt: skip
@pytest.mark.parametrize("threads", [0, MAX_THREADS + 1, 100000])
def test_bench_threads_outside_one_to_max_threads_are_refused_before_torch(command, threads, tmp_path, capsys, no_work):
    """``libgomp: Out of memory`` or a segfault before: every bench's ``--threads`` is capped
    at the stage configs' ``MAX_THREADS`` while the options are parsed."""
    code, err = entry_point(["bench", "--out", str(tmp_path), *command, "--threads", str(threads)], capsys)
    assert code == 2
    assert "'--threads'" in err and f"(given: '{threads}')" in err and f"pipeline bench {command[0]} --help" in err
    assert (f"less than or equal to {MAX_THREADS}" if threads else "greater than or equal to 1") in err


def test_bench_accepts_max_threads_and_the_smallest_dim(tmp_path, monkeypatch, capsys):
    """The bounds themselves run: ``--threads MAX_THREADS`` and ``--dim 1``."""
    import pipeline.perf.rerank
    from pipeline.cli import run

    calls = []
    monkeypatch.setattr(pipeline.perf.rerank, "bench_rerank", lambda **kw: calls.append(kw) or {"ok": 1})
    dim = "1"
    with pytest.raises(SystemExit) as exit_info:
        run(["bench", "--out", str(tmp_path), "rerank", "--dim", dim, "--threads", str(MAX_THREADS)])
    assert exit_info.value.code == 0, capsys.readouterr().err
    assert calls[0]["dim"] == int(dim) and calls[0]["threads"] == MAX_THREADS
    assert (tmp_path / "rerank.json").is_file()


@pytest.mark.parametrize("out", ["", "  "])
def test_bench_empty_out_is_refused(out, tmp_path, monkeypatch, capsys, no_work):
    """``--out ""`` wrote the measurement into the current folder; ``extract`` refuses it too."""
    monkeypatch.chdir(tmp_path)
    code, err = entry_point(["bench", "--out", out, "sinkhorn", "--problems", "2", "--rows", "3", "--cols", "4"], capsys)
    assert code == 2 and "'--out'" in err and "is empty" in err
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("dim", [0, -4])
def test_bench_rerank_dim_below_one_is_refused_up_front(dim, tmp_path, capsys, no_work):
    """A joint space of no dimension is named as the option, before any variant is timed."""
    code, err = entry_point(["bench", "--out", str(tmp_path), "rerank", "--queries", "2", "--dim", str(dim)], capsys)
    assert code == 2
    assert "'--dim'" in err and "greater than or equal to 1" in err and f"(given: '{dim}')" in err
