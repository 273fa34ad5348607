"""Re-read a GPU check's measurements with today's code: how steady the repeats are under each block
estimator, and how well a profile fitted to the probes predicts the GPU-sized workloads.

The GPU check (``python -m bench.gpu_check``) keeps every plan it measured and every iteration's time
(``DIR/work``); this script needs no GPU. Run on the H100 check of 2026-11-25 and the H200 checks of
2026-11-26 (bench/RESULTS.md §7):

    .venv/bin/python bench/gpu_refit.py bench/results/gpu_check_h200_2026-11-26c.tgz

Measurement: each calibration plan was measured 3 times (in those checks blocks of 8 iterations, 3 blocks); a
repeat's value is the median of its blocks' means (as the check ran) or of their medians (as the
measuring job now reports), the spread (max - min) / median of the 3. Fit: ``rec.calibrate.fit`` on the
probes the check's calibration measured, then predicted against measured on the calibration plans;
beside it the same fit given the probes and every workload the check measured (the calibration and
the TorchRec comparison plans; in-sample: what the cost model's form can explain at all), the fit to
the probes and every workload but one spec's predicting that spec's plans (out of sample: what probes
resembling the workloads could reach), and TorchRec's default profile. Coverage: the lookup bytes per iteration the
probes and the workloads span (a fit extrapolates beyond the probes' range).
"""

from __future__ import annotations

import argparse
import json
import sys
import tarfile
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def load(work: Path) -> tuple[list, list]:
    """(probes, workloads): (name, plan, [ms per block or repeat], [PlanTimes])."""
    from rec.plan import read_plan
    from rec.train.timings import read_timings

    probes = []
    for p in read_timings(work / "calibrate").plans:
        name = Path(p.plan_path).parent.name
        probes.append((name, read_plan(work / "calibrate/probes" / name / "plan.json"), p))
    measured: dict[str, list] = {}
    for folder in sorted(work.glob("measured-*")):
        for p in read_timings(folder).plans:
            measured.setdefault(Path(p.plan_path).parent.name, []).append(p)
    workloads = [(name, read_plan(work / "plans" / name / "plan.json"), runs) for name, runs in measured.items()]
    return probes, workloads


def block_means(times) -> np.ndarray:  # the estimator the check ran with
    total = times.total_ms()
    parts = np.array_split(np.arange(total.shape[1]), times.blocks)
    return np.stack([total[:, part].mean(axis=1) for part in parts], axis=1)


def spreads(runs, estimator) -> tuple[float, float]:
    values = [float(np.median(estimator(t), axis=1).max()) for t in runs]
    median = float(np.median(values))
    return median, (max(values) - min(values)) / median


