"""scripts/bindclip_trial.py: a trial's params redirect every output and apply overrides;
scripts/compare_trials.py: seed means and the paired bootstrap against a base."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]


def _module(name: str = "bindclip_trial"):
    """The script ``scripts/<name>.py`` as a module."""
    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_trial_params_redirect_outputs_and_apply_overrides(tmp_path):
    mod = _module()
    base = yaml.safe_load((ROOT / "params.yaml").read_text())
    overrides = ["train.steps=900", "train.scorer={tau_x: 0.03}", "train.objective.weights.grounding=10"]
    p = mod.trial_params(base, "t1", tmp_path, overrides)
    t, b = p["train"]["bindclip"], base["train"]["bindclip"]
    assert t["out"] == str(tmp_path / "t1" / "checkpoints") and t["seeds"] == [0]
    assert p["score"]["checkpoints"] == t["out"]
    assert all(str(tmp_path) in p["score"][k] for k in ("scores_out", "metrics_out"))
    assert t["steps"] == 900 and t["scorer"] == {"tau_x": 0.03}
    weights = t["objective"]["weights"]
    assert weights["grounding"] == 10 and weights["reflection"] == b["objective"]["weights"]["reflection"]
    assert p["extract"] == base["extract"] and b["out"] == "cache/checkpoints"  # base untouched
    with pytest.raises(SystemExit, match="section.key=YAML"):
        mod.trial_params(base, "t2", tmp_path, ["steps=3"])


def test_compare_trials_averages_seeds_and_bootstraps_the_family_macro_mean(tmp_path):
    """Two families of 2 pairs; base seeds right on 2 and 3 of 4 items, new right on all 4:
    base = mean over families of the seed-mean accuracy = 0.625, new 1.0 -> +0.375."""
    import numpy as np
    import pandas as pd

    mod = _module("compare_trials")
    assert mod.parse_system("a:0,b:1, c") == [("a", 0), ("b", 1), ("c", None)]
    with pytest.raises(SystemExit, match="not an integer"):
        mod.parse_system("a:x")
    manifest = pd.DataFrame(
        {"item_id": list("pqrs"), "family": ["entity", "entity", "depth", "depth"], "correct": [0, 1, 0, 1]}
    )

    def write(run, variant, right):  # right: [4] bool, whether the true caption wins
        folder = tmp_path / run / "scores" / variant
        folder.mkdir(parents=True)
        s = [[1.0, -1.0] if (c == 0) == r else [-1.0, 1.0] for c, r in zip(manifest["correct"], right, strict=True)]
        pd.DataFrame({"item_id": list("srqp"), "category": "x", "scores": s[::-1]}).to_parquet(folder / "shapes-dev.parquet")

    write("base", "bindclip@seed0", [True, True, False, False])
    write("base", "bindclip@seed1", [True, True, True, False])
    write("new", "bindclip", [True] * 4)  # a single-seed trial: RUN and RUN:0 read it
    base, groups, n = mod.system_values(tmp_path, "base:0,base:1", "shapes-dev", "mean", manifest)
    assert n == 2 and list(base) == [1.0, 1.0, 0.5, 0.0] and list(groups) == ["entity", "entity", "depth", "depth"]
    new, _, _ = mod.system_values(tmp_path, "new", "shapes-dev", "mean", manifest)
    assert list(new) == list(mod.system_values(tmp_path, "new:0", "shapes-dev", "mean", manifest)[0]) == [1.0] * 4
    from pipeline.stats import paired_bootstrap

    r = paired_bootstrap(new, base, groups, n_resamples=200)
    assert r.diff == pytest.approx(1.0 - np.mean([1.0, 0.25]))
    with pytest.raises(SystemExit, match="no scores of base seed 2"):
        mod.system_values(tmp_path, "base:2", "shapes-dev", "mean", manifest)
    with pytest.raises(SystemExit, match="no metric"):
        mod.system_values(tmp_path, "new", "shapes-dev", "accuracy", manifest)


def test_compare_trials_row_is_a_trials_md_row():
    """--row prints the docs/trials.md row: seven cells, the dev seed mean and the CI in points."""
    mod = _module("compare_trials")
    row = mod.trials_row("gate", {"new": "bs128:0,bs128:1,bs128:2", "seeds": 3, "diff": 0.005, "lo": -0.004, "hi": 0.014, "dev": 0.7721})
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert len(cells) == 7 and cells[1] == "gate" and cells[3] == "0.772; 3"
    assert cells[4] == "+0.5 [-0.4, +1.4]"
    header = next(line for line in (ROOT / "docs" / "trials.md").read_text().splitlines() if line.startswith("| date"))
    assert len([c for c in header.strip("|").split("|")]) == 7


def test_bench_reads_builds_its_store_and_every_method_reads_the_same_arrays(tmp_path):
    """scripts/bench_reads.py end to end on a small built store: the store opens under the
    reader's checks, every method is timed on every read pattern (each is checked there to
    return the same arrays as the baseline) and the score pattern has the score stage's
    batches."""
    import json
    import subprocess
    import sys

    out = tmp_path / "reads.json"
    cmd = [sys.executable, str(ROOT / "scripts" / "bench_reads.py"), "--n-images", "96", "--batch-size", "64",
           "--repeats", "1", "--out", str(out)]  # fmt: skip
    subprocess.run(cmd, check=True, capture_output=True, cwd=tmp_path, timeout=300)
    result = json.loads(out.read_text())
    ordered = result["patterns"]["score_batches_ordered"]
    assert ordered["n_batches"] == 2  # 96 items of two options in batches of 64
    assert set(ordered["methods"]) == {"zarr_orthogonal", "dask_threads2", "dask_sync", "gather", "features"}


@pytest.mark.parametrize("script", ["bindclip_trial", "flowclip_trial"])
def test_trial_params_pass_the_score_stages_checks(tmp_path, monkeypatch, script):
    """A trial narrows the score stage to its own variants and suites; every other score key
    it inherits from params.yaml must still agree with them (replacement variants, seed
    suites), or the trial fails after training. The stage's checks run before it opens the
    store, which here stops the run."""
    from pipeline.config import ExtractConfig, ScoreConfig, load_config
    from stages import score as stage

    class Checked(Exception):
        pass

    def stop(_extract):
        raise Checked

    mod = _module(script)
    base = yaml.safe_load((ROOT / "params.yaml").read_text())
    params = mod.trial_params(base, "t", tmp_path, []) if script == "bindclip_trial" else \
        mod.trial_params(base, "t", tmp_path, ["global-m"], [])  # fmt: skip
    path = tmp_path / "params.yaml"
    path.write_text(yaml.safe_dump(params))
    monkeypatch.setattr(stage, "open_store", stop)
    with pytest.raises(Checked):
        stage.run(load_config(ScoreConfig, path, "score"), load_config(ExtractConfig, path, "extract"), progress=False)


def test_a_trial_script_without_its_cache_ends_with_one_line_naming_the_fix(tmp_path):
    """Without the `dvc repro` cache the trial scripts ended in a traceback; a row run with
    --params was told to run `pipeline extract` without them. An override after an option
    (``--suite S k=5``) is read as an override, not refused."""
    import subprocess
    import sys

    params = tmp_path / "params.yaml"
    doc = yaml.safe_load((ROOT / "params.yaml").read_text())
    doc["extract"]["out"] = str(tmp_path / "features")
    params.write_text(yaml.safe_dump(doc))
    cmd = [sys.executable, str(ROOT / "scripts" / "geometry_trial.py"), "fgw", "--suite", "shapes-retrieval", "k=5", "--params", str(params)]
    done = subprocess.run(cmd, capture_output=True, text=True, cwd=tmp_path, timeout=300)
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith(f"error: no feature store at {tmp_path / 'features'}")
    assert line.endswith("a row run with --params P reads P's store: `pipeline extract --params P` first)")


@pytest.mark.parametrize(("script", "flags"), [("ridge_heldout.py", ["--inverse", "--beta", "30"]), ("geometry_trial.py", ["ridge-fgw", "--lam", "0.01", "--inverse", "--beta", "30"])])
def test_the_hub_offset_is_refused_with_the_inverse_map(tmp_path, script, flags):
    """The inverse map compares in the phrase space, which has no reference phrases: a
    ``--beta`` there would be ignored, so both scripts refuse it before reading anything."""
    import subprocess
    import sys

    params = tmp_path / "params.yaml"
    doc = yaml.safe_load((ROOT / "params.yaml").read_text())
    doc["extract"]["out"] = str(tmp_path / "features")
    params.write_text(yaml.safe_dump(doc))
    done = subprocess.run([sys.executable, str(ROOT / "scripts" / script), *flags, "--params", str(params)], capture_output=True, text=True, cwd=tmp_path, timeout=300)
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
    assert "not with" in done.stderr and "--inverse" in done.stderr


@pytest.mark.parametrize(("flags", "message"), [(["lift", "--learned", "--width", "8"], "--learned"), (["probe", "--retrieval", "--beta", "0"], "beta > 0"), (["lift", "--width", "-1"], "--width must be")])
def test_ridge_object_trials_refuses_flags_it_cannot_honour(tmp_path, flags, message):
    """The learned lift has no width; the probe's cost divides by beta; a negative width is
    no lift: each is refused before the store is read."""
    import subprocess
    import sys

    params = tmp_path / "params.yaml"
    doc = yaml.safe_load((ROOT / "params.yaml").read_text())
    doc["extract"]["out"] = str(tmp_path / "features")
    params.write_text(yaml.safe_dump(doc))
    done = subprocess.run([sys.executable, str(ROOT / "scripts" / "ridge_object_trials.py"), *flags, "--params", str(params)], capture_output=True, text=True, cwd=tmp_path, timeout=300)
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
    assert message in done.stderr and "no feature store" not in done.stderr


def test_extract_cpu_writes_alone_fill_every_row_it_times(tmp_path):
    """scripts/extract_cpu.py times the writes through extract's writer: every planned row
    ends written and flagged, with the toy's shapes."""
    import zarr

    from pipeline.perf.common import random_encoder

    mod = _module("extract_cpu")
    enc = random_encoder("toy")
    assert mod.writes_alone(tmp_path / "w.zarr", enc, 70) > 0
    root = zarr.open_group(tmp_path / "w.zarr", mode="r")
    assert root["image/done"][:].all() and root["image/done"].shape == (70,)
    assert root["text/done"][:].all() and root["text/done"].shape == (140,)
    assert root["image/final"].shape[1:] == (enc.dims.grid[0] * enc.dims.grid[1] + 1, enc.dims.d_v)
    assert float(abs(root["image/final"][69].astype("float32")).sum()) > 0


