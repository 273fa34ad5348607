"""Training on your data with real torchrun ranks (gloo, 2 processes): a planted-signal dataset in
several files, evaluated over both ranks' samples; the checkpoint evaluated again by ``shardflow
eval``, exported and predicted in one process with the same AUC and logloss; bad data named before
launch, and bad data the sample missed stopping the ranks as bad input (exit 2, never retried)."""

from __future__ import annotations

import contextlib
import io
import json
import shutil
import subprocess
from dataclasses import replace

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from examples import make_ctr_data as ctr
from flows.cli import main
from rec.evaluation.auc import auc
from rec.evaluation.logloss import logloss
from tests.flows.cli_in_process import shardflow_here
from tests.flows.going_on import going_on
from tests.paths import CPU_2PROC

SETTINGS = replace(ctr.CtrSettings(), tables=4, rows=2_000, dim=8, dense_in_features=4, train_rows=24_000,
                   eval_rows=6_000, files=3, rows_per_group=2_000)


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    root = tmp_path_factory.mktemp("ctr")
    truth = ctr.generate(SETTINGS, root)
    assert main(["plan", "--no-track", str(root / "spec.yaml"), "--topology", str(CPU_2PROC),
                 "--out", str(root / "plan")]) == 0
    return root, truth


def train(capfd, *args: str) -> subprocess.CompletedProcess[str]:
    """``shardflow train --no-track ARGS``, in this process."""
    return shardflow_here(capfd, "train", "--no-track", *args)


@pytest.fixture(scope="module")
def trained(dataset, tmp_path_factory):
    root, _ = dataset
    out = tmp_path_factory.mktemp("run")
    stdout, stderr = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):  # in this process
        code = main(["train", "--no-track", "--plan", str(root / "plan"), "--out", str(out),
                     "--data", str(root / "train"), "--eval-data", str(root / "eval.parquet"), "--eval-every", "40",
                     "--iterations", "120", "--warmup", "5", "--batch-size", "256", "--dense-in-features", "4",
                     "--checkpoint-every", "120",
                     # TorchRec's pipeline, detached for each evaluation and attached again with its batches in
                     # flight (auto picks the naive loop on cpu; its evaluations are the same numbers)
                     "--pipeline", "sparse_dist"])
    assert code == 0, stdout.getvalue()[-3000:] + stderr.getvalue()[-3000:]
    return out, stdout.getvalue()


