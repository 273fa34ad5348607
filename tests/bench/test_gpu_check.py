"""``python -m bench.gpu_check --device cpu``: every section of the GPU check on 2 gloo ranks, from a
plain checkout (only PYTHONPATH set) where Prefect, Ray and MLflow cannot be imported."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.paths import ROOT

SECTIONS = ("train", "data", "resume", "measure", "calibrate", "calibration", "vs_torchrec")


@pytest.mark.slow
def test_the_cpu_check_runs_every_section_without_prefect_ray_or_mlflow(tmp_path):
    absent = tmp_path / "absent"
    absent.mkdir()
    for name in ("prefect", "ray", "mlflow"):  # as on a GPU image that ships none of them
        (absent / f"{name}.py").write_text(f"raise ImportError('{name} is not installed on this machine')\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(absent), str(ROOT)])}
    out = tmp_path / "check"
    r = subprocess.run([sys.executable, "-m", "bench.gpu_check", "--out", str(out), "--device", "cpu",
                        "--minutes", "12"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    report = json.loads((out / "gpu_check.json").read_text())
    assert report["format"] == "shardflow.gpu_check/v1"
    assert report["device"] == "cpu" and report["ranks"] == 2
    assert {"torch", "torchrec", "fbgemm_gpu", "cuda", "python"} <= set(report["versions"])
    sections = report["sections"]
    assert list(sections) == list(SECTIONS)
    for name in SECTIONS:
        assert sections[name]["status"] == "ok", (name, sections[name]["reason"])
        assert sections[name]["seconds"] > 0 and sections[name]["figures"]
    figures = {name: sections[name]["figures"] for name in SECTIONS}
    assert figures["train"]["faster"] in ("naive", "sparse_dist")
    assert figures["data"]["samples_per_s"]["parquet"] > 0 and figures["data"]["runs"]["parquet"][0]["epochs"] > 0
    assert figures["resume"]["resumed_from"] > 0
    assert figures["measure"]["critical_path_measured"] > 0
    assert figures["calibrate"]["probes"] > 0 and figures["calibrate"]["overhead_per_probe_s"] > 0
    assert figures["calibration"]["plans"] >= 4
    assert set(figures["calibration"]["summary"]) == {"default", "calibrated"}
    shapes = figures["vs_torchrec"]["shapes"]
    assert shapes and all("torchrec" in row and "shardflow" in row for row in shapes.values())
    markdown = (out / "gpu_check.md").read_text()
    assert all(f"| {name} | ok |" in markdown for name in SECTIONS)
    assert "Traceback" not in r.stderr


def test_an_unknown_section_or_budget_is_refused_with_exit_2(tmp_path):
    for flags in (["--sections", "train,warp"], ["--minutes", "0"]):
        r = subprocess.run([sys.executable, "-m", "bench.gpu_check", "--out", str(tmp_path), "--device", "cpu",
                            *flags], cwd=ROOT, capture_output=True, text=True, timeout=120)
        assert r.returncode == 2, r.stderr
        assert "Traceback" not in r.stderr


def test_the_check_reads_the_installed_bytecode_and_caches_it_only_where_there_is_none(tmp_path, monkeypatch):
    """A venv from ``make install`` has torch's bytecode: a cache prefix would hide it and the check's
    first process would compile all of torch again. A package without bytecode (as GPU images
    install torchrec) gets the check's own cache."""
    from bench.gpu_check import __main__ as check

    monkeypatch.setenv("PYTHONPYCACHEPREFIX", "")  # so that the test's end restores what was there
    monkeypatch.delenv("PYTHONPYCACHEPREFIX")
    monkeypatch.setattr(sys, "pycache_prefix", None)
    check.cache_bytecode(tmp_path / "pycache")
    assert "PYTHONPYCACHEPREFIX" not in os.environ and sys.pycache_prefix is None

    bare = tmp_path / "site" / "bare_pkg"
    bare.mkdir(parents=True)
    (bare / "__init__.py").write_text("")
    monkeypatch.syspath_prepend(str(bare.parent))
    monkeypatch.setattr(check, "HEAVY_PACKAGES", (*check.HEAVY_PACKAGES, "bare_pkg"))
    monkeypatch.setattr(sys, "dont_write_bytecode", sys.dont_write_bytecode)
    monkeypatch.setenv("PYTHONDONTWRITEBYTECODE", "1")
    check.cache_bytecode(tmp_path / "pycache")
    assert os.environ["PYTHONPYCACHEPREFIX"] == str(tmp_path / "pycache") == sys.pycache_prefix
    assert "PYTHONDONTWRITEBYTECODE" not in os.environ
