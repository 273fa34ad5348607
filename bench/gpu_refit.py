"""Re-read a GPU check's measurements with today's code: how steady the repeats are under each block
estimator, and how well a profile fitted to the probes predicts the GPU-sized workloads.

The GPU check (``python -m bench.gpu_check``) keeps every plan it measured and every iteration's time
(``DIR/work``); this script needs no GPU. It reads a check's ``--out`` directory or a .tgz of it, the
``work`` folder found whatever the folder above it is called (bench/RESULTS.md §7):

    .venv/bin/python bench/gpu_refit.py bench/results/gpu_check_h200_2026-11-26c.tgz
    .venv/bin/python bench/gpu_refit.py --all     # every bench/results/gpu_check_*.tgz, each apart

Each check's figures go to ``--out-dir``/gpu_refit_<name>.json (<name>: the archive's or folder's name
less ``gpu_check_``), or to ``--out`` when one check is given. A check that is missing or cannot be
read is one line on stderr naming it; the others are still re-read, and the exit status is then 2.

Measurement: each calibration plan was measured 3 times, each repeat in several blocks of iterations; a
repeat's value is the median of its blocks' means (as the checks of 2026-11-25 ran) or of their medians
(as the measuring job now reports), the spread (max - min) / median of the 3. Fit: ``rec.calibrate.fit``
on the probes the check's calibration measured, then predicted against measured on the calibration plans
the check judges (built-in and given; each plan's group as its ``gpu_check.json`` gives it) and, apart, on
its out-of-family ones;
beside it the same fit given the probes and every workload the check measured (the calibration and
the TorchRec comparison plans; in-sample: what the cost model's form can explain at all), the fit to
the probes and every workload but one spec's predicting that spec's plans (out of sample: what probes
resembling the workloads could reach), and TorchRec's default profile. Coverage: the lookup bytes per iteration the
probes and the workloads span (a fit extrapolates beyond the probes' range). Shapes of another generator: the
TorchRec comparison's plans (``bench.gpu_check.workloads.torchrec_shapes``) predicted by the same fit to the
probes, every plan and those without a fused_uvm_caching table apart (the checks archived until 2026-11-26
cycled 4 batches, whose ids flattered caches).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import tarfile
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

RESULTS = ROOT / "bench/results"
ARCHIVES = "gpu_check_*.tgz"
ACCURACIES = {"default": "default profile", "fitted_to_probes": "fitted to the probes",
              "fitted_to_the_workloads_in_sample": "in sample", "fitted_to_the_other_specs": "other specs' fit"}
CALIBRATION_KINDS = ("default", "calibrated")  # the calibration section plans each workload under both profiles
JUDGED = ("builtin", "given")  # the groups the calibration's own targets are over; out_of_family apart
OUT_OF_FAMILY_PREFIX = "oof_"  # bench.gpu_check.families names its workloads so
UNCACHED = "no fused_uvm_caching"
COMPARED = "TorchRec shapes, no cache"  # the comparison's plans without a fused_uvm_caching table, fitted to the probes


class CheckError(Exception):
    """A GPU check that cannot be re-read; the message is one line, the check's name put before it."""


def label(check: Path) -> str:
    """The name a check's output is filed under: gpu_check_h200_2026-11-26c.tgz -> h200_2026-11-26c."""
    name = check.name.removesuffix(".tgz").removesuffix(".tar.gz")
    return name.removeprefix("gpu_check_") or name


def find_work(root: Path) -> Path:
    """The one ``work`` folder under ``root`` holding a calibration's timings, at any depth: archives
    differ in the folder above it (none, ``g/``, ...)."""
    found = sorted({t.parent.parent for t in root.rglob("calibrate/timings.json") if t.parent.parent.name == "work"})
    if not found:
        raise CheckError("no GPU check in it (no work/calibrate/timings.json)")
    if len(found) > 1:
        raise CheckError(f"several GPU checks in it ({', '.join(str(w.relative_to(root)) for w in found)}); give one")
    return found[0]


def open_check(check: Path, tmp: Path) -> Path:
    """The work folder of a check's ``--out`` directory, or of a .tgz of it unpacked under ``tmp``."""
    if not check.exists():
        raise CheckError("no such file or directory")
    if check.is_dir():
        return find_work(check)
    try:
        with tarfile.open(check) as tar:
            _unpack(tar, tmp)
    except tarfile.TarError:
        raise CheckError("not a GPU check's folder or .tgz (tar cannot open it)") from None
    except OSError as e:
        raise CheckError(f"cannot be unpacked ({type(e).__name__}: {e})") from None
    return find_work(tmp)


