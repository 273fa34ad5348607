"""What a further embedding module costs, measured, and whether a calibrated profile predicts it.

Each embedding module (an EmbeddingBagCollection or EmbeddingCollection) runs its own input and
output distribution per sharding type. So the same tables cost more spread over several modules,
which neither TorchRec's estimator nor a per-shard cost model sees. This bench measures, on the
topology's ranks:
- four table_wise tables in 1, 2 and 4 modules;
- the two multi-module examples (`examples/specs/sparse_nn.yaml`, `examples/specs/two_tower_seq.yaml`);
each planned under TorchRec's default profile and timed by `shardflow measure` (`--repeats` times,
median).

They are predicted by three profiles from one `shardflow calibrate` run:
- TorchRec's defaults;
- the fit to the probes without the ones that split a type over two modules (`<type>_modules2`), which
  is what calibration fitted before `module_sharding_type_ms`;
- the fit to every probe.

All three come from the same measurements, in one run:

    .venv/bin/python bench/modules_bench.py [--topology examples/topologies/cpu_2proc.yaml] [--repeats 2] \\
        [--quick] [--out bench/results/modules_bench_cpu.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

SHARDFLOW = str(Path(sys.executable).parent / "shardflow")
EXAMPLES = ("sparse_nn", "two_tower_seq")
ROWS = (100_000, 50_000, 20_000, 20_000)
SPLIT = "_modules2"  # the probes that split a sharding type over two modules


def tables_in(modules: int) -> list[dict[str, Any]]:
    """Four table_wise tables spread over ``modules`` embedding modules."""
    return [{"name": f"t{i}", "num_embeddings": rows, "embedding_dim": 32, "pooling_factor": 2.0,
             "sharding_types": ["table_wise"], "module": f"model.m{i % modules}"} for i, rows in enumerate(ROWS)]


def run(args: list[str]) -> None:
    r = subprocess.run([SHARDFLOW, *args], capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"modules_bench: shardflow {args[0]} failed (exit {r.returncode}): {r.stderr.strip()[-500:]}")


def calibrated(topology_file: Path, work: Path, quick: bool) -> tuple[Any, Any]:
    """(fit to every probe, fit without the two-module probes) from one calibration's measurements."""
    from rec.calibrate.fit import Measured, fit_profile
    from rec.plan import read_plan
    from rec.topology import read_topology

    run(["calibrate", "--topology", str(topology_file), "--out", str(work / "profile.yaml"), "--work",
         str(work / "calibrate"), *(["--quick"] if quick else [])])
    report = json.loads((work / "profile.fit.json").read_text())
    folders = {d.name.split("_", 1)[1]: d for d in (work / "calibrate/probes").iterdir()}  # 000_<probe>
    measured = [Measured(p["name"], read_plan(folders[p["name"]] / "plan.json"), float(p["measured_ms"]))
                for p in report["probes"] if p.get("measured_ms")]
    topology = read_topology(topology_file)
    every = fit_profile(measured, topology, 0.2)
    before = fit_profile([m for m in measured if not m.name.endswith(SPLIT)], topology, 0.2)
    return every, before


def workloads(topology_file: Path, work: Path) -> list[tuple[str, Any]]:
    """(name, plan) of each workload, planned under TorchRec's default profile and written under ``work``."""
    from rec.plan.io import write_plan
    from rec.planning import plan_spec
    from rec.spec import read_spec, spec_from_rows
    from rec.topology import read_topology

    topology = read_topology(topology_file)
    specs = [(f"modules{n}", spec_from_rows(tables_in(n), source=f"modules{n}")) for n in (1, 2, 4)]
    specs += [(name, read_spec(ROOT / "examples/specs" / f"{name}.yaml")) for name in EXAMPLES]
    out = []
    for name, spec in specs:
        plan = plan_spec(spec, topology)
        write_plan(plan, work / "plans" / name)
        out.append((name, plan))
    return out


def measured_ms(plan_dir: Path, out: Path, repeats: int) -> list[float]:
    times = []
    for r in range(repeats):
        run(["measure", "--plan", str(plan_dir), "--out", str(out / f"r{r}"), "--no-track"])
        times.append(float(json.loads((out / f"r{r}" / "measure.json").read_text())["critical_path_measured"]))
    return times


def main(argv: list[str] | None = None) -> int:
    from rec.analysis.rank_times import predicted_ms
    from rec.profile import DEFAULT_PROFILE
    from rec.sharding import modules_using

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--topology", type=Path, default=ROOT / "examples/topologies/cpu_2proc.yaml")
    p.add_argument("--repeats", type=int, default=2, help="measurements of each workload (default 2; the median)")
    p.add_argument("--quick", action="store_true", help="calibrate --quick (a rough profile, fewer probes)")
    p.add_argument("--out", type=Path, default=ROOT / "bench/results/modules_bench_cpu.json")
    args = p.parse_args(argv)
    if args.repeats < 1:
        p.error("--repeats must be at least 1")
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        every, before = calibrated(args.topology, work, args.quick)
        profiles = {"torchrec_default": DEFAULT_PROFILE, "calibrated_before": before.profile,
                    "calibrated": every.profile}
        rows: list[dict[str, Any]] = []
        for name, plan in workloads(args.topology, work):
            times = measured_ms(work / "plans" / name, work / "measured" / name, args.repeats)
            median = statistics.median(times)
            predicted = {k: float(predicted_ms(plan, prof).max()) for k, prof in profiles.items()}
            using = modules_using(plan.columns.sharding_type, plan.columns.modules)
            rows.append({"workload": name, "modules": len(set(plan.columns.modules)),
                         "modules_per_type": {st.value: n for st, n in using.items()}, "measured_ms": median,
                         "repeats_ms": times, "predicted_ms": predicted,
                         "error": {k: v / median - 1 for k, v in predicted.items()}})
            print(f"{name:14s} {rows[-1]['modules']} module(s)  measured {median:7.2f} ms  "
                  + "  ".join(f"{k} {v:7.2f} ({v / median - 1:+.0%})" for k, v in predicted.items()), flush=True)
    summary = {k: statistics.median(abs(r["error"][k]) for r in rows) for k in profiles}
    module_terms = {st.value: ms for st, ms in every.profile.extensions.module_sharding_type_ms}
    print("median |error|: " + ", ".join(f"{k} {v:.1%}" for k, v in summary.items()))
    print(f"fitted module_sharding_type_ms: {module_terms}; probes' median |residual| "
          f"{before.median_abs_error:.1%} without the two-module probes, {every.median_abs_error:.1%} with")
    args.out.write_text(json.dumps({"topology": str(args.topology), "repeats": args.repeats, "quick": args.quick,
                                    "workloads": rows, "median_abs_error": summary,
                                    "module_sharding_type_ms": module_terms,
                                    "probe_residual_median": {"calibrated_before": before.median_abs_error,
                                                              "calibrated": every.median_abs_error}},
                                   indent=1) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
