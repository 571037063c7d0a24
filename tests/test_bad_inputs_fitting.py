"""Bad inputs to fitting, found by the third new-user trial (issue 24): training options out
of range, a diverging loss, an unreadable resume snapshot, a score option a fitted scorer
cannot honour, and a fit scored on its own training items. Each is refused with one line
naming the key or file and the fix, or, for a snapshot, reported and restarted."""

from __future__ import annotations

import json
import logging

import pytest
import torch
import yaml

from pipeline.config import ParamsError, RidgeConfig, ScoreConfig, load_config, load_train_config
from tests.test_bad_inputs import cli, refused  # noqa: F401
from tests.test_training import _cfg, _weights

pytestmark = pytest.mark.bad_input


def _params(tmp_path, data: dict):
    path = tmp_path / "params.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


@pytest.mark.parametrize(
    "options,named",
    [({"tau": -1.0}, "tau must be > 0"), ({"epsilon": 0.0}, "epsilon must be > 0"), ({"grad_iters": 0}, "grad_iters must be in [1, n_iters"),
     ({"nu_v": 5.0}, "nu_v (the null row's / column's share of the mass) must be in [0, 1)"), ({"absorb_every": 0}, "absorb_every must be >= 1")],
)  # fmt: skip
def test_bindclip_scorer_options_out_of_range_are_refused(options, named):
    from pipeline.scorers.bindclip.model import BindClipConfig

    with pytest.raises(ValueError) as e:
        BindClipConfig(**options)
    assert named in str(e.value)


@pytest.mark.parametrize(
    "options,named",
    [({"weights": {"grounding": -3.0}}, "objective weights must be finite and >= 0"), ({"group_tau": 0.0}, "group_tau must be > 0"),
     ({"q0_grid": [0.5, 0.0]}, "q0_grid must list q0 values > 0"), ({"consistency_items": 0}, "consistency_items must be >= 1")],
)  # fmt: skip
def test_bindclip_objective_options_out_of_range_are_refused(options, named):
    from pipeline.scorers.bindclip.training import BindClipObjective

    with pytest.raises(ValueError) as e:
        BindClipObjective(**options)
    assert named in str(e.value)
    assert BindClipObjective(q0_grid=[]).q0_grid == []  # [] keeps the scorer's own q0


def test_a_loss_that_is_not_finite_stops_training_naming_the_step(tmp_path, tiny_store):
    from pipeline.training.loop import train_variant

    with pytest.raises(ValueError, match=r"train global-m seed 0: the loss is (nan|inf) at step \d+; lower train.global-m.lr"):
        train_variant(_cfg(tmp_path, variant="global-m", lr=1e30, steps=6, scorer={}, objective={}), tiny_store, progress=False)
    assert not (tmp_path / "global-m" / "seed0" / "model.safetensors").exists()  # no checkpoint of NaN weights


@pytest.mark.parametrize("content", ["garbage", "tensor", "list", "truncated"])
def test_an_unreadable_resume_snapshot_is_reported_and_the_seed_restarts(tmp_path, tiny_store, caplog, content):
    from pipeline.training.loop import train_variant

    train_variant(_cfg(tmp_path / "a"), tiny_store, progress=False)
    clean = _weights(tmp_path / "a" / "bindclip" / "seed0" / "model.safetensors")
    train_variant(_cfg(tmp_path / "b"), tiny_store, progress=False, stop_after=4)
    resume = tmp_path / "b" / "bindclip" / "seed0" / "resume.pt"
    if content == "garbage":
        resume.write_text("garbage\n")
    elif content == "tensor":
        torch.save(torch.zeros(3), resume)
    elif content == "list":
        torch.save([1, 2], resume)
    else:
        resume.write_bytes(resume.read_bytes()[:200])
    with caplog.at_level(logging.WARNING, logger="pipeline.training.loop"):
        train_variant(_cfg(tmp_path / "b"), tiny_store, progress=False)
    assert f"{resume} is unreadable" in caplog.text and "starts again at step 0" in caplog.text
    again = _weights(tmp_path / "b" / "bindclip" / "seed0" / "model.safetensors")
    assert all(torch.equal(again[k], clean[k]) for k in clean)  # restarted from step 0: the clean run's weights


