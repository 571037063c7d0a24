"""Flow-CLIP's report section and the cross-family sections (head-to-head, image
replacement) on synthetic results, the patch-sensitivity computation on the tiny store, and
the choice of the pictured checkpoint with stand-in scorers and training summaries.

Results are built from small hand-made manifests of every shapes suite, each item scored so
that a variant is right exactly where it is told to be (the true option 1, the others 0, or
a wrong option 1): every accuracy is the share of items marked right, so the expected
numbers are counted by hand. ARO relations and attribute pairs are one group each, so the
macro means are plain means.
"""

from __future__ import annotations

import json
import math
import re

import numpy as np
import pandas as pd
import pytest
import torch

from pipeline.benchmarks.coco_families import FAMILIES
from pipeline.benchmarks.sugarcrepe import CATEGORIES
from pipeline.config import ExtractConfig, ReportConfig, ScoreConfig
from pipeline.report import SECTIONS, ReportContext
from pipeline.report.tasks import ALL_TASKS, BINDING_TASKS, MEANS
from pipeline.scorers.checkpoints import scored_steps
from pipeline.scorers.flowclip import analysis, goals, sensitivity

N = 10  # items per SugarCrepe category, ARO category, dev family; queries of retrieval
KEYS = 5  # What'sUp object pairs (4 arrangements each: 20 items)
UNFILLED = re.compile(r"\{[a-z_]+(:[^}]*)?\}")


@pytest.fixture(autouse=True)
def close_figures():
    yield
    import matplotlib.pyplot as plt

    plt.close("all")


def manifests() -> dict[str, pd.DataFrame]:
    """One small manifest per suite, with the columns each suite's metric reads."""
    two = ["a red circle", "a blue circle"]
    sc = [
        {"item_id": f"{c}/{i}", "image": f"sc{k}.png", "captions": two, "correct": 0, "category": c}
        for k, (c, i) in enumerate((c, i) for c in CATEGORIES for i in range(N))
    ]
    aro = []
    for cat in ("relation", "attribution", "order"):
        for i in range(N):
            caps = [f"opt {j}" for j in range(5)] if cat == "order" else ["false", "true"]
            aro.append(
                {
                    "item_id": f"{cat}/{i}",
                    "image": f"aro{len(aro)}.png",
                    "captions": caps,
                    "correct": 0 if cat == "order" else 1,
                    "category": cat,
                    "relation_name": "left of",
                    "attr_pair": "red-blue",
                }
            )
    arrangements = ("left", "right", "above", "below")
    wu = [
        {
            "item_id": f"{k}/{a}",
            "image": f"wu{k}{a}.png",
            "captions": [f"x {a} y", "w", "v", "u"],
            "correct": 0,
            "category": a,
            "pair_key": f"k{k}",
            "arrangement": a,
        }
        for k in range(KEYS)
        for a in arrangements
    ]
    ret = [
        {"item_id": f"q{i}", "image": f"r{i}.png", "captions": [f"query {i}"], "correct": 0,
         "category": "retrieval", "group": i}
        for i in range(N)
    ]  # fmt: skip
    dev = [
        {"item_id": f"{f}/{i}", "image": f"d{f}{i}.png", "captions": two, "correct": 0,
         "category": f, "family": f}
        for f in FAMILIES
        for i in range(N)
    ]  # fmt: skip
    frames = {
        "shapes-sugarcrepe": sc,
        "shapes-aro": aro,
        "shapes-whatsup": wu,
        "shapes-retrieval": ret,
        "shapes-dev": dev,
    }
    return {s: pd.DataFrame(rows) for s, rows in frames.items()}


MANIFESTS = manifests()


def scores_for(suite: str, right: np.ndarray) -> np.ndarray:
    """[n, K] scores right exactly on the items where ``right`` is True."""
    m = MANIFESTS[suite]
    n = len(m)
    if suite == "shapes-retrieval":
        s = np.zeros((n, n))
        s[np.arange(n), np.where(right, np.arange(n), (np.arange(n) + 1) % n)] = 1.0
        return s
    k = max(len(c) for c in m["captions"])
    s = np.zeros((n, k))
    for i, (caps, c) in enumerate(zip(m["captions"], m["correct"], strict=True)):
        s[i, c if right[i] else (c + 1) % len(caps)] = 1.0
        s[i, len(caps) :] = np.nan
    return s


def rows_of(suite: str, metric: str) -> np.ndarray:
    """The manifest rows a task's units cover, in unit order."""
    m = MANIFESTS[suite]
    col = "family" if suite == "shapes-dev" else "category"
    if suite in ("shapes-whatsup", "shapes-retrieval"):
        return np.arange(len(m))
    return np.flatnonzero(m[col].to_numpy() == metric)


def results_from(right: dict[str, dict[str, np.ndarray]]) -> dict:
    """``load_results``-shaped results: ``right[variant][suite]`` = [n] bool per item."""
    out = {}
    for suite, m in MANIFESTS.items():
        scores = {v: scores_for(suite, r[suite]) for v, r in right.items() if suite in r}
        out[suite] = {"manifest": m, "image_root": "/nonexistent", "scores": scores}
    return out


