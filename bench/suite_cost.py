"""Where the test suite's CPU goes: every process on this machine sampled while a command runs
(``make test`` by default), each given a kind (a torchrun launch, a Prefect server, a CLI command,
a pytest worker, lint ...) and the test that started it (the ``PYTEST_CURRENT_TEST`` it inherited).

The suite is CPU-bound on 2 cores (the cores are busy ~95% of it), so its wall time is about its CPU
over the cores: this is what shows what a faster suite must cut. Processes are read every
``--every`` seconds: one that lives less than that may be missed, and the last interval of each is;
the machine's own busy time (/proc/stat) over the run is printed beside the sampled sum. A pytest
worker's own work is one line ("pytest worker"), not split by test.

    .venv/bin/python bench/suite_cost.py --out /tmp/suite_cost.json                  # make test, ~11 min
    .venv/bin/python bench/suite_cost.py --out /tmp/sc.json -- .venv/bin/python -m pytest -n auto \\
        --dist loadfile tests/flows
    .venv/bin/python bench/suite_cost.py --imports 5     # what a new interpreter's imports cost

``--imports N``: the CPU of a new interpreter that imports each package the suite's processes start
with (median of N, alternating), the floor under each process of that kind.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import subprocess
import sys
import threading
import time
from collections import Counter, defaultdict
from dataclasses import dataclass
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parents[1]
BUDGET_MINUTES = 6.0  # the brief's budget for the suite on the CI machine
IMPORTS = {  # what each kind of process imports before it does anything
    "nothing (python -c pass)": "pass",
    "torch (a launcher)": "import torch, torch.distributed.run",
    "torch, torchrec and the job (a launcher and its forkserver, together)":
        "import torch, torch.distributed.run, rec.train.job",
    "mlflow (a tracked command)": "import mlflow",
    "prefect (run, serve, a flow-run process)": "import prefect",
    "ray": "import ray",
    "the CLI itself (shardflow plan)": "import flows.cli, rec.planning",
    # the parser of every subcommand is built: what any shardflow command costs before its own work
    "a shardflow command refused at once (train without a plan)":
        "from flows.cli import main; main(['train', '--plan', '/nonexistent', '--out', '/nonexistent/out'])",
}


@dataclass
class Seen:
    cpu: float  # user + system seconds, at its last sample
    command: str
    test: str  # the test that started it ("" for a worker's own work and processes outside the suite)


KINDS = (  # (a part of the command line, the kind): the first that matches
    ("multiprocessing.forkserver", "training launch"), ("rec.train.launcher", "training launch"),
    ("torch.distributed.run", "training launch"), ("resource_tracker", "training launch"),
    ("-c import sys;exec(eval(sys.stdin.readline()))", "pytest worker"), ("xdist", "pytest worker"),
    ("-m pytest", "pytest"), ("bin/pytest", "pytest"), ("mypy", "lint"), ("ruff", "lint"), ("compileall", "lint"),
    ("create_app", "Prefect server"), ("prefect server", "Prefect server"), ("uvicorn", "Prefect server"),
    ("prefect.engine", "Prefect flow-run process"), ("ray::", "Ray"), ("/ray/", "Ray"), ("gcs_server", "Ray"),
    ("raylet", "Ray"),
    ("bench.gpu_check", "GPU check (cpu)"), ("examples/", "examples"), ("while True: pass", "busy loop (test)"),
)


def kind(command: str) -> str:
    """What a process is, from its command line."""
    match = re.search(r"(?:bin/shardflow|-m flows\.cli) (\w+)", command)
    if match:
        return f"shardflow {match.group(1)}"
    return next((name for needle, name in KINDS if needle in command), "other")


def sample(seen: dict[tuple[int, float], Seen], started: float, me: int) -> None:
    for p in psutil.process_iter(["pid", "cmdline", "cpu_times", "create_time"]):
        info = p.info
        if info["pid"] == me or info["cpu_times"] is None or info["create_time"] is None:
            continue
        if info["create_time"] < started - 1:
            continue  # the machine's own processes: in the busy time only
        key = (info["pid"], info["create_time"])
        cpu = info["cpu_times"].user + info["cpu_times"].system
        if key in seen:
            seen[key].cpu = cpu
            continue
        try:
            test = p.environ().get("PYTEST_CURRENT_TEST", "")
        except psutil.Error:
            test = ""
        seen[key] = Seen(cpu, " ".join(info["cmdline"] or ())[:300], test)


def busy_seconds() -> float:
    """CPU seconds every core has spent busy since boot (/proc/stat: all but idle and iowait)."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return (sum(fields) - fields[3] - fields[4]) / os.sysconf("SC_CLK_TCK")


