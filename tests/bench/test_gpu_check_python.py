"""``make gpu-check`` with a python that lacks the GPU stack (or does not exist): one line naming that
python and how to choose another (``GPU_PYTHON=``), exit 2, no traceback."""

from __future__ import annotations

import subprocess
import sys
import venv

from tests.paths import ROOT


def gpu_check(tmp_path, python: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["make", "--no-print-directory", "-s", "gpu-check", f"GPU_PYTHON={python}",
                           f"GPU_CHECK_OUT={tmp_path / 'out'}"], cwd=ROOT, capture_output=True, text=True,
                          timeout=120)


def test_a_python_without_torch_is_named_with_gpu_python_in_one_line_and_exit_2(tmp_path):
    bare = tmp_path / "bare"  # the base interpreter without this venv's packages: no torch
    venv.EnvBuilder(with_pip=False).create(bare)
    python = bare / "bin" / "python"
    r = gpu_check(tmp_path, str(python))
    assert r.returncode == 2 and "Traceback" not in r.stderr + r.stdout
    ours = [line for line in r.stderr.splitlines() if line.startswith("gpu_check:")]
    assert len(ours) == 1, r.stderr
    assert f"{python} (Python {sys.version_info.major}.{sys.version_info.minor}" in ours[0]
    assert "has no torch" in ours[0] and "make gpu-check GPU_PYTHON=" in ours[0]
    assert not (tmp_path / "out").exists()  # refused before anything ran
    direct = subprocess.run([str(python), "-m", "bench.gpu_check", "--out", str(tmp_path / "out")], cwd=ROOT,
                            capture_output=True, text=True, timeout=60, env={"PYTHONPATH": str(ROOT)})
    assert direct.returncode == 2 and direct.stderr.strip() == ours[0]


def test_a_gpu_python_that_does_not_exist_is_named_with_exit_2(tmp_path):
    r = gpu_check(tmp_path, str(tmp_path / "no-such-python"))
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert f"no {tmp_path / 'no-such-python'} on this machine" in r.stderr and "GPU_PYTHON=" in r.stderr