def pattern(seed: int, p: float) -> dict[str, np.ndarray]:
    """Right on each item with probability ``p`` (seeded), every suite."""
    rng = np.random.default_rng(seed)
    return {s: rng.random(len(m)) < p for s, m in MANIFESTS.items()}


def accuracy(right: dict[str, np.ndarray], task: tuple[str, str]) -> float:
    """A task's accuracy counted by hand from the items marked right."""
    return float(right[task[0]][rows_of(*task)].mean())


def context(results: dict, tmp_path, modes=(), store=None, **kw) -> ReportContext:
    variants = [
        v for v in dict.fromkeys(v for e in results.values() for v in e["scores"]) if "@" not in v
    ]
    score = ScoreConfig(variants=variants, suites=list(results), replacements=list(modes),
                        checkpoints=str(tmp_path / "checkpoints"))  # fmt: skip
    cfg = ReportConfig(out=str(tmp_path), bootstrap=200, examples=1)
    extract = ExtractConfig(model="tiny-test", out=str(tmp_path / "no-store"))
    return ReportContext(results, cfg, score, extract, tmp_path, store_=store, **kw)


LADDER_RIGHT = {"clip": pattern(0, 0.5), "global-m": pattern(1, 0.6), "flowclip": pattern(2, 0.7),
                "flowclip-cimr": pattern(3, 0.7)}  # fmt: skip


# ---------------------------------------------------------------- the ablation ladder


def test_each_ladder_step_is_the_mean_of_the_per_task_differences():
    results = results_from(LADDER_RIGHT)
    steps = analysis.ladder(results, n_resamples=300, seed=0)
    assert steps["rungs"] == list(analysis.LADDER)
    for name, tasks in MEANS.items():
        block = steps[name]
        assert block["tasks"] == [analysis.task_label(t) for t in tasks] and not block["missing"]
        rows = {r["variant"]: r for r in block["rows"]}
        for k, v in enumerate(analysis.LADDER):
            mean = np.mean([accuracy(LADDER_RIGHT[v], t) for t in tasks])
            assert rows[v]["value"] == pytest.approx(mean, abs=1e-12)
            assert rows[v]["lo"] <= rows[v]["value"] <= rows[v]["hi"]
            if k == 0:
                assert rows[v]["vs_previous"] is None and rows[v]["vs_clip"] is None
                continue
            prev = analysis.LADDER[k - 1]
            step = np.mean(
                [accuracy(LADDER_RIGHT[v], t) - accuracy(LADDER_RIGHT[prev], t) for t in tasks]
            )
            got = rows[v]["vs_previous"]
            assert rows[v]["previous"] == prev and got["diff"] == pytest.approx(step, abs=1e-12)
            assert got["lo"] <= got["diff"] <= got["hi"] and 0 <= got["p"] <= 1
            vs_clip = np.mean(
                [accuracy(LADDER_RIGHT[v], t) - accuracy(LADDER_RIGHT["clip"], t) for t in tasks]
            )
            assert rows[v]["vs_clip"]["diff"] == pytest.approx(vs_clip, abs=1e-12)
    assert len(ALL_TASKS) == 12 and len(BINDING_TASKS) == 5


def test_the_ladder_compares_only_the_tasks_every_rung_has():
    right = {v: dict(r) for v, r in LADDER_RIGHT.items()}
    del right["flowclip"]["shapes-retrieval"]  # flowclip not scored on retrieval
    steps = analysis.ladder(results_from(right), n_resamples=100)
    assert steps["all-task"]["missing"] == ["shapes-retrieval R@1"]
    assert len(steps["all-task"]["tasks"]) == 11 and not steps["binding"]["missing"]
    clip = steps["all-task"]["rows"][0]
    assert clip["value"] == pytest.approx(
        np.mean([accuracy(right["clip"], t) for t in ALL_TASKS[:-1]]), abs=1e-12
    )


# ---------------------------------------------------------------- corrected and new errors


def test_corrected_and_new_errors_are_counted_per_slice_with_mcnemar():
    """On swap-att: clip wrong on items 0-4; flowclip right on 0-3 and wrong on 8, 9:
    4 corrected, 2 new, net +2, p = 2 P[Bin(6, 1/2) <= 2] = 44/64."""
    clip = {s: np.ones(len(m), bool) for s, m in MANIFESTS.items()}
    fc = {s: np.ones(len(m), bool) for s, m in MANIFESTS.items()}
    swap = rows_of("shapes-sugarcrepe", "swap-att")
    clip["shapes-sugarcrepe"][swap[:5]] = False
    fc["shapes-sugarcrepe"][swap[4]] = False
    fc["shapes-sugarcrepe"][swap[8:]] = False
    fc["shapes-aro"][rows_of("shapes-aro", "order")[:3]] = False  # 3 new errors on order
    clip["shapes-dev"][rows_of("shapes-dev", "depth")[:2]] = False  # 2 corrected on depth
    rows = analysis.corrections(results_from({"clip": clip, "flowclip": fc}), ["flowclip"])
    by = {(r["suite"], r["slice"]): r for r in rows}
    assert [k for k in by if k[0] != "all test items"] == list(analysis.CORRECTION_TASKS)
    r = by[("shapes-sugarcrepe", "swap-att")]
    assert (r["items"], r["baseline_errors"]) == (N, 5)
    assert r["flowclip"] == {"corrected": 4, "new": 2, "net": 2, "p": pytest.approx(44 / 64)}
    assert by[("shapes-aro", "order")]["flowclip"] == {
        "corrected": 0,
        "new": 3,
        "net": -3,
        "p": 0.25,
    }
    assert by[("shapes-dev", "depth")]["flowclip"] == {"corrected": 2, "new": 0, "net": 2, "p": 0.5}
    assert by[("shapes-sugarcrepe", "swap-obj")]["flowclip"]["p"] == 1.0  # no discordant items
    pooled = by[("all test items", "")]  # the test suites, not shapes-dev
    assert pooled["items"] == 7 * N + 3 * N + 4 * KEYS and pooled["baseline_errors"] == 5
    p = 2 * sum(math.comb(9, k) for k in range(5)) / 2**9  # 4 corrected, 5 new
    assert pooled["flowclip"] == {
        "corrected": 4,
        "new": 5,
        "net": -1,
        "p": pytest.approx(min(1, p)),
    }