def test_steering_directions_cosine_and_length_of_the_sum_by_hand():
    """scripts/steering_directions.py: two opposite directions have cosine −1 and a sum half
    the first's length here; three orthogonal ones cosine 0 and a sum √3 long; padding is
    ignored and a query with one direction is left out."""
    import torch

    mod = _module("steering_directions")
    e = torch.eye(3)
    directions = torch.stack([
        torch.stack([2 * e[0], -e[0], 9 * e[2]]),  # the third is padding
        torch.stack([e[0], e[1], e[2]]),
        torch.stack([e[1], 5 * e[0], 5 * e[2]]),  # one real direction: left out
    ])  # fmt: skip
    valid = torch.tensor([[True, True, False], [True, True, True], [True, False, False]])
    found = mod.direction_geometry(directions, valid)
    assert found["mean_cosine"] == pytest.approx([-1.0, 0.0], abs=1e-6)
    assert found["sum_over_first"] == pytest.approx([0.5, 3**0.5], abs=1e-6)


def test_ridge_object_trials_other_objects_mean_and_auc_by_hand():
    """scripts/ridge_object_trials.py: each object's other objects' mean is taken within its
    own image (0 for an object alone), and its AUC on a score matrix is the pipeline's
    ranking AUC on the same map."""
    import torch

    from pipeline.scorers.geometry.ridge import fit_map, ranking_auc

    mod = _module("ridge_object_trials")
    Y = torch.tensor([[1.0, 0.0], [3.0, 2.0], [5.0, 4.0], [7.0, 1.0]])
    image = torch.tensor([0, 0, 0, 1])
    expected = torch.tensor([[4.0, 3.0], [3.0, 2.0], [2.0, 1.0], [0.0, 0.0]])
    assert torch.allclose(mod.others_mean(Y, image), expected)
    g = torch.Generator().manual_seed(0)
    P = torch.nn.functional.normalize(torch.randn(6, 5, generator=g), dim=-1).repeat(4, 1)  # 6 phrases, 4 objects each
    Y = P @ torch.randn(5, 8, generator=g) + 3.0 * torch.randn(24, 8, generator=g)
    fitted = fit_map(P, Y, 0.1, 0.1)
    objects = fitted.objects(Y)
    S = fitted.phrases(P) @ objects.T - fitted.hub_offset(objects, 10.0)[None, :]
    assert 0.5 < mod.auc(S, P) < 1.0
    assert mod.auc(S, P) == pytest.approx(ranking_auc(P, Y, fitted, beta=10.0))


