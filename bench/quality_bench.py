"""Model quality against the best possible: the demo trained on planted-signal data, its eval AUC
and logloss beside the Bayes-optimal ones, in one run.

For each seed: ``examples/make_ctr_data.py`` writes a train and an eval set drawn from one planted
model (so the AUC and logloss of the true click probabilities, which no model beats in
expectation, are known), ``shardflow train`` trains the DLRM on it with ``--eval-data`` (real
torchrun, 2 gloo ranks by default), and ``shardflow export`` + ``shardflow predict`` give the
exported model's predictions, whose AUC must equal the run's. Prints, per seed and as medians: eval
AUC / Bayes AUC, eval logloss / Bayes logloss, NE, and the time the ranks waited for data as a
share of the iteration (p50 and mean).

    .venv/bin/python bench/quality_bench.py                  # the CPU demo, 3 seeds
    .venv/bin/python bench/quality_bench.py --seeds 5 --iterations 600
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.train_bench import shardflow  # noqa: E402
from examples import make_ctr_data as ctr  # noqa: E402
from rec.evaluation.auc import auc  # noqa: E402


def one_seed(seed: int, args: argparse.Namespace, tmp: Path) -> dict[str, float]:
    data = tmp / f"data{seed}"
    truth = ctr.generate(replace(ctr.CtrSettings(), seed=seed, files=args.files), data)
    plan, out = tmp / f"plan{seed}", tmp / f"train{seed}"
    shardflow("plan", "--no-track", str(data / "spec.yaml"), "--topology", args.topology, "--out", str(plan))
    shardflow("train", "--no-track", "--plan", str(plan), "--out", str(out),
              "--data", str(data / ("train" if args.files > 1 else "train.parquet")),
              "--eval-data", str(data / "eval.parquet"), "--iterations", str(args.iterations),
              "--checkpoint-every", str(args.iterations), "--seed", str(seed))
    m = json.loads((out / "train_metrics.json").read_text())
    shardflow("export", "--checkpoint", str(out), "--out", str(tmp / f"model{seed}"))
    shardflow("predict", "--model", str(tmp / f"model{seed}"), "--data", str(data / "eval.parquet"),
              "--out", str(tmp / f"p{seed}.parquet"))
    p = pq.read_table(tmp / f"p{seed}.parquet").column("prediction").to_numpy().astype(np.float64)
    labels = pq.read_table(data / "eval.parquet").column("label").to_numpy()
    predicted_auc = auc(p, labels)
    ev, wait, lat = m["eval"], m["data_wait_ms"], m["iteration_latency_ms"]
    return {"seed": seed, "eval_auc": ev["auc"], "bayes_auc": truth.bayes_auc_empirical,
            "auc_ratio": ev["auc"] / truth.bayes_auc_empirical, "eval_logloss": ev["logloss"],
            "bayes_logloss": truth.bayes_logloss, "logloss_ratio": ev["logloss"] / truth.bayes_logloss,
            "ne": ev["ne"], "predict_auc": predicted_auc or float("nan"),
            "predict_minus_run_auc": (predicted_auc or float("nan")) - ev["auc"],
            "wait_p50_share": wait["p50"] / lat["p50"], "wait_mean_share": wait["mean"] / lat["mean"],
            "iteration_p50_ms": lat["p50"], "epochs": m["data"]["epochs"]}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--topology", default=str(ROOT / "examples/topologies/cpu_2proc.yaml"))
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--iterations", type=int, default=400)
    p.add_argument("--files", type=int, default=4, help="train files the data is written in")
    p.add_argument("--out", default=str(ROOT / "bench/results/quality_bench.json"))
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        rows = [one_seed(seed, args, Path(tmp)) for seed in range(args.seeds)]
    columns = ("seed", "eval_auc", "bayes_auc", "auc_ratio", "eval_logloss", "bayes_logloss", "logloss_ratio", "ne",
               "predict_minus_run_auc", "wait_p50_share", "wait_mean_share", "iteration_p50_ms")
    print(" ".join(f"{c:>13}" for c in columns))
    for row in rows:
        print(" ".join(f"{row[c]:>13.4g}" for c in columns))
    medians = {c: statistics.median(row[c] for row in rows) for c in columns[1:]}
    print(" ".join([f"{'median':>13}", *(f"{medians[c]:>13.4g}" for c in columns[1:])]))
    Path(args.out).write_text(json.dumps({"args": vars(args), "runs": rows, "medians": medians}, indent=1) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