# ---------------------------------------------------------------- training seeds


def test_the_seed_spread_is_the_mean_and_sample_sd_over_seeds():
    right = {"clip": pattern(0, 0.5), "flowclip": pattern(1, 0.6)}
    right |= {f"flowclip@seed{k}": pattern(10 + k, 0.6) for k in range(3)}
    spread = analysis.seed_spread(results_from(right), ["global-m", "flowclip"])
    assert list(spread) == ["flowclip"]  # global-m has no seed runs
    row = spread["flowclip"]
    assert row["seeds"] == ["flowclip@seed0", "flowclip@seed1", "flowclip@seed2"]
    for name, tasks in MEANS.items():
        vals = [np.mean([accuracy(right[s], t) for t in tasks]) for s in row["seeds"]]
        assert row[name]["values"] == pytest.approx(vals, abs=1e-12)
        assert row[name]["mean"] == pytest.approx(np.mean(vals), abs=1e-12)
        assert row[name]["sd"] == pytest.approx(np.std(vals, ddof=1), abs=1e-12)
    swap = [accuracy(right[s], ("shapes-sugarcrepe", "swap-att")) for s in row["seeds"]]
    assert row["shapes-sugarcrepe swap-att"]["mean"] == pytest.approx(np.mean(swap), abs=1e-12)


# ---------------------------------------------------------------- the goals


def goal_results() -> dict:
    """global-m = clip (the all-task goal met at its bound); flowclip + 1 swap-att item over
    global-m (binding +2.0 points: 1.0 short of 3); under shuffle flowclip-cimr 4 relation
    items below flowclip (13.3 points: met), under fixed 1 item (3.3 points: 6.7 short);
    with the own image flowclip-cimr = flowclip (met)."""
    base = pattern(0, 0.5)
    fc = {s: v.copy() for s, v in base.items()}
    swap = rows_of("shapes-sugarcrepe", "swap-att")
    fc["shapes-sugarcrepe"][swap[~base["shapes-sugarcrepe"][swap]][0]] = True  # one more right
    shuffled = {s: np.ones(len(m), bool) for s, m in MANIFESTS.items()}
    rel = rows_of("shapes-aro", "relation")

    def fewer(k: int) -> dict[str, np.ndarray]:
        out = {s: v.copy() for s, v in shuffled.items()}
        out["shapes-aro"][rel[:k]] = False
        return out

    right = {"clip": base, "global-m": base, "flowclip": fc, "flowclip-cimr": fc}
    right |= {"flowclip@shuffle": shuffled, "flowclip@fixed": shuffled}
    right |= {"flowclip-cimr@shuffle": fewer(4), "flowclip-cimr@fixed": fewer(1)}
    return results_from(right)


def test_goals_say_met_or_missed_and_by_how_much():
    bench = {"toy": {"variants": {"global-m": {"speedup": 400.0}, "flowclip": {"speedup": 25.0},
                                  "flowclip-cimr": {"speedup": 18.5}}}}  # fmt: skip
    checks = goals.goal_checks(goal_results(), ("shuffle", "fixed"), bench, n_resamples=200)
    by = {c["goal"]: c for c in checks}
    assert len(checks) == 7
    allt = by["`global-m` >= `clip` on the all-task mean"]
    assert allt["met"] is True and allt["diff"] == 0.0 and allt["shortfall"] == ""
    bind = by["`flowclip` >= `global-m` + 3 points on the binding mean"]
    assert bind["diff"] == pytest.approx(0.1 / 5) and bind["met"] is False
    assert bind["shortfall"] == "1.0 points"
    shuffle, fixed = (c for c in checks if c.get("mode") in ("shuffle", "fixed"))
    assert shuffle["mode"] == "shuffle" and shuffle["diff"] == pytest.approx(0.4 / 3)
    assert shuffle["met"] is True and "13.3" in shuffle["measured"]
    assert fixed["diff"] == pytest.approx(0.1 / 3) and fixed["met"] is False
    assert fixed["shortfall"] == "6.7 points"
    own = by["own image: `flowclip-cimr`'s ARO-style mean within 2 points of `flowclip`'s"]
    assert own["met"] is True and own["diff"] == 0.0
    toy, vit = checks[-2:]
    assert toy["met"] is False and toy["shortfall"] == "`flowclip-cimr` 1.5x short"
    assert toy["speedups"] == {"global-m": 400.0, "flowclip": 25.0, "flowclip-cimr": 18.5}
    assert (
        vit["encoder"] == "ViT-L-14-336"
        and vit["met"] is None
        and "not measured" in vit["measured"]
    )