def test_geometry_trial_misses_by_hand():
    """scripts/geometry_trial.py --misses: a miss whose own image CLIP put outside its top k
    (a tie at the k-th place decided by gallery order, as the rerankers' shortlist is) is
    counted there; one inside whose top image changes one colour of the query's shapes
    names that change; a hit is no miss."""
    import json

    import numpy as np
    import pandas as pd

    mod = _module("geometry_trial")

    def scene(*objects):
        return json.dumps({"objects": [{"colour": c, "shape": s} for c, s in objects]})

    manifest = pd.DataFrame({
        "image": ["a", "b", "c", "d"],
        "scene": [scene(("red", "star"), ("blue", "cross")), scene(("orange", "star"), ("blue", "cross")),
                  scene(("red", "star"), ("green", "circle")), scene(("white", "square"), ("blue", "cross"))],
        "group": ["a", "b", "c", "d"],
    })  # fmt: skip
    scores = np.array([[0.0, 9.0, 1.0, 2.0],  # query a: top b (red -> orange star), own image inside CLIP's top 2
                       [0.0, 1.0, 9.0, 2.0],  # query b: top c, own image outside CLIP's top 2
                       [0.0, 1.0, 9.0, 2.0],  # query c: a hit
                       [0.0, 9.0, 1.0, 2.0]])  # fmt: skip
    clip = np.array([[5.0, 4.0, 0.0, 0.0], [5.0, 0.0, 4.0, 3.0], [0.0, 0.0, 1.0, 0.0],
                     [5.0, 4.0, 0.0, 4.0]])  # query d's own image ties for 2nd place and loses it by gallery order  # fmt: skip
    found = mod.misses(manifest, scores, clip, k=2)
    assert found["queries"] == 4 and found["misses"] == 3
    assert found["outside the shortlist"] == 2  # b, and d by the tie
    assert found["one colour changed"] == {"red->orange": 1}
    assert found["another scene, 2 shape(s) shared"] == 1 and found["another scene, 1 shape(s) shared"] == 2
    assert "outside the shortlist" not in mod.misses(manifest, scores)


