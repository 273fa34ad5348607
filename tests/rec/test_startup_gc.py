"""``rec.startup_gc``: the launcher holds the garbage collector while it imports torch and its
forkserver imports the job, and every rank freezes what was imported and collects from there on."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from rec.train.lifetime import LAUNCHER_MODULE
from tests.paths import ROOT


@pytest.mark.slow  # torchrun's agent, two ranks
def test_every_rank_collects_its_own_garbage_and_never_scans_the_imports_again(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TMPDIR": str(tmp_path)}
    r = subprocess.run([sys.executable, "-m", LAUNCHER_MODULE, "--standalone", "--nproc-per-node=2",
                        f"--log-dir={os.devnull}", "--start-method=forkserver", "-m", "tests.rec.gc_job"],
                       cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-3000:]
    ranks = re.findall(r"^rank (\d) collects (\w+) frozen (\d+)$", r.stdout, re.M)
    assert sorted(rank for rank, *_ in ranks) == ["0", "1"], r.stdout
    assert {collects for _, collects, _ in ranks} == {"True"}
    assert all(int(frozen) > 100_000 for *_, frozen in ranks)  # torch's objects, imported by the launcher


def test_a_collection_after_the_imports_scans_only_what_came_after():
    code = ("import gc; from rec import startup_gc; startup_gc.hold_collection(); import torch; "
            "held = gc.isenabled(); startup_gc.imports_done(); "
            "print(held, gc.isenabled(), gc.get_freeze_count(), len(gc.get_objects()))")
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120,
                       env={**os.environ, "PYTHONPATH": str(ROOT)})
    held, enabled, frozen, scanned = r.stdout.split()
    assert (held, enabled) == ("False", "True"), r.stderr
    assert int(frozen) > 100_000 and int(scanned) < 1_000  # a collection's full pass skips torch's objects