def _summaries(root, steps: dict[str, list[int]]) -> None:
    """Training summaries with the given selected step per seed."""
    for v, per_seed in steps.items():
        (root / v).mkdir(parents=True)
        seeds = {str(k): {"selected_step": st, "dev": {}, "chosen": {}} for k, st in enumerate(per_seed)}
        (root / v / "summary.json").write_text(json.dumps({"variant": v, "seeds": seeds}))


def test_a_report_of_untrained_variants_says_so(tmp_path, tiny_store):
    write_scoring_bench(tmp_path)
    _summaries(tmp_path / "checkpoints", {v: [0, 0, 0] for v in analysis.VARIANTS})
    ctx = context(full_results(), tmp_path, ("shuffle", "fixed"), store=tiny_store)
    text = "\n\n".join(SECTIONS.get("flowclip").render(ctx))
    assert ctx.json_files["flowclip.json"]["selected_steps"]["flowclip"] == {"0": 0, "1": 0, "2": 0}
    assert "kept the initialisation" in text and "| `flowclip` | 3 | 0: 0, 1: 0, 2: 0 |" in text
    assert "yes (trivially: untrained)" in text
    assert "`flowclip` 31.5x" in text  # a speed goal is measured, never "trivially" met


def test_a_report_of_trained_variants_does_not_call_its_goals_trivial(tmp_path, tiny_store):
    write_scoring_bench(tmp_path)
    _summaries(tmp_path / "checkpoints", {"global-m": [50, 0, 0], "flowclip": [150, 0, 200], "flowclip-cimr": [100, 50, 0]})
    ctx = context(full_results(), tmp_path, ("shuffle", "fixed"), store=tiny_store)
    text = "\n\n".join(SECTIONS.get("flowclip").render(ctx))
    assert "trivially" not in text and "kept the initialisation" not in text
    assert "untrained)" not in text and "Scored at step 0" not in text  # every scored seed (0) trained
    assert "| `flowclip` | 3 | 0: 150, 1: 0, 2: 200 |" in text


class _Store:
    """A stand-in feature store holding the pictured suites (the pictures are patched out)."""

    def __init__(self, suites=()):
        self._suites = list(suites)

    def suites(self):
        return self._suites


def _scored_like_clip(untrained: tuple[str, ...]) -> dict:
    """Results where each variant of ``untrained`` (seed 0, the scored one, included) scores
    exactly as ``clip`` and the others and seeds 1-2 differ; replaced-image runs of
    ``untrained`` variants equal each other."""
    clip = pattern(0, 0.5)
    right = {"clip": clip}
    for j, v in enumerate(analysis.VARIANTS):
        right[v] = clip if v in untrained else pattern(50 + j, 0.7)
        right[f"{v}@seed0"] = right[v]
        right |= {f"{v}@seed{k}": pattern(20 + 3 * j + k, 0.6) for k in (1, 2)}
        for m in ("shuffle", "fixed"):
            right[f"{v}@{m}"] = pattern(40, 0.5) if v in untrained else pattern(60 + j, 0.5)
            del right[f"{v}@{m}"]["shapes-retrieval"]
    return results_from(right)


def _goal_row(text: str, goal: str) -> list[str]:
    line = next(x for x in text.splitlines() if x.startswith(f"| {goal} |"))
    return [c.strip() for c in line.strip("|").split("|")]


def test_goals_ladder_and_corrections_read_the_scored_checkpoints(tmp_path):
    """As in a run where seed 0 (the scored checkpoint) kept step 0 for every variant and
    seeds 1-2 trained: the goals on scores say "untrained", a met one "trivially", though not
    every seed kept step 0; the ladder and the corrections table name those checkpoints."""
    write_scoring_bench(tmp_path)
    _summaries(tmp_path / "checkpoints", {"global-m": [0, 50, 50], "flowclip": [0, 50, 50], "flowclip-cimr": [0, 0, 50]})
    ctx = context(_scored_like_clip(analysis.VARIANTS), tmp_path, ("shuffle", "fixed"), store=_Store())
    text = check_blocks(SECTIONS.get("flowclip").render(ctx))
    assert _goal_row(text, "`global-m` >= `clip` on the all-task mean")[2] == "yes (trivially: untrained)"
    own = "own image: `flowclip-cimr`'s ARO-style mean within 2 points of `flowclip`'s"
    assert _goal_row(text, own)[2] == "yes (trivially: untrained)"
    assert _goal_row(text, "`flowclip` >= `global-m` + 3 points on the binding mean")[2] == "**no** (untrained)"
    shuffle = "under shuffle, `flowclip-cimr`'s ARO-style mean >= 10 points below `flowclip`'s"
    assert _goal_row(text, shuffle)[2] == "**no** (untrained)"
    assert _goal_row(text, "scoring from the cache >= 20x faster than re-encoding (toy)")[2] == "yes"  # speed
    runs = "`global-m` (seed 0), `flowclip` (seed 0), `flowclip-cimr` (seed 0)"
    ladder = text.split("### Ablation ladder", 1)[1].split("###", 1)[0]
    assert f"Scored at step 0, the untrained initialisation (M = I and, for the ICER variants, W = 0) that dev selection kept, whose score is frozen CLIP's cosine: {runs}." in ladder
    fixes = text.split("### Errors corrected and errors made", 1)[1].split("###", 1)[0]
    assert f"which scores exactly as `clip`: {runs}. Those columns read 0 / 0 / +0" in fixes
    goals_text = text.split("### The issue's goals, as measured", 1)[1]
    assert f"which scores exactly as `clip`: {runs}. A verdict on scores says" in goals_text


