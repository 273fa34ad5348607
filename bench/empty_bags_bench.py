"""Sparse features: a pooled table's empty bags, measured against the two ways to count its outputs.

A pooled feature with a pooling factor below 1 leaves some samples without ids. TorchRec 1.8's
estimator counts ``min(1, pooling factor)`` outputs per sample and feature (a count meant for
variable-batch features); without variable batches the kernel writes a pooled vector for every
sample and the output all-to-all moves it, as TorchRec 1.6 counts them. A profile's
``empty_bag_output_multiplier`` chooses (0: TorchRec 1.8's count, 1: one per sample; calibration
writes 1). This bench plans one comms-heavy shape (``--tables`` table_wise tables of
``--dim`` columns) at several pooling factors, measures every plan with ``shardflow measure``
(``--repeats`` times, in alternating order) and prints, per pooling factor, the measured critical
path against the prediction under the profile at 0 and at 1, side by side.

    .venv/bin/python bench/empty_bags_bench.py [--profile PROFILE] [--topology TOPO] [--repeats 3]
        [--out bench/results/empty_bags_bench.json]

Without ``--profile`` it first calibrates the topology's ranks (``shardflow calibrate --quick``).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
SHARDFLOW = Path(sys.executable).with_name("shardflow")
CPU_TOPOLOGY = {"world_size": 2, "local_world_size": 2, "compute_device": "cpu", "ddr_cap": "16GiB",
                "batch_size": 512}
POOLING_FACTORS = (0.05, 0.2, 0.5, 1.0, 2.0)


def _run(args: list[str]) -> None:
    done = subprocess.run([str(SHARDFLOW), *args], capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"shardflow {args[0]} exited {done.returncode}:\n{done.stderr[-2000:]}")


def _progress(line: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {line}", file=sys.stderr, flush=True)


def spec_rows(pooling_factor: float, tables: int, dim: int) -> list[dict[str, Any]]:
    return [{"name": f"t{i}", "num_embeddings": 100_000, "embedding_dim": dim, "pooling_factor": pooling_factor,
             "sharding_types": ["table_wise"]} for i in range(tables)]


def main(argv: list[str] | None = None) -> int:
    from rec.analysis.rank_times import predicted_ms
    from rec.plan import PLAN_FILE, read_plan
    from rec.profile import read_profile

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--profile", type=Path, help="a calibrated profile (default: calibrate the ranks first)")
    p.add_argument("--topology", type=Path, help="the ranks (default: 2 cpu ranks, batch 512)")
    p.add_argument("--tables", type=int, default=16)
    p.add_argument("--dim", type=int, default=256)
    p.add_argument("--repeats", type=int, default=3, help="measurements per plan; median reported")
    p.add_argument("--iterations", type=int, default=30)
    p.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "empty_bags_bench.json")
    args = p.parse_args(argv)

    with tempfile.TemporaryDirectory(prefix="empty_bags_") as tmp_name:
        tmp = Path(tmp_name)
        topology = args.topology
        if topology is None:
            topology = tmp / "topology.yaml"
            topology.write_text(yaml.safe_dump(CPU_TOPOLOGY), encoding="utf-8")
        profile_path = args.profile
        if profile_path is None:
            profile_path = tmp / "profile.yaml"
            _progress("calibrating (shardflow calibrate --quick)")
            _run(["calibrate", "--topology", str(topology), "--out", str(profile_path), "--quick"])
        profile = read_profile(profile_path)
        counts = {name: replace(profile, extensions=replace(profile.extensions, empty_bag_output_multiplier=m))
                  for name, m in (("torchrec_1_8", 0.0), ("one_per_sample", 1.0))}
        plans: dict[float, Path] = {}
        for pf in POOLING_FACTORS:
            spec = tmp / f"pf{pf}.yaml"
            spec.write_text(yaml.safe_dump({"tables": spec_rows(pf, args.tables, args.dim)}), encoding="utf-8")
            plans[pf] = tmp / f"plan_pf{pf}"
            _run(["plan", "--no-track", "--no-chart", str(spec), "--topology", str(topology), "--profile",
                  str(profile_path), "--out", str(plans[pf])])
        measured: dict[float, list[float]] = {pf: [] for pf in POOLING_FACTORS}
        for r in range(args.repeats):
            for pf in POOLING_FACTORS if r % 2 == 0 else reversed(POOLING_FACTORS):
                out = tmp / f"m_pf{pf}_{r}"
                _run(["measure", "--plan", str(plans[pf]), "--out", str(out), "--no-track",
                      "--iterations", str(args.iterations)])
                report = json.loads((out / "measure.json").read_text(encoding="utf-8"))
                measured[pf].append(float(report["critical_path_measured"]))
                _progress(f"pf {pf}: measured {measured[pf][-1]:.2f} ms (repeat {r + 1})")
        rows = []
        for pf in POOLING_FACTORS:
            plan = read_plan(plans[pf] / PLAN_FILE)
            median = statistics.median(measured[pf])
            row: dict[str, Any] = {"pooling_factor": pf, "measured_ms": median, "measured_all_ms": measured[pf]}
            for name, variant in counts.items():
                predicted = float(max(predicted_ms(plan, variant)))
                row[f"predicted_ms_{name}"] = predicted
                row[f"measured_over_predicted_{name}"] = median / predicted
            rows.append(row)

    from rec.text_table import render_table

    columns = ("pooling factor", "measured ms", "predicted, TorchRec 1.8's count", "measured / it",
               "predicted, one per sample", "measured / it")
    print(render_table(columns, [
        (f"{r['pooling_factor']:g}", f"{r['measured_ms']:.2f}", f"{r['predicted_ms_torchrec_1_8']:.2f}",
         f"{r['measured_over_predicted_torchrec_1_8']:.2f}", f"{r['predicted_ms_one_per_sample']:.2f}",
         f"{r['measured_over_predicted_one_per_sample']:.2f}") for r in rows], right=columns))
    for name in counts:
        ratios = [r[f"measured_over_predicted_{name}"] for r in rows]
        print(f"{name}: measured / predicted from {min(ratios):.2f} to {max(ratios):.2f} "
              f"(max / min {max(ratios) / min(ratios):.2f})")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"command": " ".join(sys.argv), "profile": profile.name, "tables": args.tables,
                                    "dim": args.dim, "repeats": args.repeats, "rows": rows}, indent=1) + "\n",
                        encoding="utf-8")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