def _unpack(tar: tarfile.TarFile, into: Path) -> None:
    """Plain files and folders only, each inside ``into`` (the data filter; Python before 3.11.4 has
    none, so there its rules are applied here)."""
    if hasattr(tarfile, "data_filter"):
        tar.extractall(into, filter="data")
        return
    for member in tar.getmembers():
        if not (member.isfile() or member.isdir()) or member.name.startswith("/") or ".." in Path(member.name).parts:
            raise CheckError(f"holds {member.name!r}, which is not a plain file or folder inside it")
    tar.extractall(into)


def load(work: Path) -> tuple[list, list]:
    """(probes, workloads): (name, plan, [ms per block or repeat], [PlanTimes]); plans that failed or
    timed out (no iterations) are left out, as the calibration leaves them out."""
    from rec.plan import read_plan
    from rec.train.timings import read_timings

    probes = []
    for p in read_timings(work / "calibrate").plans:
        if not p.iterations:
            continue
        name = Path(p.plan_path).parent.name
        probes.append((name, read_plan(work / "calibrate/probes" / name / "plan.json"), p))
    measured: dict[str, list] = {}
    for folder in sorted(work.glob("measured-*")):
        for p in read_timings(folder).plans:
            if p.iterations:
                measured.setdefault(plan_name(p.plan_path), []).append(p)
    workloads = [(name, read_plan(work / "plans" / name / "plan.json"), runs) for name, runs in measured.items()]
    return probes, workloads


def plan_name(plan_path: str) -> str:
    """A measured plan's folder under ``work/plans`` (``given/spec1_default`` where a given workload's
    name has a folder in it), from the path the GPU machine recorded."""
    parts = Path(plan_path).parts
    at = len(parts) - 1 - parts[::-1].index("plans") if "plans" in parts else len(parts) - 2
    return "/".join(parts[at + 1:-1])


def calibration_groups(work: Path) -> dict[str, str]:
    """The calibration plans' groups (``builtin``, ``given``, ``out_of_family``) by folder name, as the
    check's ``gpu_check.json`` records them; {} where it records none (the checks of 2026-11-25/26)."""
    try:
        report = json.loads((work.parent / "gpu_check.json").read_text())
        entries = report["sections"]["calibration"]["figures"]["plans_measured"]
        return {f"{e['spec']}_{e['made_under']}": str(e["group"]) for e in entries}
    except (OSError, ValueError, KeyError, TypeError):
        return {}


def group_of(name: str, groups: dict[str, str]) -> str | None:
    """A measured plan's calibration group, None for a TorchRec comparison plan: as ``groups`` says,
    else by its name (a workload under the ``default`` or ``calibrated`` profile is a calibration plan;
    ``spec<N>`` built in, ``oof_...`` out of family, any other given)."""
    if name in groups:
        return groups[name]
    workload, _, kind = name.rpartition("_")
    if kind not in CALIBRATION_KINDS:
        return None
    if re.fullmatch(r"spec\d+", workload):
        return "builtin"
    return "out_of_family" if workload.startswith(OUT_OF_FAMILY_PREFIX) else "given"


def block_means(times) -> np.ndarray:  # the estimator the checks of 2026-11-25 ran with
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


def caches(plan) -> bool:
    """Whether some table of ``plan`` sits on a fused_uvm_caching kernel."""
    from rec.sharding import COMPUTE_KERNELS, ComputeKernel

    return bool((plan.columns.compute_kernel == COMPUTE_KERNELS.index(ComputeKernel.FUSED_UVM_CACHING)).any())