def test_a_goal_names_the_untrained_variant_it_compares(tmp_path):
    """Only `flowclip` and `flowclip-cimr` scored at step 0: the goal comparing `flowclip` with
    a trained `global-m` names `flowclip`, the one on `global-m` alone stays plain."""
    _summaries(tmp_path / "checkpoints", {"global-m": [50, 0, 0], "flowclip": [0, 50, 50], "flowclip-cimr": [0, 0, 50]})
    untrained = ("flowclip", "flowclip-cimr")
    ctx = context(_scored_like_clip(untrained), tmp_path, ("shuffle", "fixed"), store=_Store())
    text = check_blocks(SECTIONS.get("flowclip").render(ctx))
    allt = _goal_row(text, "`global-m` >= `clip` on the all-task mean")[2]
    assert allt in ("yes", "**no**")
    binding = _goal_row(text, "`flowclip` >= `global-m` + 3 points on the binding mean")[2]
    assert binding in ("yes (`flowclip` untrained)", "**no** (`flowclip` untrained)")
    ladder = text.split("### Ablation ladder", 1)[1].split("###", 1)[0]
    assert "cosine: `flowclip` (seed 0), `flowclip-cimr` (seed 0). Those rows" in ladder


def test_scored_steps_read_the_scored_checkpoint(tmp_path):
    """The step of the checkpoint a variant is scored with: its config.json, else the training
    summary's scored seed (the first seed listed when it names none)."""
    root = tmp_path / "checkpoints"
    _summaries(root, {"global-m": [0, 50], "flowclip": [0, 50], "flowclip-cimr": [20, 0]})
    (root / "global-m" / "config.json").write_text(json.dumps({"seed": 1, "selected_step": 50}))
    summary = json.loads((root / "flowclip" / "summary.json").read_text())
    (root / "flowclip" / "summary.json").write_text(json.dumps({**summary, "scored_seed": 1}))
    assert scored_steps(root, [*analysis.VARIANTS, "other"]) == {
        "global-m": {"seed": "1", "step": 50},
        "flowclip": {"seed": "1", "step": 50},
        "flowclip-cimr": {"seed": "0", "step": 20},
    }


def _icer(w: float):
    """A stand-in scorer with an ICER weight W filled with ``w``."""
    from types import SimpleNamespace

    return SimpleNamespace(icer=SimpleNamespace(W=torch.full((2, 2), w)))


@pytest.mark.parametrize(
    ("scored_w", "steps", "seed_w", "pictured", "loaded"),
    [
        (0.0, [0, 50, 50], {1: 0.3, 2: 0.3}, "flowclip@seed1", [1]),  # the first seed past step 0
        (0.0, [0, 50, 100], {1: 0.0, 2: 0.3}, "flowclip@seed2", [1, 2]),  # seed 1's W is 0
        (0.0, [0, 0, 0], {}, None, []),  # every seed the initialisation: no picture
        (0.0, [0, 50, 0], {1: 0.0}, None, [1]),
        (0.5, [0, 50, 50], {}, "flowclip", []),  # the scored checkpoint has W != 0
    ],
)
def test_the_pictures_show_a_checkpoint_whose_icer_is_not_zero(tmp_path, monkeypatch, scored_w, steps, seed_w, pictured, loaded):
    """With W = 0 every patch's change is 0: the pictures show the scored `flowclip` only when
    its W is nonzero, else the first training seed past step 0 with W != 0, saying which; with
    none, a sentence says why there is no picture."""
    from pipeline.scorers import checkpoints
    from pipeline.scorers.flowclip import report

    root = tmp_path / "checkpoints"
    _summaries(root, {"flowclip": steps})
    for k in range(len(steps)):
        (root / "flowclip" / f"seed{k}").mkdir()
        (root / "flowclip" / f"seed{k}" / "model.safetensors").write_bytes(b"")
    scorers = {"flowclip": _icer(scored_w)} | {f"flowclip@seed{k}": _icer(w) for k, w in seed_w.items()}
    calls, drawn = [], []

    def load(variant, store, ckpts, ckpt_dir=None, options=None):
        calls.append(int(ckpt_dir.name.removeprefix("seed")))
        assert variant == "flowclip" and ckpt_dir == root / "flowclip" / ckpt_dir.name
        return scorers[f"flowclip@{ckpt_dir.name}"]

    def maps(scorer, store, results, items):
        drawn.append(next(name for name, s in scorers.items() if s is scorer))
        return []

    monkeypatch.setattr(checkpoints, "load_scorer", load)
    monkeypatch.setattr(sensitivity, "patch_maps", maps)
    monkeypatch.setattr(report, "sensitivity_figure", lambda maps, results, title="": object())
    right = {"clip": pattern(0, 0.5), "flowclip": pattern(1, 0.6)}
    right |= {f"flowclip@seed{k}": pattern(10 + k, 0.6) for k in range(len(steps))}
    store = _Store(["shapes-sugarcrepe", "shapes-whatsup"])
    ctx = context(results_from(right), tmp_path, store=store, scorers_={"flowclip": scorers["flowclip"]})
    text = check_blocks(SECTIONS.get("flowclip").render(ctx))
    part = text.split("### Patch sensitivity", 1)[1].split("###", 1)[0]
    assert calls == loaded
    if pictured is None:
        assert not drawn and not ctx.figures and "![patch sensitivity]" not in part
        assert "No patch-sensitivity pictures: ICER's weight W is 0 in the scored `flowclip` checkpoint" in part
        assert f"(selected step, seed: step — {', '.join(f'{k}: {s}' for k, s in enumerate(steps))})" in part
        return
    assert drawn == [pictured] and "![patch sensitivity](figures/flowclip-sensitivity.png)" in part
    assert f"Where `{pictured}` looks" in part and f"against the option `{pictured}` rates highest" in part
    if pictured == "flowclip":
        assert "instead" not in part
    else:
        k = int(pictured[-1])
        assert "The scored `flowclip` checkpoint has ICER's weight W = 0" in part
        assert f"of `{pictured}` instead (`{root / 'flowclip' / f'seed{k}'}`: training seed {k}, whose dev selection kept step {steps[k]})" in part