@pytest.mark.parametrize("damage", ["cut", "not-an-object", "other-weights"])
def test_a_finished_seed_that_cannot_be_trusted_is_trained_again(tmp_path, tiny_store, caplog, damage):
    """A rerun keeps a finished seed only when its ``config.json`` reads and its weights are
    the bytes that record names: a cut record, or weights another run wrote, are reported
    and trained again (load_scorer refuses such weights, so keeping them left a seed no
    rerun could fix)."""
    from pipeline.training.loop import train_variant

    train_variant(_cfg(tmp_path / "a"), tiny_store, progress=False)
    seed = tmp_path / "a" / "bindclip" / "seed0"
    clean = {k: v.clone() for k, v in _weights(seed / "model.safetensors").items()}  # not a view of the file overwritten below
    config = seed / "config.json"
    if damage == "cut":
        config.write_text(config.read_text()[:200])
    elif damage == "not-an-object":
        config.write_text("[1, 2]\n")
    else:
        train_variant(_cfg(tmp_path / "b", lr=5e-2), tiny_store, progress=False)
        (seed / "model.safetensors").write_bytes((tmp_path / "b" / "bindclip" / "seed0" / "model.safetensors").read_bytes())
    with caplog.at_level(logging.WARNING, logger="pipeline.training.loop"):
        train_variant(_cfg(tmp_path / "a"), tiny_store, progress=False)
    said = "is unreadable" if damage != "other-weights" else "is not the file its config.json records"
    assert said in caplog.text and "seed 0 is trained again" in caplog.text
    again = _weights(seed / "model.safetensors")
    assert all(torch.equal(again[k], clean[k]) for k in clean)


def test_a_run_killed_while_writing_its_model_leaves_no_seed_a_rerun_keeps(tmp_path, tiny_store, monkeypatch):
    """Trained under one learning rate, then killed under another after the new weights are
    written but before their ``config.json``: the old record is gone first, so a rerun under
    the first learning rate trains again instead of keeping the other run's weights."""
    import pipeline.training.resume as resume
    from pipeline.training.loop import train_variant

    train_variant(_cfg(tmp_path), tiny_store, progress=False)
    seed = tmp_path / "bindclip" / "seed0"
    clean = {k: v.clone() for k, v in _weights(seed / "model.safetensors").items()}
    clean_log = (seed / "train_log.json").read_text()
    write = resume.write_atomically

    def killed_at_the_record(path, fn):
        if path.name == "config.json":
            raise KeyboardInterrupt("killed")
        write(path, fn)

    monkeypatch.setattr(resume, "write_atomically", killed_at_the_record)
    with pytest.raises(KeyboardInterrupt):
        train_variant(_cfg(tmp_path, lr=5e-2), tiny_store, progress=False)
    monkeypatch.setattr(resume, "write_atomically", write)
    assert not (seed / "config.json").exists() and not list(seed.glob("*.tmp"))
    assert not all(torch.equal(v, clean[k]) for k, v in _weights(seed / "model.safetensors").items())  # the other run's
    train_variant(_cfg(tmp_path), tiny_store, progress=False)
    again = _weights(seed / "model.safetensors")
    assert all(torch.equal(again[k], clean[k]) for k in clean)
    assert (seed / "train_log.json").read_text() == clean_log  # not the killed run's


def test_an_atomic_write_that_fails_leaves_the_old_file_whole(tmp_path):
    from pipeline.files import write_atomically

    path = tmp_path / "config.json"
    path.write_text("old\n")

    def half_then_fail(p):
        p.write_text("ne")
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        write_atomically(path, half_then_fail)
    assert path.read_text() == "old\n" and list(tmp_path.iterdir()) == [path]
    write_atomically(path, lambda p: p.write_text("new\n"))
    assert path.read_text() == "new\n" and list(tmp_path.iterdir()) == [path]