@pytest.mark.slow
def test_two_ranks_train_on_files_evaluate_every_sample_and_learn_the_planted_signal(dataset, trained):
    root, truth = dataset
    out, summary = trained
    m = json.loads((out / "train_metrics.json").read_text())
    assert [e["iteration"] for e in m["evaluations"]] == [40, 80, 120]
    assert m["eval"]["samples"] == SETTINGS.eval_rows  # every row of the eval data, from both ranks
    assert m["eval"]["auc"] > 0.9 * truth.bayes_auc_empirical
    assert m["data"] == {"source": str(root / "train"), "rows": SETTINGS.train_rows, "files": 3,
                         "epochs": pytest.approx(120 * 256 / (SETTINGS.train_rows // 2)), "ids": "error",
                         "shuffle": True, "seed": 0, "resumed": None}
    waits = pq.read_table(out / "iterations.parquet").column("data_wait_ms").to_numpy()
    assert len(waits) == 120 and (waits >= 0).all()
    assert "eval      auc " in summary and f"on {SETTINGS.eval_rows:,} held-out samples" in summary
    assert f"data      {root / 'train'} ({SETTINGS.train_rows:,} rows in 3 files)" in summary


@pytest.mark.slow
def test_the_checkpoint_evaluated_exported_and_predicted_gives_the_runs_numbers(dataset, trained, tmp_path, capfd):
    root, _ = dataset
    out, _ = trained
    final = json.loads((out / "train_metrics.json").read_text())["eval"]
    # Read while its training goes on: a checkpoint every 50 ms (the newest's copy), one kept. The
    # step read is held, not pruned under the ranks evaluating it or the export reading it.
    live = tmp_path / "live"
    shutil.copytree(out / "checkpoints", live / "checkpoints")
    with going_on(live / "checkpoints", every_s=0.05) as written:
        r = shardflow_here(capfd, "eval", "--checkpoint", str(live), "--data", str(root / "eval.parquet"),
                           "--out", str(tmp_path / "eval"), "--batch-size", "256")
        exported = shardflow_here(capfd, "export", "--checkpoint", str(live / "checkpoints"),
                                  "--out", str(tmp_path / "model"))
    assert r.returncode == 0, r.stderr[-3000:]
    again = json.loads((tmp_path / "eval" / "eval_metrics.json").read_text())
    assert 120 <= again["step"] < written[-1] and again["eval"] == pytest.approx(final)
    assert exported.returncode == 0, exported.stderr[-3000:]
    assert again["step"] <= json.loads((tmp_path / "model" / "model.json").read_text())["step"] <= written[-1]
    rows = pq.read_table(root / "eval.parquet")
    dense = rows.column("dense").to_pylist()
    dense[0] = dense[5] = [3e38] * len(dense[0])  # finite in float32, too large for the model: NaN outputs
    column = rows.schema.get_field_index("dense")
    pq.write_table(rows.set_column(column, "dense", pa.array(dense, rows.schema.field(column).type)),
                   tmp_path / "huge.parquet")
    done = shardflow_here(capfd, "predict", "--model", str(tmp_path / "model"), "--data",
                          str(tmp_path / "huge.parquet"), "--out", str(tmp_path / "huge_p.parquet"))
    assert done.returncode == 0 and "note      2 of the predictions are NaN" in done.stdout
    assert {p.name for p in (tmp_path / "model").iterdir()} == {"model.safetensors", "model.json"}
    done = shardflow_here(capfd, "predict", "--model", str(tmp_path / "model"), "--data", str(root / "eval.parquet"),
                          "--out", str(tmp_path / "p.parquet"))
    assert done.returncode == 0, done.stderr
    p = pq.read_table(tmp_path / "p.parquet").column("prediction").to_numpy().astype(np.float64)
    labels = pq.read_table(root / "eval.parquet").column("label").to_numpy()
    assert len(p) == SETTINGS.eval_rows
    assert auc(p, labels) == pytest.approx(final["auc"], abs=1e-6)  # the same model, one row per input row in order
    assert logloss(np.log(p) - np.log1p(-p), labels) == pytest.approx(final["logloss"], rel=1e-5)
    rows = pq.read_table(root / "eval.parquet")
    ids = rows.column("cat_2").to_pylist()
    ids[3] = [SETTINGS.rows + 7]
    pq.write_table(rows.set_column(rows.schema.get_field_index("cat_2"), "cat_2", pa.array(ids, pa.list_(pa.int64()))),
                   tmp_path / "far.parquet")
    for data, out, named in ((tmp_path / "far.parquet", tmp_path / "far_p.parquet",
                              "the model takes ids in range only (it was trained with --ids error)"),
                             (root / "eval.parquet", tmp_path / "p.parquet/sub.parquet", "--out: cannot write")):
        refused = shardflow_here(capfd, "predict", "--model", str(tmp_path / "model"), "--data", str(data),
                                 "--out", str(out))
        assert refused.returncode == 2 and named in refused.stderr and "Traceback" not in refused.stderr
        assert "--ids modulo" not in refused.stderr and not out.exists()
    # eval takes the model's ids policy too: it has no --ids to suggest
    refused = shardflow_here(capfd, "eval", "--checkpoint", str(trained[0]), "--data", str(tmp_path / "far.parquet"),
                             "--out", str(tmp_path / "far_eval"))
    assert refused.returncode == 2 and "--ids modulo" not in refused.stderr, refused.stderr
    assert "the model takes ids in range only (it was trained with --ids error)" in refused.stderr
    kept = (root / "eval.parquet").read_bytes()
    for out in (tmp_path / "p.parquet", root / "eval.parquet"):  # earlier predictions, or the data itself
        refused = shardflow_here(capfd, "predict", "--model", str(tmp_path / "model"), "--data",
                                 str(root / "eval.parquet"), "--out", str(out))
        assert refused.returncode == 2 and f"--out: {out} exists" in refused.stderr
    assert (root / "eval.parquet").read_bytes() == kept
    refused = shardflow_here(capfd, "export", "--checkpoint", str(out), "--out", str(tmp_path / "p.parquet"))
    assert refused.returncode == 2 and "is a file, not a folder: --out names the folder the model goes into; give " \
        "a new --out" in " ".join(refused.stderr.split())
    # checkpoints an early shardflow wrote, without model.json and the plan's copy: the way on is named
    early = tmp_path / "early"
    shutil.copytree(trained[0] / "checkpoints", early / "checkpoints")
    for name in ("model.json", "plan.json"):
        (early / "checkpoints" / name).unlink()
    for command in (["export", "--checkpoint", str(early), "--out", str(tmp_path / "early_model")],
                    ["eval", "--checkpoint", str(early), "--data", str(root / "eval.parquet"), "--out",
                     str(tmp_path / "early_eval")]):
        refused = shardflow_here(capfd, *command)
        assert refused.returncode == 2 and "Traceback" not in refused.stderr, refused.stderr
        assert "resumed for more iterations (`shardflow train --plan PLAN --out OUT --resume --iterations N`), its " \
               "training records them" in " ".join(refused.stderr.split())


@pytest.mark.slow
def test_a_resume_that_forgets_data_is_refused_not_trained_on_synthetic_batches(dataset, trained, tmp_path, capfd):
    """Without --data a resume of a training on files went on, exit 0, on synthetic batches, saying only
    that "the data or its order changed"."""
    root, _ = dataset
    out = tmp_path / "resumed"
    shutil.copytree(trained[0] / "checkpoints", out / "checkpoints")
    common = ("--plan", str(root / "plan"), "--out", str(out), "--batch-size", "256", "--dense-in-features", "4")
    for resume in (("--resume",), ("--resume-from", str(trained[0]))):
        r = train(capfd, *common, *resume, "--iterations", "130")
        assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr[-2000:]
        assert "Cannot resume this training without its data:" in r.stderr
        assert "--data: is not given, but the checkpoint's training read a dataset" in " ".join(r.stderr.split())
    assert not (out / "logs").exists()  # refused before any rank started


@pytest.mark.slow
def test_bad_values_the_sample_missed_stop_the_ranks_as_bad_input(dataset, tmp_path, capfd):
    root, _ = dataset
    rows = pa.concat_tables([pq.read_table(root / "train"), pq.read_table(root / "eval.parquet")])  # 30,000 rows
    ids = rows.column("cat_2").to_pylist()
    ids[25_000] = [SETTINGS.rows + 7]  # beyond the 20,000 rows the check before launch reads of this row group
    column = rows.schema.get_field_index("cat_2")
    rows = rows.set_column(column, "cat_2", pa.array(ids, pa.list_(pa.int64())))
    labels = rows.column("label").to_pylist()
    labels[25_003] = 2  # a second problem the sample missed: the ranks name both, as the check before launch would
    label = rows.schema.get_field_index("label")
    rows = rows.set_column(label, "label", pa.array(labels, rows.schema.field(label).type))
    pq.write_table(rows, tmp_path / "late.parquet", row_group_size=30_000)
    r = train(capfd, "--plan", str(root / "plan"), "--out", str(tmp_path / "out"),
              "--data", str(tmp_path / "late.parquet"),
              "--iterations", "60", "--warmup", "1", "--batch-size", "256", "--dense-in-features", "4",
              "--no-shuffle")
    assert r.returncode == 2, r.stderr[-3000:]
    assert "the training failed" in r.stderr  # in a rank, after the launch
    assert "column 'cat_2'" in r.stderr and "first 2007 at row 25,000 of" in r.stderr and "--ids modulo" in r.stderr
    assert "(and 1 more problem)" in r.stderr
    assert "\n  - --data column 'label': 1 label not 0 or 1 in " in r.stderr and "at row 25,003 of" in r.stderr
    assert "Traceback" not in r.stderr


def test_bad_data_is_named_column_by_column_before_launch(dataset, tmp_path, capfd):
    root, _ = dataset
    rows = pq.read_table(root / "eval.parquet")
    bad = rows.set_column(0, "label", pa.array(["yes"] * rows.num_rows)).drop_columns(["cat_1"])
    pq.write_table(bad, tmp_path / "bad.parquet")
    r = shardflow_here(capfd, "train", "--no-track", "--plan", str(root / "plan"), "--out", str(tmp_path / "o"),
                       "--data", str(tmp_path / "bad.parquet"), "--eval-data", str(root / "eval.parquet"),
                       "--dense-in-features", "5")
    assert r.returncode == 2
    assert "--data: has no column 'cat_1'" in r.stderr
    assert "--data column 'label': is string" in r.stderr
    assert "--eval-data column 'dense': holds 4 values per row; --dense-in-features is 5" in r.stderr
    assert not (tmp_path / "o" / "logs").exists()  # nothing launched
