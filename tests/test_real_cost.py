"""scripts/real_cost.py: the real run's cost from per-item figures and counts, checked
against hand-computed cases. Nothing here builds or runs a model."""

from __future__ import annotations

import dataclasses
import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _module():
    """``scripts/real_cost.py`` as a module (registered, so its dataclasses resolve)."""
    spec = importlib.util.spec_from_file_location("real_cost", ROOT / "scripts" / "real_cost.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


rc = _module()


def _case():
    """Two choice suites reading one folder of 5 images, a retrieval suite on another folder;
    a per-caption scorer ``c``, a pairwise ``p`` and a reranker ``k`` shortlisting with ``c``."""
    counts = [
        rc.SuiteCount(
            "a", "choice", items=10, options=2, images=4, captions=20, pool="/x/p", source="hand"
        ),
        rc.SuiteCount(
            "b", "choice", items=6, options=5, images=3, captions=30, pool="/x/p", source="hand"
        ),
        rc.SuiteCount(
            "r", "retrieval", items=4, options=1, images=4, captions=4, pool="/x/q", source="hand"
        ),
    ]
    figures = rc.Figures(
        s_per_image=2.0,
        s_per_caption=0.5,
        train={"t": {"s_per_step": 3.0, "dev_s_per_item": 0.5, "select_s_per_item": 0.25}},
        choice_pairs_per_s={"c": 10.0, "p": 4.0},
        retrieval_pairs_per_s={"c": 100.0},
        rerank_s_per_query={"k": 0.5},
    )
    train = {"t": rc.TrainPlan(seeds=2, steps=10, batch_size=8, eval_every=4, dev_items=8, train_items=16)}
    score = rc.ScorePlan(
        variants=["c", "p", "k"],
        suites=["a", "b", "r"],
        kinds={
            "c": rc.ScorerKind(),
            "p": rc.ScorerKind(pairwise=True),
            "k": rc.ScorerKind(reranker=True, scores_choices=False, base="c"),
        },
        references={"a": None, "b": None, "r": None},
        replaced=["c"],
        replacements=2,
        seed_runs={"c": 1, "p": 1},
        seed_suites=["a", "r"],
    )
    return counts, figures, train, score


def test_estimate_equals_the_hand_computed_case():
    counts, figures, train, score = _case()
    est = rc.estimate(counts, figures, train, score, pool_sizes={"p": 5})

    # extract: folder p holds 5 images (4 + 3 capped), q 4: 9 images x 2 s + 54 captions x 0.5 s
    assert est["extract"]["images"] == 9 and est["extract"]["shared_images"] == 9 - 11
    assert est["extract"]["captions"] == 54
    assert est["extract"]["seconds"] == pytest.approx(18 + 27)
    assert [r["seconds"] for r in est["extract"]["suites"]] == pytest.approx(
        [8 + 10, 6 + 15, 8 + 2]
    )
    assert est["extract"]["shared_seconds"] == pytest.approx(-4)

    # train: 5 dev evals a seed (step 0, steps 4 and 8, the last step 10, the final one);
    # a seed = 10 x 3 + 5 x 8 x 0.5 + 8 x 0.25 = 52 s; two seeds
    t = est["train"]["variants"]["t"]
    assert t["dev_evals_per_seed"] == 5
    assert (t["steps_s"], t["dev_s"], t["select_s"]) == pytest.approx((60, 40, 4))
    assert est["train"]["seconds"] == pytest.approx(104)

    # score, c: a 20/10 + b 30/10 + r 16/100; replacements 2 x (a + b); one more seed on a and r
    s = est["score"]["variants"]
    assert s["c"]["main_s"] == pytest.approx(2 + 3 + 0.16)
    assert s["c"]["replacements_s"] == pytest.approx(2 * (2 + 3))
    assert s["c"]["seeds_s"] == pytest.approx(2 + 0.16)
    # p (pairwise): a one call per item, b 5 x 4 / 2 = 10 calls per item, two pairs a call at
    # 4 pairs/s; skipped on r; not replaced; its other seed on a only
    assert (s["p"]["main_s"], s["p"]["replacements_s"], s["p"]["seeds_s"]) == pytest.approx(
        (5 + 30, 0, 5)
    )
    # k: its base scores 4 x 4 pairs at c's 100 pairs/s, then 4 queries x 0.5 s; no choice suite
    assert s["k"]["total_s"] == pytest.approx(0.16 + 2)
    assert est["score"]["seconds"] == pytest.approx(17.32 + 40 + 2.16)

    assert est["total_seconds"] == pytest.approx(45 + 104 + 59.48)
    assert est["total_hours"] == pytest.approx((45 + 104 + 59.48) / 3600)


def _suite(name: str, images: int, pool: str, keys: set | None = None, texts: set | None = None):
    """A choice suite of ``images`` images read from ``pool`` and ``2 * images`` captions
    (``keys``, ``texts``: its images and captions, counted from its files)."""
    counted = {} if keys is None else {"keys": frozenset(keys), "texts": frozenset(texts or ())}
    return rc.SuiteCount(name, "choice", images, 2, images, 2 * images, pool, "hand", **counted)


def test_rows_are_united_by_key_and_text_and_documented_images_capped_by_their_folder():
    a = _suite("a", 3, "/c/val2017", {("x", None), ("y", None), ("z", None)}, {"p", "q"})
    b = _suite("b", 2, "/c/val2017", {("y", None), ("y", (0.0, 0.0, 0.5, 1.0))}, {"q", "r"})
    # y once, a crop of y a row of its own; q once
    assert rc.encoded_rows([a, b]) == (4, 3)
    # a folder with an uncounted suite: the sum, capped at val2017's 5,000; captions summed
    big = _suite("c", 4998, "/c/val2017")
    assert rc.encoded_rows([a, b, big]) == (5000, 3 + 2 * 4998)
    other = _suite("d", 9, "/c/other")  # a folder of unknown size: the sum
    assert rc.encoded_rows([big, other]) == (4998 + 9, 2 * (4998 + 9))
    # a suite within another adds no row (when that suite is extracted too)
    dev = dataclasses.replace(_suite("e", 50, "/c/val2017"), within="c")
    assert rc.encoded_rows([big, dev]) == (4998, 2 * 4998)
    assert rc.encoded_rows([dev]) == (50, 100)


def test_dev_evaluations_follow_the_training_loop():
    assert rc.n_dev_evals(300, 50) == 8  # step 0, 50..300, final
    assert rc.n_dev_evals(400, 50) == 10
    assert rc.n_dev_evals(10, 4) == 5  # step 0, 4, 8, the last step 10, final


def test_pairwise_scorer_with_a_reference_option_makes_k_minus_one_calls():
    count = rc.SuiteCount(
        "pp", "choice", items=100, options=3, images=100, captions=300, pool="/p", source="hand"
    )
    figures = rc.Figures(1, 1, {}, {"p": 50.0}, {}, {})
    kind = rc.ScorerKind(pairwise=True)
    assert rc.suite_score_seconds("p", kind, count, 2, figures) == pytest.approx(100 * 2 * 2 / 50)
    assert rc.suite_score_seconds("p", kind, count, None, figures) == pytest.approx(
        100 * 3 * 2 / 50
    )
    gallery = rc.SuiteCount("r", "retrieval", 5, 1, 5, 5, "/r", "hand")
    assert rc.suite_score_seconds("p", kind, gallery, None, figures) is None  # skipped


def test_template_texts_of_the_coco_families():
    # 3 names, 6 ordered pairs: negation 6, three two-relation families 3 x 2 x 6,
    # absolute position 2 sides x 3 names and as many paraphrases
    assert rc.family_template_texts(3) == 6 + 36 + 12
    assert rc.family_template_texts(80) == 44560


def test_table_marks_every_gpu_figure_as_not_measured():
    counts, figures, train, score = _case()
    est = rc.estimate(counts, figures, train, score, pool_sizes={"p": 5})
    rows = rc.markdown(counts, est, train, figures).splitlines()[2:]
    assert rows and all(r.endswith(f"| {rc.NO_GPU} |") for r in rows)
    total = [r for r in rows if r.startswith("| **total of the measured parts** |")]
    assert len(total) == 1 and "**0.06**" in total[0]  # 208.48 s


def test_table_gives_the_gpu_estimate_beside_the_cpu_one():
    counts, figures, train, score = _case()
    est = rc.estimate(counts, figures, train, score, pool_sizes={"p": 5})
    gpu_figures = dataclasses.replace(figures, s_per_image=200.0, s_per_caption=50.0)
    gpu = rc.estimate(counts, gpu_figures, train, score, pool_sizes={"p": 5})
    table = rc.markdown(counts, est, train, figures, gpu, "H200").splitlines()
    assert table[0].endswith("| GPU hours (H200) |")
    rows = {r.split(" | ")[0]: r for r in table[2:]}
    # suite a: 4 images x 200 s + 20 captions x 50 s = 1,800 s on the GPU figures, 18 s on the CPU's
    assert rows["| extract: a"].endswith("| <0.01 | 0.50 |")
    assert rows["| ridge (ridge-fgw's map on coco-objects-train)"].endswith(
        f"| {rc.NOT_MEASURED} | {rc.NOT_MEASURED} |"
    )
    # 9 images x 200 + 54 captions x 50 = 4,500 s, plus the same train (104 s) and score (59.48 s)
    assert rows["| **total of the measured parts**"].endswith("| **0.06** | **1.3** |")


def test_gpu_figures_take_the_in_memory_choice_rates():
    measured = {
        "choice_pairs_per_s_in_memory": {"c": 900.0},
        "retrieval_pairs_per_s": {"c": 5000.0},
        "train": {"t": {"s_per_step": 0.1, "dev_s_per_item": 0.01, "select_s_per_item": 0.02, "batch_size": 8}},
        "encoder": {"s_per_image": 0.01, "s_per_caption": 0.001},
    }
    benches = {"scoring.json": {"pairs_per_s": {"c": 150.0}}, "rerank.json": {"ms_per_query": {"k": 4.0}}}
    cpu, src = rc.figures_from(measured, benches, ["c"])
    gpu, gpu_src = rc.figures_from(measured, benches, ["c"], cache_rates=False)
    assert cpu.choice_pairs_per_s == {"c": 150.0} and src["c"] == "scoring.json"
    assert gpu.choice_pairs_per_s == {"c": 900.0} and gpu_src["c"].startswith("measured in memory")
    assert gpu.rerank_s_per_query == {"k": 0.004} and gpu.train["t"] == {
        "s_per_step": 0.1, "dev_s_per_item": 0.01, "select_s_per_item": 0.02
    }


def test_a_built_manifest_is_counted_as_extract_keys_it():
    import pandas as pd

    manifest = pd.DataFrame(
        {
            "item_id": ["0", "1", "2"],
            "image": ["a.jpg", "a.jpg", "a.jpg"],
            "crop_box": [[0, 0, 5, 5], [0, 0, 5, 5], [1, 1, 5, 5]],  # two crops of one image
            "captions": [["x on y", "y on x"], ["x on y", "z on y"], ["y on x", "w on z"]],
            "correct": [1, 1, 1],
            "split": ["train", "validation", "validation"],
        }
    )
    c = rc.count_manifest("aro-relation", manifest, Path("/img"), "hand", "validation")
    assert (c.items, c.options, c.images, c.captions, c.dev_items) == (3, 2, 2, 4, 2)
    assert c.exact and c.pool == "/img" and ("/img/a.jpg", (1.0, 1.0, 5.0, 5.0)) in c.keys


def test_a_gpu_measurement_needs_the_cpu_figures(capsys):
    with pytest.raises(SystemExit):
        rc.main(["--device", "cuda"])
    assert "--reuse reports/bench/real-cost.json" in capsys.readouterr().err


def test_a_documented_suites_pool_is_the_folder_its_images_are_read_from():
    """Without files, a documented suite's image folder is its params image root joined with
    the folder the official layout puts below it: ARO's VG crops sit in the root itself
    (``<aro>/images``), COCO-Order's photographs in ``val2014/`` below the COCO-2014 root."""
    import yaml

    roots = yaml.safe_load((ROOT / "real" / "params.yaml").read_text())["extract"]["image_roots"]
    counts = {c.suite: c for c in rc.count_suites(ROOT / "real" / "params.yaml")}
    assert counts["aro-relation"].pool == f"{roots['aro-relation']} [aro-relation crops]"
    assert counts["aro-coco-order"].pool == f"{roots['aro-coco-order']}/val2014"