def run(command: list[str], every: float) -> tuple[dict[tuple[int, float], Seen], float, float, int]:
    seen: dict[tuple[int, float], Seen] = {}
    started, busy0 = time.time(), busy_seconds()
    done = threading.Event()

    def loop() -> None:
        while not done.is_set():
            try:
                sample(seen, started, os.getpid())
            except psutil.Error:
                pass
            done.wait(every)

    sampler = threading.Thread(target=loop, daemon=True)
    sampler.start()
    code = subprocess.call(command, cwd=ROOT)
    done.set()
    sampler.join()
    return seen, time.time() - started, busy_seconds() - busy0, code


def report(seen: dict[tuple[int, float], Seen], wall: float, busy: float, code: int, command: list[str]) -> dict:
    by_kind: defaultdict[str, float] = defaultdict(float)
    count: Counter[str] = Counter()
    by_file: defaultdict[str, float] = defaultdict(float)
    for s in seen.values():
        k = kind(s.command)
        by_kind[k] += s.cpu
        count[k] += 1
        if s.test:
            by_file[s.test.split("::")[0]] += s.cpu
    sampled = sum(by_kind.values())
    cores = os.cpu_count() or 1
    print(f"{' '.join(command)}: exit {code}, {wall / 60:.1f} min; the {cores} cores busy {busy:,.0f} CPU-s "
          f"({busy / (wall * cores):.0%}), sampled {sampled:,.0f} CPU-s")
    print(f"{BUDGET_MINUTES:g} minutes on {cores} cores: {BUDGET_MINUTES * 60 * cores:,.0f} CPU-s\n")
    print(f"{'CPU-s':>7} {'share':>6} {'procs':>6}  kind")
    kinds = sorted(by_kind.items(), key=lambda kv: -kv[1])
    for k, v in kinds:
        print(f"{v:7.1f} {v / sampled:6.1%} {count[k]:6d}  {k}")
    print(f"\n{'CPU-s':>7}  test file (the processes its tests started)")
    files = sorted(by_file.items(), key=lambda kv: -kv[1])
    for f, v in files[:15]:
        print(f"{v:7.1f}  {f}")
    return {"command": command, "exit_code": code, "wall_s": round(wall, 1), "cores": cores,
            "busy_cpu_s": round(busy, 1), "sampled_cpu_s": round(sampled, 1),
            "by_kind": {k: {"cpu_s": round(v, 1), "processes": count[k]} for k, v in kinds},
            "by_test_file": {f: round(v, 1) for f, v in files},
            "processes": sorted(([round(s.cpu, 2), kind(s.command), s.test, s.command] for s in seen.values()),
                                reverse=True)}


def import_costs(repeats: int) -> dict[str, float]:
    """The median CPU seconds of a new interpreter that runs each of ``IMPORTS``."""
    times: defaultdict[str, list[float]] = defaultdict(list)
    for _ in range(repeats):
        for name, code in IMPORTS.items():
            before = resource.getrusage(resource.RUSAGE_CHILDREN)
            subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True)
            after = resource.getrusage(resource.RUSAGE_CHILDREN)
            times[name].append(after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime)
    medians = {name: float(sorted(t)[len(t) // 2]) for name, t in times.items()}
    print(f"{'CPU-s':>6}  a new interpreter importing (median of {repeats})")
    for name, cpu in medians.items():
        print(f"{cpu:6.2f}  {name}")
    return medians


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, help="write the breakdown here as JSON")
    p.add_argument("--every", type=float, default=0.25, help="seconds between samples (default 0.25)")
    p.add_argument("--imports", type=int, metavar="N", help="only time the imports, N times each")
    p.add_argument("command", nargs="*", default=["make", "test"], help="what to run (default: make test)")
    args = p.parse_args()
    if (args.imports is not None and args.imports < 1) or args.every <= 0:
        p.error("--imports must be at least 1 and --every above 0")
    if args.imports:
        medians = import_costs(args.imports)
        if args.out:
            args.out.write_text(json.dumps({"imports_cpu_s": medians}, indent=1) + "\n")
        return 0
    try:
        seen, wall, busy, code = run(args.command, args.every)
    except OSError as e:
        print(f"suite_cost.py: cannot run {args.command[0]}: {e.strerror or e}", file=sys.stderr)
        return 2
    result = report(seen, wall, busy, code, args.command)
    own = sum(resource.getrusage(resource.RUSAGE_SELF)[:2])
    print(f"\n(this script's own sampling: {own:.1f} CPU-s, in the busy time, not in the sampled sum)")
    result["sampler_cpu_s"] = round(own, 1)
    if args.out:
        args.out.write_text(json.dumps(result, indent=1) + "\n")
    return code


if __name__ == "__main__":
    sys.exit(main())