def test_a_metrics_record_cut_midway_leaves_the_old_record_whole(tmp_path, monkeypatch):
    """The score stage's metrics file (what `dvc metrics` and the report read) goes through
    the atomic write: a write that fails after half the text leaves the previous record
    readable, not a truncated JSON file."""
    import json
    from pathlib import Path

    from pipeline.config import ScoreConfig
    from stages.score import write_metrics

    cfg = ScoreConfig(variants=["clip"], suites=["shapes-dev"], metrics_out=str(tmp_path / "metrics"))
    old = write_metrics(cfg, {"variant": "clip", "suite": "shapes-dev", "metrics": {"accuracy": 0.5}})
    real = Path.write_text

    def half_then_fail(self, text, *a, **k):
        real(self, text[: len(text) // 2])
        raise OSError("disk full")

    monkeypatch.setattr(Path, "write_text", half_then_fail)
    with pytest.raises(OSError, match="disk full"):
        write_metrics(cfg, {"variant": "clip", "suite": "shapes-dev", "metrics": {"accuracy": 0.75}})
    monkeypatch.undo()
    folder = tmp_path / "metrics" / "clip"
    assert json.loads((folder / "shapes-dev.json").read_text()) == old and [p.name for p in folder.iterdir()] == ["shapes-dev.json"]


def test_a_toyclip_model_whose_config_is_cut_is_not_kept(tmp_path):
    from pipeline.encoders.toyclip import _identity_sha256, finished_model
    from pipeline.training.resume import write_finished

    identity = {"code": "x"}
    write_finished(tmp_path, {"w": torch.zeros(2)}, "{}", lambda: json.dumps({"identity_sha256": _identity_sha256(identity)}, indent=2))
    assert finished_model(tmp_path, identity) == tmp_path / "model.safetensors"
    assert finished_model(tmp_path, {"code": "y"}) is None
    (tmp_path / "config.json").write_bytes(b"\xff\xfe{")  # neither JSON nor UTF-8
    assert finished_model(tmp_path, identity) is None


def test_a_toyclip_resume_snapshot_that_is_unreadable_is_not_resumed(tmp_path):
    from pipeline.training.resume import read_resume

    path = tmp_path / "resume.pt"
    assert read_resume(path, {"step"}) == (None, None)
    path.write_text("garbage")
    record, reason = read_resume(path, {"step"})
    assert record is None and reason


def test_warmup_under_a_constant_schedule_is_refused(tmp_path, tiny_store):
    from pipeline.training.loop import train_variant

    with pytest.raises(ValueError, match="train.bindclip.warmup = 10 applies to lr_schedule cosine only"):
        train_variant(_cfg(tmp_path, warmup=10, steps=3), tiny_store, progress=False)


def test_a_seed_no_generator_takes_is_refused_naming_the_key(tmp_path):
    path = _params(tmp_path, {"train": {"variants": ["global-m"], "global-m": {"seeds": [2**64]}}})
    with pytest.raises(ParamsError, match=r"train.global-m.seeds.0 = 18446744073709551616: expected less than 9223372036854775808"):
        load_train_config(path, "global-m")


def test_an_unknown_training_or_ridge_suite_is_named_not_sent_to_extract(tmp_path):
    path = _params(tmp_path, {"train": {"variants": ["global-m"], "global-m": {"train_suite": "shapes-trian"}}})
    with pytest.raises(ParamsError, match=r"train.global-m.train_suite names unknown suite 'shapes-trian' \(see `pipeline suites`\)"):
        load_train_config(path, "global-m")
    path = _params(tmp_path, {"ridge": {"suite": "shapes-train[family=entity]"}})
    with pytest.raises(ParamsError, match=r"ridge.suite takes a whole suite's name, not a selection"):
        load_config(RidgeConfig, path, "ridge")


def test_a_score_option_a_fitted_scorer_overrides_is_refused(tiny_store, tmp_path):
    from safetensors.torch import save_file

    from pipeline.scorers import create_scorer
    from pipeline.scorers.checkpoints import WEIGHTS_KEY, load_scorer, weights_sha256_of

    folder = tmp_path / "global-m"
    folder.mkdir()
    scorer = create_scorer("global-m", dims=tiny_store.dims, proj=tiny_store.projections())
    save_file({k: v.contiguous() for k, v in scorer.state_dict().items()}, folder / "model.safetensors")
    chosen = dict(json.loads(json.dumps(scorer.config.__dict__)) if hasattr(scorer, "config") else {})
    key = next(k for k, v in chosen.items() if isinstance(v, float))
    (folder / "config.json").write_text(json.dumps({"scorer_kwargs": {key: chosen[key]}, WEIGHTS_KEY: weights_sha256_of(folder)}))
    load_scorer("global-m", tiny_store, tmp_path, options={key: chosen[key]})  # the same value: accepted
    with pytest.raises(ValueError, match=rf"score.options.global-m sets {key} = {chosen[key] * 2!r} \(fitted with {chosen[key]!r}\)"):
        load_scorer("global-m", tiny_store, tmp_path, options={key: chosen[key] * 2})


def test_a_fit_scored_on_its_own_training_suite_is_refused(tiny_store, tmp_path, monkeypatch):
    from stages import score as score_stage

    folder = tmp_path / "ck" / "ridge-fgw"
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps({"train_suite": "shapes-retrieval", "scorer_kwargs": {}}))
    monkeypatch.setattr(score_stage, "open_store", lambda extract: tiny_store)
    cfg = ScoreConfig(variants=["clip", "ridge-fgw"], suites=["shapes-retrieval"], checkpoints=str(tmp_path / "ck"),
                      scores_out=str(tmp_path / "scores"), metrics_out=str(tmp_path / "metrics"))  # fmt: skip
    from pipeline.config import ExtractConfig

    with pytest.raises(ValueError, match=r"ridge-fgw was fitted on shapes-retrieval .* which score.suites also scores"):
        score_stage.run(cfg, ExtractConfig(out=str(tmp_path / "store")), progress=False)
    path = _params(tmp_path, {"ridge": {"suite": "shapes-multi"}, "score": {"suites": ["shapes-multi"]}})
    refused(cli("ridge", "--params", path), f"{path}: ridge.suite = shapes-multi is also in score.suites")


def test_a_bad_training_option_names_the_params_file_and_its_key(tmp_path, tiny_store, monkeypatch):
    from pipeline.config import OptionsError
    from pipeline.training.loop import train_variant

    with pytest.raises(OptionsError, match=r"^train.bindclip.scorer: unknown BindClip options \['tua'\]"):
        train_variant(_cfg(tmp_path, scorer={"tua": 0.1}), tiny_store, progress=False)
    with pytest.raises(OptionsError, match=r"^train.bindclip.objective: unknown BindCLIP objective options \['group_ta'\]"):
        train_variant(_cfg(tmp_path, objective={"group_ta": 1.0}), tiny_store, progress=False)
    with pytest.raises(OptionsError, match=r"^train.bindclip.scorer: .*tau must be > 0"):
        train_variant(_cfg(tmp_path, scorer={"tau": -1.0}), tiny_store, progress=False)
    assert not list(tmp_path.rglob("model.safetensors"))  # refused before any weights are written


@pytest.mark.parametrize("options,named", [({"k": 2.5}, "k must be an integer >= 1, got 2.5"), ({"k": "20"}, "k must be an integer"),
                                           ({"beta": "0.5"}, "beta must be a finite number, got '0.5'"), ({"beta": float("nan")}, "beta must be a finite")])  # fmt: skip
def test_steering_options_of_the_wrong_kind_are_refused_not_coerced(tiny_store, options, named):
    from pipeline.scorers.checkpoints import build_scorer

    with pytest.raises(ValueError, match=rf"score.options.steer = .*steering's {named}"):
        build_scorer("steer", tiny_store, options)
    build_scorer("steer", tiny_store, {"k": 20, "beta": 1})  # an int beta is a number


@pytest.mark.parametrize(
    ("variant", "says"),
    [
        ("ridge-fgw", "ridge-fgw is fitted by `pipeline ridge`, not by `pipeline train`"),
        ("clip", "clip has no trainable parameters; nothing to train (trainable variants: bindclip, flowclip"),
    ],
)
def test_train_of_a_variant_it_does_not_train_names_what_does(tmp_path, variant, says):
    """`train --variant` of a variant `pipeline train` does not fit names what does
    (`pipeline ridge` for ridge-fgw, the trainable variants for clip), never a missing
    train.<variant> section."""
    params = _params(tmp_path, {"train": {"variants": ["bindclip"]}})
    line = refused(cli("train", "--params", params, "--variant", variant), says)
    assert "section" not in line


def test_a_retraining_that_stops_leaves_nothing_score_would_mix_with_the_last_one(tmp_path, tiny_store):
    """A retraining killed after its first seed leaves no top-level model, config or summary
    of the last training (which `score` would load as the variant) beside a rewritten
    seed0/, so two runs are never scored under one name; the resumed run completes both."""
    from pipeline.scorers.checkpoints import load_scorer, seed_checkpoints
    from pipeline.training.loop import train_variant

    train_variant(_cfg(tmp_path, seeds=[0, 1], steps=3), tiny_store, progress=False)
    assert [p.name for p in seed_checkpoints("bindclip", tmp_path)] == ["seed0", "seed1"]
    train_variant(_cfg(tmp_path, seeds=[0, 1], steps=4), tiny_store, progress=False, stop_after=2)  # killed in seed 0
    root = tmp_path / "bindclip"
    assert not any((root / f).exists() for f in ("model.safetensors", "config.json", "summary.json"))
    assert seed_checkpoints("bindclip", tmp_path) == []
    with pytest.raises(FileNotFoundError, match="is trained but .*model.safetensors does not exist; run `pipeline train --variant bindclip`"):
        load_scorer("bindclip", tiny_store, tmp_path)
    train_variant(_cfg(tmp_path, seeds=[0, 1], steps=4), tiny_store, progress=False)  # resumed to the end
    assert (root / "model.safetensors").read_bytes() == (root / "seed0" / "model.safetensors").read_bytes()
    assert [p.name for p in seed_checkpoints("bindclip", tmp_path)] == ["seed0", "seed1"]


def test_a_training_refused_for_its_scorer_options_keeps_the_last_trained_model(tmp_path, tiny_store):
    """A retraining whose scorer option is refused keeps the last training's model, config,
    summary and seed checkpoints unchanged."""
    bad, says = {"scorer": {"h": 16, "n_iters": 16, "absorb_every": 8, "tau": -1.0}}, "tau must be > 0"
    from pipeline.scorers.checkpoints import seed_checkpoints
    from pipeline.training.loop import train_variant

    train_variant(_cfg(tmp_path, steps=3), tiny_store, progress=False)
    root = tmp_path / "bindclip"
    before = {f: (root / f).read_bytes() for f in ("model.safetensors", "config.json", "summary.json")}
    with pytest.raises((ValueError, KeyError)) as e:
        train_variant(_cfg(tmp_path, steps=3, **bad), tiny_store, progress=False)
    assert says in str(e.value)
    assert {f: (root / f).read_bytes() for f in before} == before
    assert [p.name for p in seed_checkpoints("bindclip", tmp_path)] == ["seed0"]


@pytest.mark.parametrize("content", ["[]", "{bad", '{"seeds": 5}', "\xff"])
def test_a_training_summary_that_is_not_one_is_named_with_its_command(tmp_path, content):
    """``pipeline score`` and ``pipeline report`` list a variant's seeds from its summary: one
    that is not training's (a list, broken JSON, a number of seeds, not UTF-8) is refused
    naming the file and the training command, not an AttributeError traceback."""
    from pipeline.scorers.checkpoints import seed_checkpoints

    (tmp_path / "bindclip").mkdir()
    (tmp_path / "bindclip" / "summary.json").write_bytes(content.encode("latin-1"))
    with pytest.raises(ValueError, match=r"bindclip/summary\.json is not a training summary .*; rerun `pipeline train --variant bindclip`"):
        seed_checkpoints("bindclip", tmp_path)