def test_goals_without_their_variants_are_not_scored():
    checks = goals.goal_checks(results_from({"clip": pattern(0, 0.5)}), ("shuffle",), {})
    assert [c["met"] for c in checks] == [None] * 6  # 4 on scores (one mode), 2 on speed
    assert all(c["measured"].startswith("not") for c in checks)


# ---------------------------------------------------------------- the sections


def full_results() -> dict:
    right = dict(LADDER_RIGHT) | {"bindclip": pattern(4, 0.8)}
    right |= {
        f"{v}@seed{k}": pattern(20 + 3 * j + k, 0.6)
        for j, v in enumerate(analysis.VARIANTS)
        for k in range(3)
    }
    right |= {
        f"{v}@{m}": pattern(40 + j, 0.5)
        for j, v in enumerate(analysis.VARIANTS)
        for m in ("shuffle", "fixed")
    }
    for v in list(right):  # replacements score choice suites only
        if v.endswith(("@shuffle", "@fixed")):
            del right[v]["shapes-retrieval"]
    return results_from(right)


def write_scoring_bench(out) -> None:
    results = {
        "toy": {
            "variants": {
                "clip": {"parameters": 0, "pairs_per_s": 123456.7, "speedup": 250.0},
                "flowclip": {"parameters": 2112, "pairs_per_s": 8000.0, "speedup": 31.5},
            }
        }
    }
    (out / "bench").mkdir(parents=True, exist_ok=True)
    (out / "bench" / "scoring.json").write_text(
        json.dumps({"command": "pipeline bench scoring", "results": results})
    )


def check_blocks(blocks: list[str]) -> str:
    for b in blocks:
        assert isinstance(b, str) and b.strip() and b == b.strip() and not UNFILLED.search(b), b[
            :80
        ]
    return "\n\n".join(blocks)


def test_the_flowclip_section_renders_every_part_and_its_payload(tmp_path, tiny_store):
    """Every part but the pictures (the tiny store has none of the pictured suites)."""
    write_scoring_bench(tmp_path)
    ctx = context(full_results(), tmp_path, ("shuffle", "fixed"), store=tiny_store)
    text = check_blocks(SECTIONS.get("flowclip").render(ctx))
    heads = [line for line in text.splitlines() if line.startswith("#")]
    assert heads == [
        "## Flow-CLIP",
        "### Ablation ladder",
        "### Errors corrected and errors made",
        "### Training seeds",
        "### The issue's goals, as measured",
    ]
    assert "| rung | all-task mean | Δ vs previous rung | Δ vs `clip` | binding mean |" in text
    payload = ctx.json_files["flowclip.json"]
    assert list(payload) == ["tasks", "ladder", "corrections", "seeds", "selected_steps", "goals"]
    json.dumps(payload)  # JSON-ready
    row = payload["ladder"]["all-task"]["rows"][1]
    assert f"| `global-m` | {100 * row['value']:.1f} [" in text
    swap = next(r for r in payload["corrections"] if r["slice"] == "swap-att")["flowclip"]
    assert f"{swap['corrected']} / {swap['new']} / {swap['net']:+d}<br>p" in text
    assert "| `flowclip` | 3 |" in text  # three seeds
    assert "`flowclip` 31.5x" in text and "| – |" in text  # toy measured, ViT-L not
    assert not ctx.figures and ctx.store_ is tiny_store


