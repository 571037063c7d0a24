"""Bad inputs to ``pipeline report`` a new user found by hand: an edited scores table, a
misspelt ``report.head_to_head`` name, measurement files and an encoder-comparison summary
that are not what their command writes. Each is refused with one line naming the file (or
key) and the fix, never reported as something else; a suite without scores is named.

Everything runs on ``tiny-vit`` at random init over the eight generated images of
``tests/test_bad_inputs.py``, scored once per module where a test leaves the scores alone.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest
import yaml

from pipeline.config import ExtractConfig, ReportConfig, ScoreConfig
from tests.test_bad_inputs import (  # noqa: F401  (images: a fixture)
    SUITE,
    cli,
    images,
    item,
    ok,
    refused,
    write_manifest,
    write_params,
)

pytestmark = pytest.mark.bad_input


def with_report(params: Path, **report: object) -> Path:
    """``params`` with a report section writing beside it: a few resamples, no example images,
    and a summary path of its own (absent unless a test writes it)."""
    tmp = params.parent
    doc = yaml.safe_load(params.read_text())
    doc["report"] = {"out": str(tmp / "reports"), "bootstrap": 50, "examples": 0,
                     "encoders": str(tmp / "encoders.json"), **report}  # fmt: skip
    params.write_text(yaml.safe_dump(doc))
    return params


def report_text(params: Path) -> str:
    ok(cli("report", "--params", params))
    return (params.parent / "reports" / "report.md").read_text()


@pytest.fixture(scope="module")
def scored(tmp_path_factory, images) -> Path:  # noqa: F811 - the fixture
    """A folder with the eight items extracted and scored (clip), and its params."""
    tmp = tmp_path_factory.mktemp("scored")
    folder, names = images
    manifest = write_manifest(tmp / "m.parquet", [item(i, n) for i, n in enumerate(names)])
    params = with_report(write_params(tmp, manifest, folder))
    ok(cli("extract", "--params", params, "--quiet"))
    ok(cli("score", "--params", params, "--quiet"))
    return tmp


@pytest.fixture
def report_of(scored, tmp_path) -> Path:
    """Params reading ``scored``'s scores and writing the report under ``tmp_path``."""
    params = tmp_path / "params.yaml"
    shutil.copy(scored / "params.yaml", params)
    return with_report(params)


def test_rows_deleted_from_a_scores_table_are_refused_not_reported_as_missing_images(tmp_path, images):  # noqa: F811
    """A table rewritten with its first rows only (its origin kept) is refused, naming the
    items it lacks, not reported as items whose image was missing at extract; an item whose
    image is missing at extract is reported as such."""
    folder, names = images
    rows = [item(i, n) for i, n in enumerate(names)] + [item(8, "gone.png")]  # no such image
    manifest = write_manifest(tmp_path / "m.parquet", rows)
    params = with_report(write_params(tmp_path, manifest, folder, skip_missing=True))
    ok(cli("extract", "--params", params, "--quiet"))
    ok(cli("score", "--params", params, "--quiet"))
    assert "8 items. " in (text := report_text(params))
    assert "1 item(s) left out, their image missing or undecodable at extract (each metrics file's `skipped` counts the two reasons): it8." in text
    table = tmp_path / "scores" / "clip" / f"{SUITE}.parquet"
    pq.write_table(pq.read_table(table).slice(0, 5), table)  # the origin metadata stays
    refused(
        cli("report", "--params", params),
        str(table), f"exactly the 8 items of {SUITE} whose images were extracted", "lacks 3 (it5, it6, it7)",
        "rerun `pipeline score`",
    )  # fmt: skip


def test_scores_of_a_store_an_extract_replaced_are_refused(tmp_path, images):  # noqa: F811
    """An extract that replaces the store (here another init seed, ``replace_mismatch``)
    leaves the old scores behind: the report refuses them instead of presenting the old
    model's numbers as this run's; scoring again reports."""
    folder, names = images
    manifest = write_manifest(tmp_path / "m.parquet", [item(i, n) for i, n in enumerate(names)])
    params = with_report(write_params(tmp_path, manifest, folder))
    ok(cli("extract", "--params", params, "--quiet"))
    ok(cli("score", "--params", params, "--quiet"))
    other = with_report(write_params(tmp_path, manifest, folder, name="other", init_seed=1, replace_mismatch=True))
    ok(cli("extract", "--params", other, "--quiet"))
    refused(
        cli("report", "--params", other),
        str(tmp_path / "scores" / "clip" / f"{SUITE}.parquet"), "was scored from an earlier feature store of tiny-vit",
        "rerun `pipeline score`",
    )  # fmt: skip
    ok(cli("score", "--params", other, "--quiet"))
    assert "8 items. " in report_text(other)


def test_an_unknown_head_to_head_name_is_refused_with_the_valid_scorers(tmp_path):
    """``report.head_to_head: [clip, bindclipp]`` is refused, naming the valid scorers."""
    params = tmp_path / "params.yaml"
    params.write_text("report:\n  head_to_head: [clip, bindclipp]\n")
    refused(
        cli("report", "--params", params),
        "report.head_to_head names unknown scorer(s) bindclipp; valid scorers: ", "bindclip, ",
    )  # fmt: skip


