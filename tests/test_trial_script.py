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