def agreement(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The plans' count, median and max |error| and Spearman of ``rows``' predicted against measured
    ms (only the count for none; Spearman None below 3)."""
    from scipy.stats import spearmanr

    if not rows:
        return {"plans": 0}
    errors = np.abs([r["error"] for r in rows])
    rho = float(spearmanr([r["predicted_ms"] for r in rows], [r["measured_ms"] for r in rows])[0]) \
        if len(rows) > 2 else None
    return {"plans": len(rows), "median_abs_error": float(np.median(errors)), "max_abs_error": float(errors.max()),
            "spearman": rho}


def refit(work: Path) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """(a row per calibration plan, the summary) of the check whose work folder is ``work``."""
    from scipy.stats import spearmanr

    from rec.analysis.rank_times import predicted_ms
    from rec.calibrate.fit import Measured, fit_profile
    from rec.profile import DEFAULT_PROFILE
    from rec.topology import read_topology

    probes, workloads = load(work)
    topology = read_topology(work / "calibrate.topology.yaml")
    groups = calibration_groups(work)
    group = {name: group_of(name, groups) for name, _, _ in workloads}
    calibration = [w for w in workloads if group[w[0]] in JUDGED]
    apart = [w for w in workloads if group[w[0]] == "out_of_family"]
    if not probes or not calibration:
        raise CheckError(f"nothing to fit: {len(probes)} probes, {len(calibration)} calibration plans measured")

    rows = []
    for name, plan, runs in calibration + apart:
        _, s_mean = spreads(runs, block_means)
        m_med, s_med = spreads(runs, lambda t: t.block_ms())
        rows.append({"plan": name, "group": group[name], "measured_ms": m_med, "spread_block_means": s_mean,
                     "spread_block_medians": s_med, "lookup_gb": lookup_bytes(plan) / 1e9})
    measured = {r["plan"]: r["measured_ms"] for r in rows}
    judged = [r for r in rows if r["group"] in JUDGED]

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
        spec = name.rpartition("_")[0]
        others = probe_measured + [Measured(n, pl, every[n]) for n, pl, _ in workloads if n.rpartition("_")[0] != spec]
        loo_predicted.append(float(predicted_ms(plan, fit_profile(others, topology, 0.2).profile).max()))
    def priced(plan, measured_ms: float, profile=from_probes.profile) -> dict[str, float]:
        predicted = float(predicted_ms(plan, profile).max())
        return {"predicted_ms": predicted, "measured_ms": measured_ms, "error": predicted / measured_ms - 1}

    # The out-of-family set (bench.gpu_check.families): generators no term or probe was chosen on.
    far = [priced(plan, measured[name]) for name, plan, _ in apart]
    # The TorchRec comparison's plans: shapes of another generator (``workloads.torchrec_shapes``),
    # predicted by the same fit to the probes. Those with a fused_uvm_caching table are told apart: the
    # checks archived so far cycled 4 batches, whose ids flattered caches (bench/RESULTS.md §7).
    # In sample (fitted with the probes and every workload, these plans too): what the form can explain.
    vs: dict[str, dict[str, dict[str, Any]]] = {}
    explained = []
    for name, plan, runs in workloads:
        if group[name] is None:
            shape, kind = name.rsplit("_", 1)
            median, spread = spreads(runs, lambda t: t.block_ms())
            vs.setdefault(shape, {})[kind] = {"measured_ms": median, "spread": spread,
                                              **priced(plan, median), "caching": caches(plan)}
            if not caches(plan):
                explained.append(priced(plan, median, in_sample.profile))
    for row in vs.values():
        base = row.get("torchrec", {}).get("measured_ms", float("nan"))
        for v in row.values():
            v["ratio"] = v["measured_ms"] / base
    compared = [v for row in vs.values() for v in row.values()]
    summary: dict[str, Any] = {"probes": len(probes), "vs_torchrec": vs,
        "vs_torchrec_fitted_to_probes": {"every plan": agreement(compared),
                                         UNCACHED: agreement([v for v in compared if not v["caching"]])},
        "vs_torchrec_in_sample": {UNCACHED: agreement(explained)},
        "default": accuracy(DEFAULT_PROFILE), "fitted_to_probes": accuracy(from_probes.profile),
        "fitted_to_the_workloads_in_sample": accuracy(in_sample.profile),
        "fitted_to_the_other_specs": accuracy(None, loo_predicted),
        "out_of_family_fitted_to_probes": agreement(far),
        "probe_residual_median": from_probes.median_abs_error,
        "spread_max": {"block_means": max(r["spread_block_means"] for r in judged),
                       "block_medians": max(r["spread_block_medians"] for r in judged)},
        "lookup_gb_range": {"probes": [min(lookup_bytes(pl) for _, pl, _ in probes) / 1e9,
                                       max(lookup_bytes(pl) for _, pl, _ in probes) / 1e9],
                            "workloads": [min(r["lookup_gb"] for r in judged), max(r["lookup_gb"] for r in judged)]},
    }
    return rows, summary


def report(rows: list[dict[str, Any]], summary: dict[str, Any]) -> None:
    print(f"{'plan':32} {'group':13} {'measured ms':>11} {'spread (means)':>14} {'spread (medians)':>16} "
          f"{'lookups GB':>10}")
    for r in rows:
        print(f"{r['plan']:32} {r['group']:13} {r['measured_ms']:11.2f} {r['spread_block_means']:14.1%} "
              f"{r['spread_block_medians']:16.1%} {r['lookup_gb']:10.2f}")
    for key in ACCURACIES:
        s = summary[key]
        print(f"{key:36s} median |error| {s['median_abs_error']:6.1%}  max {s['max_abs_error']:6.1%}  "
              f"Spearman {s['spearman']:.3f}")
    _agreement_line("out of family, fitted to the probes", summary["out_of_family_fitted_to_probes"])
    span = summary["lookup_gb_range"]
    print(f"lookups per iteration, GB: probes [{span['probes'][0]:.3g}, {span['probes'][1]:.3g}], "
          f"workloads [{span['workloads'][0]:.3g}, {span['workloads'][1]:.3g}]")
    if not summary["vs_torchrec"]:
        return
    print("\nthe TorchRec comparison's plans (block medians): measured ms, spread, ratio to TorchRec's plan; "
          "predicted by the fit to the probes, error")
    for shape, row in summary["vs_torchrec"].items():
        print(f"  {shape:14s} " + "  ".join(
            f"{kind} {v['measured_ms']:.2f} ms ({v['spread']:.0%}) {v['ratio']:.2f}x pred {v['predicted_ms']:.2f} "
            f"{v['error']:+.0%}" for kind, v in row.items()))
    for group, s in summary["vs_torchrec_fitted_to_probes"].items():
        _agreement_line(f"  fitted to the probes, {group}", s)
    _agreement_line(f"  in sample, {UNCACHED}", summary["vs_torchrec_in_sample"][UNCACHED])


def _agreement_line(title: str, s: dict[str, Any]) -> None:
    """One line of an ``agreement``'s figures; none where it has no plans."""
    if s["plans"]:
        rho = "-" if s["spearman"] is None else f"{s['spearman']:.3f}"
        print(f"{title} ({s['plans']} plans): median |error| {s['median_abs_error']:.1%}  "
              f"max {s['max_abs_error']:.1%}  Spearman {rho}")


def one_line(e: Exception) -> str:
    text = " ".join(str(e).split())
    return text if isinstance(e, CheckError) else f"could not re-read it: {type(e).__name__}: {text}"


def main(argv: list[str] | None = None) -> int:
    from rec.errors import InputError

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("checks", nargs="*", type=Path, help="a GPU check's --out directory, or a .tgz of it")
    p.add_argument("--all", action="store_true", help=f"every bench/results/{ARCHIVES} as well")
    p.add_argument("--out", type=Path, help="where one check's figures go (json)")
    p.add_argument("--out-dir", type=Path, default=RESULTS, help="where each check's gpu_refit_<name>.json goes")
    args = p.parse_args(argv)
    checks = list(args.checks) + (sorted(RESULTS.glob(ARCHIVES)) if args.all else [])
    if not checks:
        p.error(f"give a GPU check (a folder or .tgz), or --all for bench/results/{ARCHIVES}")
    if args.out is not None and len(checks) > 1:
        p.error("--out takes one check's figures; with several, each goes to --out-dir")
    names = [label(c) for c in checks]
    if len(set(names)) < len(names):
        p.error(f"two checks would be filed under one name: {', '.join(names)}")
    flag, folder = ("--out", args.out.parent) if args.out is not None else ("--out-dir", args.out_dir)
    try:  # before minutes of refitting: a folder that cannot be made is said now
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        print(f"gpu_refit: {flag} {args.out or args.out_dir}: cannot write there ({e.strerror or e})", file=sys.stderr)
        return 2

    done: dict[str, dict[str, Any]] = {}
    failed: list[str] = []
    for check, name in zip(checks, names, strict=True):
        if len(checks) > 1:
            print(f"\n== {check}", flush=True)
        try:
            with tempfile.TemporaryDirectory() as tmp:
                rows, summary = refit(open_check(check, Path(tmp)))
        except (CheckError, InputError, OSError, ValueError, KeyError) as e:
            print(f"gpu_refit: {check}: {one_line(e)}", file=sys.stderr, flush=True)
            failed.append(name)
            continue
        report(rows, summary)
        out = args.out or args.out_dir / f"gpu_refit_{name}.json"
        try:
            out.write_text(json.dumps({"check": check.name, "plans": rows, "summary": summary}, indent=1) + "\n")
        except OSError as e:
            print(f"gpu_refit: cannot write {out}: {e.strerror or e}", file=sys.stderr, flush=True)
            failed.append(name)
            continue
        print(f"wrote {out}")
        done[name] = summary
    if len(checks) > 1:
        print(f"\nmedian |error|, max, Spearman\n{'check':20} {'probes':>6}  "
              + "  ".join(f"{title:>25}" for title in (*ACCURACIES.values(), COMPARED)))
        for name in names:
            s = done.get(name)
            figures = [*(s[k] for k in ACCURACIES), s["vs_torchrec_fitted_to_probes"][UNCACHED]] if s else []
            cells = [f"{f['median_abs_error']:6.1%} max {f['max_abs_error']:6.1%} "
                     + ("-" if f["spearman"] is None else f"{f['spearman']:.3f}")
                     if f.get("plans", 1) else "-" for f in figures] if s else ["not re-read (above)"]
            print(f"{name:20} {s['probes'] if s else '-':>6}  " + "  ".join(f"{c:>25}" for c in cells))
    return 2 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