def test_shared_word_pairs_by_hand():
    """scripts/trials.py: the hard pairs are different phrases that share a word; a phrase
    against itself or against a phrase with no word in common is no such pair."""
    import torch

    from scripts.trials import shared_word_pairs

    names = ["red circle", "blue circle", "red circle", "green square"]
    expected = torch.tensor([
        [False, True, False, False],
        [True, False, True, False],
        [False, True, False, False],
        [False, False, False, False],
    ])  # fmt: skip
    assert torch.equal(shared_word_pairs(names), expected)


def test_ridge_object_trials_relu_lift():
    """The lift trial's objects: the standardised box means first (width 0: nothing else),
    then non-negative random features drawn from the seed alone, or a seeded probe's
    hidden layer."""
    import torch

    mod = _module("ridge_object_trials")
    g = torch.Generator().manual_seed(1)
    Y = 2.0 + 3.0 * torch.randn(50, 4, generator=g)
    other = torch.randn(6, 4, generator=g)  # standardised by Y's statistics, not its own
    z = (other - Y.mean(0)) / Y.std(0)
    assert torch.allclose(mod.relu_lift(Y, 0)(other), z, atol=1e-6)
    lifted = mod.relu_lift(Y, 7)(other)
    assert lifted.shape == (6, 11) and torch.allclose(lifted[:, :4], z, atol=1e-6) and (lifted[:, 4:] >= 0).all() and (lifted[:, 4:] > 0).any()
    assert torch.equal(lifted, mod.relu_lift(Y, 7)(other)) and not torch.equal(lifted, mod.relu_lift(Y, 7, seed=1)(other))
    learned = mod.learned_lift(Y, torch.arange(50) % 2, 2, hidden=5, epochs=2)(other)
    assert learned.shape == (6, 9) and torch.allclose(learned[:, :4], z, atol=1e-6)
    assert torch.equal(learned, mod.learned_lift(Y, torch.arange(50) % 2, 2, hidden=5, epochs=2)(other))


def test_ridge_object_trials_lifted_patch_with_no_lift_is_the_pipelines_reranker():
    """With the identity as its lift, the lift trial's patch maps phrases and objects (and
    offsets the real objects) exactly as ``ridge-fgw`` does with the same fitted map."""
    import torch

    from pipeline.scorers.geometry.objects import ObjectSets
    from pipeline.scorers.geometry.rerankers import RidgeFGWReranker
    from pipeline.scorers.geometry.ridge import fit_map

    mod = _module("ridge_object_trials")
    g = torch.Generator().manual_seed(0)
    P = torch.nn.functional.normalize(torch.randn(5, 6, generator=g), dim=-1).repeat(6, 1)
    Y = P @ torch.randn(6, 4, generator=g) + 0.5 * torch.randn(30, 4, generator=g)
    fitted = fit_map(P, Y, 0.1, 0.1)
    scorer = RidgeFGWReranker(6, 4, beta=30.0, n_reference=len(fitted.reference))
    with torch.no_grad():
        for name, value in fitted.tensors().items():
            getattr(scorer, name).copy_(value)
    mask = torch.tensor([[True, True, False], [True, False, False]])
    objects = ObjectSets(torch.randn(2, 3, 4, generator=g), mask, torch.zeros(2, 3, 2))
    phrases = ObjectSets(torch.randn(2, 3, 6, generator=g), mask, torch.zeros(2, 3, 2))
    expected_o, expected_p = scorer.map_objects(objects), scorer.map_phrases(phrases)
    mod.lifted(fitted, lambda y: y, 30.0)(scorer)
    found_o, found_p = scorer.map_objects(objects), scorer.map_phrases(phrases)
    assert torch.allclose(found_o.embed, expected_o.embed) and torch.allclose(found_o.offset, expected_o.offset)
    assert (found_o.offset[mask] != 0).all()
    assert torch.allclose(found_p.embed, expected_p.embed)


