"""``rec.train.forked_forkserver``: multiprocessing's forkserver as a fork of the process that starts
it. Its children run as a new interpreter's would have: the preloaded module imported once, in the
forkserver; none of the starter's file descriptors; the forkserver gone once the starter is."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from rec.train.forked_forkserver import PROCESS_NAME
from tests.paths import ROOT

STARTER = """
import json, multiprocessing, os, sys
from rec.train import forked_forkserver

def parent_name():
    with open(f"/proc/{os.getppid()}/comm") as comm:
        return comm.read().strip()


def nested(queue):
    queue.put(parent_name())


def report(queue, secret):
    fds = {os.readlink(f"/proc/self/fd/{fd}") for fd in os.listdir("/proc/self/fd") if fd not in ("0", "1", "2")
           and os.path.exists(f"/proc/self/fd/{fd}")}
    with open(f"/proc/{os.getppid()}/stat") as stat:
        grandparent = int(stat.read().rsplit(")", 1)[1].split()[1])
    # A forkserver of the child's own: a new interpreter, as multiprocessing makes one.
    context = multiprocessing.get_context("forkserver")
    inner = context.Queue()
    child = context.Process(target=nested, args=(inner,))
    child.start()
    nested_parent = inner.get(timeout=60)
    child.join(timeout=60)
    queue.put({"parent": os.getppid(), "parent_name": parent_name(), "grandparent": grandparent,
               "secret_open": secret in fds, "preloaded": "decimal" in sys.modules,
               "nested_parent": nested_parent, "nested_code": child.exitcode})

if __name__ == "__main__":
    secret = open(sys.argv[1], "w")  # the starter's own descriptor: its forkserver must not hold it
    assert "decimal" not in sys.modules
    forked_forkserver.start(["decimal"])
    context = multiprocessing.get_context("forkserver")
    queue = context.Queue()
    children = [context.Process(target=report, args=(queue, sys.argv[1])) for _ in range(2)]
    for child in children:
        child.start()
    seen = [queue.get(timeout=60) for _ in children]
    for child in children:
        child.join(timeout=60)
    print(json.dumps({"me": os.getpid(), "children": seen, "codes": [c.exitcode for c in children]}), flush=True)
"""


def test_children_of_the_forked_forkserver_hold_none_of_the_starters_files_and_it_leaves_with_the_starter(tmp_path):
    script = tmp_path / "starter.py"
    script.write_text(STARTER)
    r = subprocess.run([sys.executable, str(script), str(tmp_path / "secret")], cwd=tmp_path, capture_output=True,
                       text=True, timeout=120, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert r.returncode == 0 and not r.stderr, r.stderr[-3000:]
    report = json.loads(r.stdout)
    assert report["codes"] == [0, 0]
    (forkserver,) = {child["parent"] for child in report["children"]}
    for child in report["children"]:
        assert child["parent_name"] == PROCESS_NAME.decode()  # a fork, named so in ps and top
        assert child["grandparent"] == report["me"]  # ... of the starter
        assert not child["secret_open"]
        assert child["preloaded"]  # imported in the forkserver, once, before the child was forked
        assert child["nested_code"] == 0 and child["nested_parent"] != PROCESS_NAME.decode()
    deadline = time.monotonic() + 10
    while running(forkserver) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not running(forkserver)  # it left when the starter did


def running(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_a_starter_that_may_not_fork_gets_multiprocessings_own_forkserver_with_the_module_preloaded(tmp_path):
    """The launcher does not fork a process that has started CUDA (``fork=False``): its ranks'
    forkserver is then a new interpreter, as multiprocessing starts one, that still imported the job."""
    script = tmp_path / "starter.py"
    script.write_text(STARTER.replace('forked_forkserver.start(["decimal"])',
                                      'forked_forkserver.start(["decimal"], fork=False)'))
    r = subprocess.run([sys.executable, str(script), str(tmp_path / "secret")], cwd=tmp_path, capture_output=True,
                       text=True, timeout=120, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert r.returncode == 0 and not r.stderr, r.stderr[-3000:]
    report = json.loads(r.stdout)
    assert report["codes"] == [0, 0]
    for child in report["children"]:
        assert child["parent_name"] != PROCESS_NAME.decode() and child["grandparent"] == report["me"]
        assert not child["secret_open"] and child["preloaded"]


def test_the_launcher_forks_its_forkserver_only_where_cuda_is_unstarted(monkeypatch):
    import torch

    from rec.train import launcher

    started = []
    monkeypatch.setattr(launcher.forked_forkserver, "start", lambda preload, fork=True: started.append(fork))
    argv = [launcher.FORKSERVER_FLAG, "-m", "rec.train.job", "--plan", "p"]
    launcher._start_forkserver(argv)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    launcher._start_forkserver(argv)
    assert started == [True, False]


KILLED_STARTER = """
import multiprocessing, os, sys, time
from rec.train import forked_forkserver
from rec.train.lifetime import die_with_torchrun

def rank():
    os.environ["TORCHELASTIC_RUN_ID"] = "test"  # as under torchrun
    die_with_torchrun()
    os.write(1, f"{os.getpid()} {os.getppid()}\\n".encode())  # one write: the two ranks share the pipe
    time.sleep(600)  # a rank that waits for its launcher, as torch's do once their work is done

if __name__ == "__main__":
    forked_forkserver.start(["decimal"], fork=sys.argv[1] == "fork")
    context = multiprocessing.get_context("forkserver")
    for _ in range(2):
        context.Process(target=rank).start()
    time.sleep(600)
"""


@pytest.mark.parametrize("mode", ["fork", "new interpreter"])
def test_a_killed_starter_takes_its_forkserver_and_their_ranks_with_it(tmp_path, mode):
    """Every child of multiprocessing's forkserver holds the pipe whose closing tells the forkserver its
    starter is gone: ranks kept their forkserver alive after torchrun was SIGKILLed, and it them (their
    parent-death signal is the forkserver's), so they trained on and then waited for torchrun forever."""
    import signal

    script = tmp_path / "starter.py"
    script.write_text(KILLED_STARTER)
    starter = subprocess.Popen([sys.executable, str(script), mode.split()[0]], cwd=tmp_path, stdout=subprocess.PIPE,
                               text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert starter.stdout is not None
    ranks = [tuple(map(int, starter.stdout.readline().split())) for _ in range(2)]
    (forkserver,) = {parent for _, parent in ranks}
    starter.send_signal(signal.SIGKILL)
    starter.wait(timeout=30)
    deadline = time.monotonic() + 15
    left = [forkserver, *(pid for pid, _ in ranks)]
    while (left := [pid for pid in left if running(pid)]) and time.monotonic() < deadline:
        time.sleep(0.05)
    for pid in left:  # not to outlive the test either way
        os.kill(pid, signal.SIGKILL)
    assert left == []
