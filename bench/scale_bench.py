"""Scale of the plan search: big power-law specs, local vs Ray, speed-up per actor, two Ray nodes.

Every row runs the real `shardflow plan` process (Ray start-up included where Ray is used) and
reports wall time, peak memory (max RSS of the CLI process, from /usr/bin/time) and plan quality.
Every Ray it starts, the two-node cluster included, listens on loopback only (``tasks.ray_loopback``).

    .venv/bin/python bench/scale_bench.py            # 10k/128 and 100k/1024 + actors + 2 nodes
    .venv/bin/python bench/scale_bench.py --quick    # 2k tables only
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
sys.path.insert(0, str(ROOT))

from rec.plan.io import PLAN_FILE  # noqa: E402
from rec.spec import write_spec  # noqa: E402
from rec.spec.synthetic import issue2282_spec, power_law_spec  # noqa: E402

# TorchRec reserves HBM for every feature's input batch: at batch 512, 100,000 power-law tables
# (pooling factors up to 50) would need 195 GiB per rank before any table, so that case uses 64.
BATCH = {10_000: 512, 100_000: 64, 2_000: 512}


def topology_file(directory: Path, world: int, batch: int = 512) -> Path:
    path = directory / f"h100_{world}_b{batch}.yaml"
    path.write_text(f"world_size: {world}\nlocal_world_size: 8\ncompute_device: cuda\n"
                    f"hbm_cap: 80GiB\nddr_cap: 128GiB\nbatch_size: {batch}\n")
    return path


def run_plan(spec: Path, topo: Path, out: Path, backend: str, groups: int | None = None,
             env: dict | None = None) -> dict:
    cmd = ["/usr/bin/time", "-f", "MAXRSS_KB=%M", str(BIN / "shardflow"), "plan", "--no-track", str(spec),
           "--topology", str(topo), "--out", str(out), "--backend", backend]
    if groups:
        cmd += ["--groups", str(groups)]
    began = time.perf_counter()
    r = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, **(env or {})})
    wall = time.perf_counter() - began
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{r.stderr[-3000:]}")
    plan = json.loads((out / PLAN_FILE).read_text())
    maxrss = re.search(r"MAXRSS_KB=(\d+)", r.stderr)
    assert maxrss is not None, "/usr/bin/time reported no MAXRSS_KB"
    rss = int(maxrss.group(1))
    # plan.json keeps no measured time; the CLI's "time:" line does ("..., search 3.21 s, ...")
    searched = re.search(r"^time:.*?\bsearch ([\d.]+) s", r.stdout, re.MULTILINE)
    m = plan["metrics"]
    return {"backend": backend, "groups": plan["planner"].get("groups"), "wall_s": round(wall, 2),
            "planning_s": float(searched.group(1)) if searched else None, "max_rss_mib": round(rss / 1024),
            "plan_json_mib": round((out / PLAN_FILE).stat().st_size / 2**20, 1),
            "critical_path": m["critical_path"], "lower_bound": m["lower_bound"],
            "gap_pct": round(100 * m["gap"], 2), "bound_method": m.get("bound_method"),
            "plan_id": plan["plan_id"]}


def actor_speedup(spec_tables: int, world: int, groups: int) -> list[dict]:
    """Search time with 1 and 2 actors on the same groups, Ray already running (no start-up)."""
    import ray

    from rec.planning import plan_spec
    from rec.topology import topology_from_dict
    from tasks.ray_loopback import start_local
    from tasks.ray_search import RaySearcher

    spec = power_law_spec(spec_tables, seed=0)
    topo = topology_from_dict(dict(world_size=world, local_world_size=8, compute_device="cuda",
                                   hbm_cap="80GiB", ddr_cap="128GiB"))
    start_local(num_cpus=os.cpu_count())  # on loopback only, as `shardflow plan --backend ray` starts it
    rows = []
    try:
        for actors in range(1, (os.cpu_count() or 1) + 1):
            began = time.perf_counter()
            plan = plan_spec(spec, topo, searcher=RaySearcher(groups=groups, actors=actors))
            rows.append({"actors": actors, "groups": groups, "seconds": round(time.perf_counter() - began, 2),
                         "critical_path": plan.metrics.critical_path})
    finally:
        ray.shutdown()
    base = rows[0]["seconds"]
    for row in rows:
        row["speedup"] = round(base / row["seconds"], 2)
    return rows


def two_node_cluster(spec: Path, topo: Path, out: Path) -> dict:
    """Two Ray nodes of one CPU each on this machine, every server on loopback
    (``tasks.ray_loopback.local_cluster``), joined by `shardflow plan` through RAY_ADDRESS."""
    import ray

    from tasks.ray_loopback import local_cluster, single_machine, single_machine_env

    with local_cluster(nodes=2, cpus_per_node=1) as address:
        with single_machine():  # this process joins it too, to count the nodes
            ray.init(address=address, log_to_driver=False)
            nodes = len([n for n in ray.nodes() if n["Alive"]])
            ray.shutdown()
        row = run_plan(spec, topo, out, "ray", groups=4, env={"RAY_ADDRESS": address, **single_machine_env()})
        row["ray_nodes"] = nodes
        return row


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true")
    p.add_argument("--skip-100k", action="store_true")
    p.add_argument("--out", default=str(ROOT / "bench" / "results" / "scale_bench.json"))
    args = p.parse_args()
    results: dict = {"machine_cpus": os.cpu_count(), "date": time.strftime("%Y-%m-%d")}
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        cases = [(2_000, 32)] if args.quick else [(10_000, 128)] + ([] if args.skip_100k else [(100_000, 1024)])
        results["scale"] = []
        for tables, world in cases:
            spec = d / f"power_law_{tables}.parquet"
            write_spec(power_law_spec(tables, seed=0), spec)
            topo = topology_file(d, world, BATCH[tables])
            for backend in ("local", "ray"):
                row = run_plan(spec, topo, d / f"out_{tables}_{backend}", backend)
                row.update(tables=tables, world_size=world, batch_size=BATCH[tables])
                results["scale"].append(row)
                print(json.dumps(row), flush=True)
        if not args.quick and not args.skip_100k:
            # Many small tables, mostly data_parallel: one replica per table and rank (100M shards).
            spec = d / "issue2282_100000.parquet"
            write_spec(issue2282_spec(100_000), spec)
            row = run_plan(spec, topology_file(d, 1024, 64), d / "out_2282", "local")
            row.update(tables=100_000, world_size=1024, batch_size=64, spec="issue2282")
            results["scale"].append(row)
            print(json.dumps(row), flush=True)
        small = (2_000, 32) if args.quick else (10_000, 128)
        results["actors"] = actor_speedup(*small, groups=8)
        for row in results["actors"]:
            print(json.dumps(row), flush=True)
        spec = d / "two_node.parquet"
        write_spec(power_law_spec(small[0], seed=0), spec)
        results["two_node"] = two_node_cluster(spec, topology_file(d, small[1]), d / "out_two_node")
        print(json.dumps(results["two_node"]), flush=True)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(results, indent=2) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