def test_ridge_object_trials_probe_learns_and_its_cost_is_the_posterior():
    """The probe trial: a seeded probe names separable classes on held-out points and comes
    out the same from the same seed; as a feature cost each query phrase is read as its
    class and pays 1 - (1/beta) log p(class | object)."""
    import torch

    from pipeline.scorers.geometry.objects import ObjectSets, feature_cost

    mod = _module("ridge_object_trials")
    g = torch.Generator().manual_seed(0)
    centres = 4.0 * torch.eye(3, 5)
    y = torch.arange(3).repeat(40)
    X = centres[y] + 0.3 * torch.randn(120, 5, generator=g)
    X_eval = centres[y[:9]] + 0.3 * torch.randn(9, 5, generator=g)
    assert torch.equal(mod.train_probe(X, y, X_eval, 3, 16, epochs=200).argmax(1), y[:9])
    for hidden in (0, 16):
        assert torch.equal(mod.train_probe(X, y, X_eval, 3, hidden, epochs=5), mod.train_probe(X, y, X_eval, 3, hidden, epochs=5))
    net = torch.nn.Linear(5, 3)
    with torch.no_grad():
        net.weight.copy_(torch.randn(3, 5, generator=g))
        net.bias.zero_()
    phrases = torch.nn.functional.normalize(torch.randn(3, 4, generator=g), dim=-1)
    scorer = type("Scorer", (), {})()
    mean, std = torch.randn(5, generator=g), 0.5 + torch.rand(5, generator=g)
    mod.probe_cost(net, lambda x: (x - mean) / std, phrases, 10.0)(scorer)
    mask = torch.ones(1, 2, dtype=torch.bool)
    q = scorer.map_phrases(ObjectSets(phrases[[2, 0]][None] * 3.0, mask, torch.zeros(1, 2, 2)))
    objects = torch.randn(1, 2, 5, generator=g)
    c = scorer.map_objects(ObjectSets(objects, mask, torch.zeros(1, 2, 2)))
    with torch.no_grad():
        expected = 1.0 - net((objects[0] - mean) / std).log_softmax(-1)[:, [2, 0]].T / 10.0  # [phrases, objects]
    assert torch.allclose(feature_cost(q, c)[0], expected, atol=1e-6)
    unseen = ObjectSets(torch.stack([phrases[0], phrases[0] + phrases[1]])[None], mask, torch.zeros(1, 2, 2))
    with pytest.raises(ValueError, match="none of the probe's classes"):
        scorer.map_phrases(unseen)


def test_ridge_object_trials_readout_figures_by_hand():
    """The probe trial's figures of one readout: the AUC over pairs of different phrases and
    over the hard pairs (phrases on rows, objects on columns), the top-1 rate and the errors
    that keep the shape."""
    import torch

    mod = _module("ridge_object_trials")
    truth = torch.tensor([0, 1, 2])  # classes: red circle, blue circle, red square
    shape = torch.tensor([0, 0, 1])
    S = torch.tensor([
        [0.9, 0.1, 0.2],
        [0.8, 0.5, 0.0],
        [0.1, 0.3, 0.7],
    ])  # fmt: skip  # row 1's own object (0.5) loses to object 0 (0.8)
    hard = torch.tensor([[False, True, True], [True, False, False], [True, False, False]])
    top = torch.tensor([1, 1, 0])  # object 0 named blue circle (same shape), object 2 red circle (other shape)
    every, shared, top1, colour, wrong = mod.readout_figures(S, top, truth, hard, shape)
    assert every == pytest.approx(5 / 6) and shared == pytest.approx(3 / 4)
    assert top1 == pytest.approx(1 / 3) and (colour, wrong) == (1, 2)
    assert mod.readout_figures(S.T, top, truth, hard, shape)[0] == pytest.approx(1.0)  # objects on rows: another figure