def test_sections_are_silent_without_their_inputs(tmp_path):
    results = results_from({"clip": pattern(0, 0.5), "bindclip": pattern(1, 0.6)})
    ctx = context(results, tmp_path)
    assert SECTIONS.get("flowclip").render(ctx) == []
    assert SECTIONS.get("image-replacement").render(ctx) == []
    assert "flowclip.json" not in ctx.json_files and ctx.store_ is None
    only_clip = context(results_from({"clip": pattern(0, 0.5)}), tmp_path)
    assert SECTIONS.get("head-to-head").render(only_clip) == []


def test_head_to_head_shows_the_suite_cells_and_the_bench(tmp_path):
    """clip right everywhere, flowclip wrong everywhere: 100.0 [100.0, 100.0] against
    0.0 [0.0, 0.0] with Δ −100 on every row; the bench rows from scoring.json, "–" where it
    has no number."""
    right = {"clip": {s: np.ones(len(m), bool) for s, m in MANIFESTS.items()}}
    right["flowclip"] = {s: np.zeros(len(m), bool) for s, m in MANIFESTS.items()}
    write_scoring_bench(tmp_path)
    ctx = context(results_from(right), tmp_path)
    text = check_blocks(SECTIONS.get("head-to-head").render(ctx))
    assert "| suite | metric | `clip` | `flowclip` |" in text
    for suite, metric in [("shapes-sugarcrepe", "swap-att"), ("shapes-aro", "order"),
                          ("shapes-whatsup", "individual"), ("shapes-retrieval", "R@1"),
                          ("shapes-whatsup", "pair")]:  # fmt: skip
        assert (
            f"| {suite} | {metric} | 100.0 [100.0, 100.0] | 0.0 [0.0, 0.0]<br>Δ -100.0 [-100.0, -100.0] |"
            in text
        )
    assert "shapes-dev" not in text
    assert "| bench (toy) | trainable parameters | 0 | 2,112 |" in text
    assert "| bench (toy) | pairs/s from the cache | 123,457 | 8,000 |" in text
    assert "| bench (toy) | × faster than re-encoding | 250.0 | 31.5 |" in text
    assert "| bench (ViT-L-14-336) | trainable parameters | – | – |" in text
    (tmp_path / "bench" / "scoring.json").unlink()
    text = "\n\n".join(SECTIONS.get("head-to-head").render(ctx))
    assert (
        "scoring.json` is absent" in text
        and "| bench (toy) | trainable parameters | – | – |" in text
    )