def lookup_bytes(plan) -> float:
    from rec.spec import spec_from_rows

    spec = spec_from_rows(list(plan.spec_tables))
    by = {t.key: t for t in spec.tables}
    batch = plan.topology.batch_size * plan.world_size
    return float(sum(batch * by[t.key].pooling_factor * len(by[t.key].feature_names) * by[t.key].embedding_dim * 4
                     for t in plan.tables))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("check", help="a GPU check's --out directory, or a .tgz of it")
    p.add_argument("--out", default=str(ROOT / "bench/results/gpu_refit.json"))
    args = p.parse_args()

    from scipy.stats import spearmanr

    from rec.analysis.predict import predicted_ms
    from rec.calibrate.fit import Measured, fit_profile
    from rec.profile import DEFAULT_PROFILE
    from rec.topology import read_topology

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(args.check)
        if root.is_file():
            with tarfile.open(root) as tar:
                tar.extractall(tmp, filter="data")
            root = Path(tmp)
        work = root / "work"
        probes, workloads = load(work)
        topology = read_topology(work / "calibrate.topology.yaml")
        calibration = [w for w in workloads if w[0].startswith("spec")]

        rows = []
        for name, plan, runs in calibration:
            _, s_mean = spreads(runs, block_means)
            m_med, s_med = spreads(runs, lambda t: t.block_ms())
            rows.append({"plan": name, "measured_ms": m_med, "spread_block_means": s_mean,
                         "spread_block_medians": s_med, "lookup_gb": lookup_bytes(plan) / 1e9})
        measured = {r["plan"]: r["measured_ms"] for r in rows}

        def accuracy(profile, predicted: list[float] | None = None) -> dict:
            predicted = predicted or [float(predicted_ms(plan, profile).max()) for name, plan, _ in calibration]
            actual = [measured[name] for name, _, _ in calibration]
            errors = [p_ / m - 1 for p_, m in zip(predicted, actual, strict=True)]
            return {"median_abs_error": float(np.median(np.abs(errors))),
                    "max_abs_error": float(np.max(np.abs(errors))), "spearman": float(spearmanr(predicted, actual)[0])}

        probe_measured = [Measured(n, plan, t.critical_path_ms()) for n, plan, t in probes]
        from_probes = fit_profile(probe_measured, topology, 0.2)
        every = {name: spreads(runs, lambda t: t.block_ms())[0] for name, _, runs in workloads}
        in_sample = fit_profile(probe_measured + [Measured(n, plan, every[n]) for n, plan, _ in workloads],
                                topology, 0.2)
        # Out of sample: each spec's plans predicted by the fit to every other workload (what probes
        # that look like the workloads, the mixed ones, could reach at best).
        loo_predicted = []
        for name, plan, _ in calibration:
            spec = name.split("_")[0]
            others = probe_measured + [Measured(n, pl, every[n]) for n, pl, _ in workloads if n.split("_")[0] != spec]
            loo_predicted.append(float(predicted_ms(plan, fit_profile(others, topology, 0.2).profile).max()))
        vs: dict[str, dict[str, dict[str, float]]] = {}
        for name, _, runs in workloads:
            if not name.startswith("spec"):
                shape, label = name.rsplit("_", 1)
                median, spread = spreads(runs, lambda t: t.block_ms())
                vs.setdefault(shape, {})[label] = {"measured_ms": median, "spread": spread}
        for row in vs.values():
            base = row.get("torchrec", {}).get("measured_ms", float("nan"))
            for v in row.values():
                v["ratio"] = v["measured_ms"] / base
        summary: dict[str, Any] = {"vs_torchrec": vs,
            "default": accuracy(DEFAULT_PROFILE), "fitted_to_probes": accuracy(from_probes.profile),
            "fitted_to_the_workloads_in_sample": accuracy(in_sample.profile),
            "fitted_to_the_other_specs": accuracy(None, loo_predicted),
            "probe_residual_median": from_probes.median_abs_error,
            "spread_max": {"block_means": max(r["spread_block_means"] for r in rows),
                           "block_medians": max(r["spread_block_medians"] for r in rows)},
            "lookup_gb_range": {"probes": [min(lookup_bytes(pl) for _, pl, _ in probes) / 1e9,
                                           max(lookup_bytes(pl) for _, pl, _ in probes) / 1e9],
                                "workloads": [min(r["lookup_gb"] for r in rows), max(r["lookup_gb"] for r in rows)]},
        }
    print(f"{'plan':22} {'measured ms':>11} {'spread (means)':>14} {'spread (medians)':>16} {'lookups GB':>10}")
    for r in rows:
        print(f"{r['plan']:22} {r['measured_ms']:11.2f} {r['spread_block_means']:14.1%} "
              f"{r['spread_block_medians']:16.1%} {r['lookup_gb']:10.2f}")
    for key in ("default", "fitted_to_probes", "fitted_to_the_workloads_in_sample", "fitted_to_the_other_specs"):
        s = summary[key]
        print(f"{key:36s} median |error| {s['median_abs_error']:6.1%}  max {s['max_abs_error']:6.1%}  "
              f"Spearman {s['spearman']:.3f}")
    print(f"lookups per iteration, GB: probes {summary['lookup_gb_range']['probes']}, workloads "
          f"{summary['lookup_gb_range']['workloads']}")
    print("\nthe TorchRec comparison's plans (block medians): measured ms, spread, ratio to TorchRec's plan")
    for shape, row in summary["vs_torchrec"].items():
        print(f"  {shape:14s} " + "  ".join(f"{label} {v['measured_ms']:.2f} ms ({v['spread']:.0%}) {v['ratio']:.2f}x"
                                            for label, v in row.items()))
    Path(args.out).write_text(json.dumps({"plans": rows, "summary": summary}, indent=1) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