def test_a_suite_without_any_scores_is_named_in_the_overview(tmp_path):
    """A suite of ``score.suites`` that no table scores is named beside the unscored variants,
    not left out of the report without a word."""
    from pipeline.report import ReportContext
    from pipeline.report.sections import overview

    manifest = pd.DataFrame({"item_id": ["a"], "captions": [["x", "y"]], "correct": [0]})
    results = {
        "shapes-sugarcrepe": {"manifest": manifest, "scores": {"clip": np.array([[1.0, 0.0]])}},
        "shapes-aro": {"manifest": manifest, "scores": {}},
    }
    score = ScoreConfig(variants=["clip"], suites=list(results), replacements=[])
    ctx = ReportContext(results, ReportConfig(out=str(tmp_path)), score, ExtractConfig(), tmp_path)
    intro = overview(ctx)[1]
    assert "No scores were found for any variant on `shapes-aro`" in intro
    assert "`shapes-sugarcrepe`" not in intro.split("No scores were found")[1]


@pytest.mark.parametrize(
    ("name", "content", "named"),
    [
        ("bench/scoring.json", "[]", "holds an array, not a measurement"),
        ("probes.json", "[1]", "holds an array, not a measurement"),
        ("bench/memory.json", "{not json", "is not JSON (Expecting property name"),
        ("bench/scoring.json", '{"command": "pipeline bench scoring --items 9", "results": 3}',
         "holds results that are a number"),
    ],
    ids=["bench-array", "probes-array", "not-json", "results-number"],
)  # fmt: skip
def test_a_measurement_that_is_not_one_is_refused_naming_the_file_and_its_command(report_of, name, content, named):
    out = report_of.parent / "reports"
    (out / name).parent.mkdir(parents=True, exist_ok=True)
    (out / name).write_text(content)
    recorded = "pipeline bench scoring --items 9" if "command" in content else None
    command = recorded or ("pipeline probes" if name == "probes.json" else f"pipeline bench --out {out / 'bench'} memory")
    if name == "bench/scoring.json" and recorded is None:
        command = f"pipeline bench --out {out / 'bench'} scoring"
    refused(cli("report", "--params", report_of), f"{out / name} ", named, f"rerun `{command}` to rewrite it")


@pytest.mark.parametrize(
    ("content", "named"),
    [
        ("[1]", "it holds an array, not an object"),
        ('{"x": 1}', "it has no `encoders` object"),
        ("{not json", "is not JSON"),
        ('{"encoders": {"toy": {"open_clip_model": "m", "variants": {"clip": {"means": {"all-task": 1}}}}}}',
         "the means of 'clip' on 'toy'"),
    ],
    ids=["array", "no-encoders", "not-json", "bad-means"],
)  # fmt: skip
def test_an_encoder_summary_that_is_not_one_is_refused_not_called_absent(report_of, content, named):
    assert "encoders.json` is absent: run `pipeline compare-encoders`" in report_text(report_of)
    summary = report_of.parent / "encoders.json"
    summary.write_text(content)
    refused(cli("report", "--params", report_of), str(summary), named, "rerun `pipeline compare-encoders`")


@pytest.mark.parametrize(("content", "named"), [
    ('{"results": ', "is not JSON"), ("[1]", "holds an array, not a measurement"), ('{"x": 1}', "lacks the Sinkhorn bench's 'n_problems'"),
])  # fmt: skip
def test_bindclips_measurements_that_are_not_ones_are_named_with_their_command(tmp_path, content, named):
    """BindCLIP's section reads ``bench/scoring.json`` (its parameters) and
    ``bench/sinkhorn.json`` (its solver goal) through the checked reader: a damaged file is
    one line naming it and the command that rewrites it."""
    from pipeline.report import ReportContext
    from pipeline.scorers.bindclip.report import goals, parameters

    (tmp_path / "bench").mkdir()
    (tmp_path / "bench" / "sinkhorn.json").write_text(content)
    ctx = ReportContext({}, ReportConfig(out=str(tmp_path), bootstrap=50), ScoreConfig(), ExtractConfig(), tmp_path)
    with pytest.raises(ValueError, match=rf"sinkhorn\.json.* {named}.*rerun `pipeline bench --out \S+ sinkhorn` to rewrite it"):
        goals(ctx)
    if "lacks" not in named:
        (tmp_path / "bench" / "scoring.json").write_text(content)
        with pytest.raises(ValueError, match=rf"scoring\.json.* {named}.*rerun `pipeline bench --out \S+ scoring` to rewrite it"):
            parameters(tmp_path / "bench" / "scoring.json")


@pytest.mark.parametrize(
    "content",
    [
        "[1]",
        "{bad",
        '{"rank": 8, "heldout_auc": {"early": {"8": 0.97}}}',  # an older record: no beta level
        '{"rank": 8, "heldout_auc": {"early": {"8": {"0": 0.9, "3": 0.95}, "0": {"0": 0.9}}}}',  # a beta missing for one rank
    ],
)
def test_a_ridge_record_that_is_not_one_is_named_with_its_command(tmp_path, content):
    from pipeline.report import ReportContext
    from pipeline.scorers.geometry.report import RIDGE_RECORD, ridge_record

    score = ScoreConfig(checkpoints=str(tmp_path))
    (tmp_path / RIDGE_RECORD).parent.mkdir(parents=True, exist_ok=True)
    (tmp_path / RIDGE_RECORD).write_text(content)
    ctx = ReportContext({}, ReportConfig(out=str(tmp_path)), score, ExtractConfig(), tmp_path)
    with pytest.raises(ValueError, match=r"config\.json .*rerun `pipeline ridge` to rewrite it"):
        ridge_record(ctx)