def test_image_replacement_against_the_own_image_and_chance(tmp_path):
    """flowclip right on every item with its own image, wrong on every one under shuffle,
    and right on half the ARO relation items under fixed."""
    ones = {s: np.ones(len(m), bool) for s, m in MANIFESTS.items()}
    fixed = {s: v.copy() for s, v in ones.items()}
    fixed["shapes-aro"][rows_of("shapes-aro", "relation")[: N // 2]] = False
    right = {"clip": ones, "flowclip": ones, "flowclip@fixed": fixed}
    right["flowclip@shuffle"] = {s: np.zeros(len(m), bool) for s, m in MANIFESTS.items()}
    ctx = context(results_from(right), tmp_path, ("shuffle", "fixed"))
    text = check_blocks(SECTIONS.get("image-replacement").render(ctx))
    header = "| variant | image | relation | attribution | order | ARO-style mean | SugarCrepe-style mean |"
    assert header + " What'sUp-style individual |" in text
    full, none = "100.0 [100.0, 100.0]", "0.0 [0.0, 0.0]<br>Δ -100.0 [-100.0, -100.0]"
    assert f"| `flowclip` | own image | {' | '.join([full] * 6)} |" in text
    assert f"| `flowclip` | shuffle | {' | '.join([none] * 6)} |" in text
    (fixed_row,) = [line for line in text.splitlines() if line.startswith("| `flowclip` | fixed |")]
    cells = fixed_row.split(" | ")[2:]
    assert cells[0].startswith("50.0 [") and "<br>Δ -50.0 [" in cells[0]
    assert cells[3].startswith("83.3 [") and "<br>Δ -16.7 [" in cells[3]  # (50 + 100 + 100) / 3
    assert cells[1] == "100.0 [100.0, 100.0]<br>Δ +0.0 [+0.0, +0.0]"
    assert "| chance |  | 50.0 | 50.0 | 20.0 | 40.0 | 50.0 | 25.0 |" in text
    assert "`clip`" not in text  # no replacement runs of clip


# ---------------------------------------------------------------- patch sensitivity


@pytest.fixture
def perturbed_flowclip(tiny_store):
    """A freshly initialised flowclip on the tiny store with W (and M_tok) moved off zero."""
    from pipeline.scorers import create_scorer

    torch.manual_seed(0)
    scorer = create_scorer("flowclip", dims=tiny_store.dims, proj=tiny_store.projections())
    with torch.no_grad():
        scorer.icer.W.normal_(0.0, 0.5)
        scorer.icer.M_tok.add_(0.1 * torch.randn_like(scorer.icer.M_tok))
    return scorer.eval()


def dev_items(store, n: int = 4):
    index = store.suite_index("shapes-dev")
    rows = np.arange(n)
    caps = index["captions"][rows]
    return store.images(index["image"][rows, 0]), store.texts(caps[:, 0]), store.texts(caps[:, 1])


def margin(scorer, image, gold, foil, grid) -> torch.Tensor:
    from pipeline.features import ImageFeatures

    img = ImageFeatures(image.early, grid, image.cls, image.embed)
    with torch.no_grad():
        return (scorer.score(img, gold) - scorer.score(img, foil)).double()


def test_patch_changes_sum_to_the_directional_derivative(tiny_store, perturbed_flowclip):
    """Σ_p ∂m/∂g_p · (g_p − ḡ) equals the central finite difference of the margin along the
    centred grid, item by item; each item's map does not depend on its batch neighbours."""
    image, gold, foil = dev_items(tiny_store)
    delta, m = sensitivity.patch_sensitivity(perturbed_flowclip, image, gold, foil)
    R = tiny_store.dims.n_patches
    assert delta.shape == (4, R) and torch.allclose(
        m.double(), margin(perturbed_flowclip, image, gold, foil, image.final)
    )
    g = image.final
    direction = g - g.mean(1, keepdim=True)  # no padded patches in the tiny store
    eps = 1e-2
    fd = (
        margin(perturbed_flowclip, image, gold, foil, g + eps * direction)
        - margin(perturbed_flowclip, image, gold, foil, g - eps * direction)
    ) / (2 * eps)
    assert fd.abs().min() > 1e-4  # a non-trivial case
    np.testing.assert_allclose(delta.sum(1).double().numpy(), fd.numpy(), rtol=2e-2, atol=1e-6)
    one, _ = sensitivity.patch_sensitivity(perturbed_flowclip, image.index(torch.tensor([2])),
                                        gold.index(torch.tensor([2])), foil.index(torch.tensor([2])))  # fmt: skip
    torch.testing.assert_close(one[0], delta[2], rtol=1e-4, atol=1e-7)


def test_uncentred_changes_vanish_and_an_untrained_icer_has_none(tiny_store, perturbed_flowclip):
    """ICER reads unit patch keys, so moving g_p along itself changes nothing (why the
    directions are centred); at initialisation (W = 0) ICER is 0 whatever the grid."""
    from pipeline.scorers import create_scorer

    image, gold, foil = dev_items(tiny_store)
    centred, _ = sensitivity.patch_sensitivity(perturbed_flowclip, image, gold, foil)
    plain, _ = sensitivity.patch_sensitivity(perturbed_flowclip, image, gold, foil, centre=False)
    assert plain.abs().max() < 1e-4 * centred.abs().max()
    fresh = create_scorer("flowclip", dims=tiny_store.dims, proj=tiny_store.projections()).eval()
    zero, _ = sensitivity.patch_sensitivity(fresh, image, gold, foil)
    assert zero.abs().max() == 0.0


def test_sensitivity_items_are_chosen_deterministically():
    """The first two swap-att items, the first swap-obj and the first What'sUp item; the
    foil of a What'sUp item is flowclip's best-scoring wrong option."""
    results = results_from({"flowclip": {s: np.zeros(len(m), bool) for s, m in MANIFESTS.items()}})
    items = sensitivity.sensitivity_items(results)
    swap_att, swap_obj = (
        rows_of("shapes-sugarcrepe", "swap-att"),
        rows_of("shapes-sugarcrepe", "swap-obj"),
    )
    assert items == [
        ("shapes-sugarcrepe", swap_att[0], 0, 1),
        ("shapes-sugarcrepe", swap_att[1], 0, 1),
        ("shapes-sugarcrepe", swap_obj[0], 0, 1),
        ("shapes-whatsup", 0, 0, 1),  # wrong: option 1 scored highest
    ]
    assert sensitivity.sensitivity_items(results, "global-m") == []


def test_ladder_and_seed_tables_put_each_figure_in_its_column():
    """The ladder's first delta is the step from the rung before (+1.0 points here), the
    second the difference from frozen CLIP (+5.0); seed spreads print in points (60.0 ± 5.0)."""
    from pipeline.report.tasks import MEANS
    from pipeline.scorers.flowclip.report import ladder_part, seeds_part

    step = lambda d: {"diff": d, "lo": d - 0.01, "hi": d + 0.01, "p": 0.5}  # noqa: E731
    row = {"value": 0.6, "lo": 0.55, "hi": 0.65, "vs_previous": step(0.01), "vs_clip": step(0.05)}
    steps = {"rungs": ["flowclip"], **{m: {"rows": [], "tasks": [], "missing": []} for m in MEANS}}
    steps["all-task"] = {"rows": [row], "tasks": ["t"], "missing": []}
    line = next(x for x in "\n".join(ladder_part(steps, 1000)).splitlines() if x.startswith("| `flowclip`"))
    cells = [c.strip() for c in line.strip("|").split("|")]
    assert cells[2].startswith("+1.0") and cells[3].startswith("+5.0"), cells
    table = "\n".join(seeds_part({"v": {"seeds": [0, 1], "all-task": {"mean": 0.6, "sd": 0.05}}}, {}))
    assert "60.0 ± 5.0" in table
    assert "retrained with 2 seeds" in table  # the seeds trained, not a fixed three
