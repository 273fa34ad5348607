"""``rec.train.launcher``, torchrun with ranks forked from one process that imported the job: the
ranks run the job's ``main`` with torchrun's environment, a failed rank fails the launch with its
exit code in torchrun's summary, and a long TMPDIR (too long for a Unix socket) still works."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from rec.train import forked_forkserver
from rec.train.lifetime import LAUNCHER_MODULE
from tests.paths import ROOT

pytestmark = pytest.mark.slow  # torchrun's agent, two ranks

JOB = "tests.flows.forked_job"
RANK_LINE = re.compile(r"^rank (\d) parent (\d+) (\S+) imported-in (\d+) argv (.*)$", re.M)


def launch(tmp_path, exits: str = "", temp: str | None = None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "SHARDFLOW_TEST_EXIT": exits, "TMPDIR": temp or str(tmp_path)}
    return subprocess.run([sys.executable, "-m", LAUNCHER_MODULE, "--standalone", "--nproc-per-node=2",
                           f"--log-dir={os.devnull}", "--start-method=forkserver", "-m", JOB, "--out", "o"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)


def test_every_rank_runs_the_job_forked_from_the_one_process_that_imported_it(tmp_path):
    r = launch(tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    ranks = RANK_LINE.findall(r.stdout)
    assert sorted(rank for rank, *_ in ranks) == ["0", "1"]
    (parent, name, imported_in), = {(parent, name, imported) for _, parent, name, imported, _ in ranks}
    assert parent == imported_in  # both ranks forked from the process that imported the job, once
    # ... a fork of the launcher (which had imported torch), not a new interpreter that imports it again
    assert name == forked_forkserver.PROCESS_NAME.decode()
    assert {argv for *_, argv in ranks} == {"--out o"}
    assert [p.name for p in tmp_path.iterdir()] == []  # the forkserver's socket directory is gone


def test_a_temporary_directory_too_long_for_a_socket_still_launches(tmp_path):
    long = tmp_path / ("d" * max(8, 120 - len(str(tmp_path))))  # past a socket path's 107 bytes
    long.mkdir()
    r = launch(tmp_path, temp=str(long))
    assert r.returncode == 0, r.stderr[-3000:]
    assert len(RANK_LINE.findall(r.stdout)) == 2


@pytest.mark.parametrize("exits, code", [("1:2", "2"), ("0:int", "130")])
def test_a_rank_that_fails_or_is_interrupted_fails_the_launch_with_its_exit_code(tmp_path, exits, code):
    r = launch(tmp_path, exits)
    assert r.returncode == 1
    assert re.search(rf"exitcode\s*:\s*{code}\b", r.stderr), r.stderr[-3000:]

