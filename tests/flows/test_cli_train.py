"""``shardflow train`` on CPU: real torchrun, gloo, DMP with the plan, no planning in the job."""

from __future__ import annotations

import json
import socket
import subprocess
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from flows.cli import main
from rec.plan import read_plan
from rec.spec import read_spec
from rec.train.owned_folders import unwritten_entries
from tests.deadline import deadline
from tests.flows.cli_in_process import shardflow_here
from tests.paths import CPU_2PROC, DEMO, ROOT, SHARDFLOW


@pytest.fixture(scope="module")
def plan_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("plan")
    assert main(["plan", "--no-track", str(DEMO), "--topology", str(CPU_2PROC), "--out", str(out)]) == 0
    return out


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_world_size_that_does_not_match_the_plan_exits_2(plan_dir, tmp_path, capfd):
    r = shardflow_here(capfd, "train", "--no-track", "--plan", str(plan_dir), "--out", str(tmp_path),
                       "--nproc-per-node", "3")
    assert r.returncode == 2
    assert "3 processes" in r.stderr and "2 ranks" in r.stderr
    assert "Traceback" not in r.stderr


def test_bad_settings_are_named_with_the_datas_and_the_endpoints_problems_in_one_message(plan_dir, tmp_path, capfd):
    """The settings were once refused alone: the data's problem came only on the next try."""
    bad = tmp_path / "day1.parquet"
    bad.write_bytes(b"no")
    r = shardflow_here(capfd, "train", "--no-track", "--plan", str(plan_dir), "--out", str(tmp_path / "out"),
                       "--iterations", "0", "--data", str(bad), "--rdzv-endpoint", "nohost.invalid:1")
    assert r.returncode == 2 and "Traceback" not in r.stderr
    lines = r.stderr.strip().splitlines()
    assert lines[0] == "shardflow: Cannot train with these settings and this plan here:"
    assert [line.split(":")[0].strip() for line in lines[1:]] == [
        "- --iterations", "- --warmup", "- --rdzv-endpoint", f"- --data {bad}"]
    assert not (tmp_path / "out").exists()
    r = shardflow_here(capfd, "train", "--no-track", "--plan", str(tmp_path / "nowhere"), "--iterations", "0")
    assert r.returncode == 2 and "--iterations" in r.stderr and "nowhere: no such file" in r.stderr


def test_links_where_the_training_writes_its_logs_and_checkpoints_exit_2_before_launch(plan_dir, tmp_path, capfd):
    """A log file linked to a file elsewhere (it would be appended to), a step directory linked to a
    folder elsewhere (the checkpoint would be written there), a checkpoint folder that is a link: each
    named, nothing launched, the files linked to untouched."""
    victim, elsewhere = tmp_path / "victim.txt", tmp_path / "elsewhere"
    victim.write_text("precious\n")
    elsewhere.mkdir()
    out = tmp_path / "out"
    (out / "logs").mkdir(parents=True)
    (out / "logs" / "rank-0.log").symlink_to(victim)
    (out / "checkpoints").mkdir()
    (out / "checkpoints" / "step_00000002").symlink_to(elsewhere)
    r = shardflow_here(capfd, "train", "--no-track", "--plan", str(plan_dir), "--out", str(out),
                       "--iterations", "2", "--warmup", "1", "--checkpoint-every", "2")
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert "is a symbolic link: shardflow follows no link" in r.stderr
    assert all(str(out / name) in r.stderr for name in ("logs/rank-0.log", "checkpoints/step_00000002"))
    assert victim.read_text() == "precious\n" and list(elsewhere.iterdir()) == []
    linked = tmp_path / "linked"
    (linked / "logs").mkdir(parents=True)
    (linked / "checkpoints").symlink_to(elsewhere)
    r = shardflow_here(capfd, "train", "--no-track", "--plan", str(plan_dir), "--out", str(linked),
                       "--iterations", "2", "--warmup", "1", "--checkpoint-every", "2")
    assert r.returncode == 2 and f"{linked / 'checkpoints'}: is a symbolic link, not a folder" in r.stderr
    assert list(elsewhere.iterdir()) == []


def test_files_the_training_did_not_write_where_it_writes_exit_2_before_launch_and_stay(plan_dir, tmp_path, capfd):
    """A --checkpoint-dir holding the user's files (a model.json and plan.json of their own, a note in a
    step folder, which pruning deleted) and a folder where train_metrics.json goes (the run failed
    there after all its work, exit 1): each named, nothing launched, nothing changed."""
    mine = tmp_path / "mine"
    (mine / "step_00000002").mkdir(parents=True)
    files = {mine / "model.json": '{"mine": 1}\n', mine / "plan.json": '{"format": "my.plan/v1"}\n',
             mine / "notes.md": "notes\n", mine / "step_00000002" / "notes.txt": "important\n"}
    for path, text in files.items():
        path.write_text(text)
    out = tmp_path / "out"
    (out / "train_metrics.json").mkdir(parents=True)
    r = shardflow_here(capfd, "train", "--no-track", "--plan", str(plan_dir), "--out", str(out), "--iterations", "4",
                       "--warmup", "1", "--checkpoint-every", "2", "--keep-checkpoints", "1",
                       "--checkpoint-dir", str(mine))
    assert r.returncode == 2 and "Traceback" not in r.stderr
    problems = [line for line in r.stderr.splitlines() if line.startswith("  - ")]
    assert len(problems) == 2, r.stderr
    assert "shardflow did not write it there: give the training an empty or new --checkpoint-dir" in problems[0]
    assert f"{out / 'train_metrics.json'}: is a folder, where the run writes this file" in problems[1]
    assert all(path.read_text() == text for path, text in files.items())
    assert not (out / "logs").exists()


@pytest.mark.slow
def test_a_killed_rank_is_restarted_and_resumes_from_the_last_checkpoint(plan_dir, tmp_path, capfd, monkeypatch):
    monkeypatch.setenv("SHARDFLOW_FAIL_AT_ITERATION", "7:1")
    # What a user's shell or cluster may leave set changes nothing: Kubeflow's PET_NNODES had this one-node
    # training wait for a second node for good; PYTHONWARNINGS=error failed every launch ("EOFError").
    monkeypatch.setenv("PET_NNODES", "2")
    monkeypatch.setenv("PYTHONWARNINGS", "error")
    r = shardflow_here(capfd, "train", "--no-track", "--plan", str(plan_dir), "--out", str(tmp_path),
                       "--iterations", "10", "--warmup", "1", "--batch-size", "32", "--checkpoint-every", "3",
                       "--max-restarts", "1")
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    m = json.loads((tmp_path / "train_metrics.json").read_text())
    assert m["resumed_from"] == 6 and m["restarts"] == 1
    # the restart is said: the summary once read as a plain resume
    assert "resumed   from this plan's own checkpoint at step 6, after 1 restart of the ranks" in r.stdout
    # docs/training.md's format; after the last iteration too, which 3 does not divide
    assert (tmp_path / "checkpoints" / "LATEST").read_text() == "step_00000010"
    assert unwritten_entries(tmp_path / "checkpoints") == []  # all shardflow's own, restarts and all
    assert f"checkpoints {tmp_path / 'checkpoints'}" in r.stdout.splitlines()  # the summary says where they went
    monkeypatch.delenv("SHARDFLOW_FAIL_AT_ITERATION")
    r = shardflow_here(capfd, "train", "--no-track", "--plan", str(plan_dir), "--out", str(tmp_path), "--resume",
                       "--iterations", "12", "--warmup", "1", "--batch-size", "32",
                       "--dense-arch-layer-sizes", "8", "4")
    assert r.returncode == 2 and "--dense-arch-layer-sizes: 8 4, but the checkpoint's model was trained with 64 32" \
        in r.stderr  # once found by the ranks after launch, exit 1
    assert (tmp_path / "checkpoints" / "LATEST").read_text() == "step_00000010"


def write_training_parquet(path: Path, spec, rows: int, dense: int) -> None:
    rng = np.random.default_rng(0)
    columns = {"label": rng.integers(0, 2, rows).tolist(),
               "dense": rng.random((rows, dense)).astype(np.float32).tolist()}
    for t in spec.tables:
        for f in t.feature_names:
            columns[f] = [rng.integers(0, t.num_embeddings, rng.integers(0, 4)).tolist() for _ in range(rows)]
    pq.write_table(pa.table(columns), path)


@pytest.mark.slow
def test_two_gloo_processes_on_two_loopback_nodes_train_from_parquet_apply_the_plan_and_report_latency(
        plan_dir, tmp_path, capfd):
    """One process on each of two nodes (rendezvous on 127.0.0.1): node 0 in a process of its own,
    node 1 in this process. The training applies the plan's sharding and reports its iterations'
    latency, every iteration in iterations.parquet. The nodes name the data each from its own working
    directory: the same file, so their settings agree."""
    data = tmp_path / "train.parquet"
    write_training_parquet(data, read_spec(DEMO), rows=256, dense=13)
    endpoint = f"127.0.0.1:{free_port()}"
    common = ["--plan", str(plan_dir), "--out", str(tmp_path / "out"), "--iterations", "6",
              "--warmup", "1", "--batch-size", "32", "--nnodes", "2",
              "--nproc-per-node", "1", "--rdzv-endpoint", endpoint]
    node0 = subprocess.Popen([str(SHARDFLOW), "train", "--no-track", *common, "--data", data.name, "--node-rank",
                              "0"], cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        node1 = shardflow_here(capfd, "train", "--no-track", *common, "--data", str(data), "--node-rank", "1")
    finally:
        out0, _ = node0.communicate(timeout=600)
    assert node0.returncode == 0 and node1.returncode == 0, out0[-3000:] + node1.stderr[-3000:]
    m = json.loads((tmp_path / "out" / "train_metrics.json").read_text())
    plan = read_plan(plan_dir)
    assert m["plan_id"] == plan.plan_id and m["world_size"] == 2 and m["iterations"] == 6
    assert m["applied_sharding"] == {t.name: t.sharding_type.value for t in plan.tables}
    lat = m["iteration_latency_ms"]
    assert 0 < lat["p50"] <= lat["p90"] <= lat["p99"]
    assert m["samples_per_s"] == pytest.approx(2 * 32 / (lat["mean"] / 1e3))
    rows = pq.read_table(tmp_path / "out" / "iterations.parquet").to_pylist()
    assert [r["iteration"] for r in rows] == list(range(6))


def refused_on_two_nodes(capfd, common: list[str], node0: list[str], node1: list[str]) -> tuple[str, str]:
    """``shardflow COMMON NODE0 --node-rank 0`` in a process of its own and ``... NODE1 --node-rank 1``
    in this one, both refused with exit 2: their outputs."""
    first = subprocess.Popen([str(SHARDFLOW), *common, *node0, "--node-rank", "0"], cwd=ROOT,
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        with deadline(240):
            second = shardflow_here(capfd, *common, *node1, "--node-rank", "1")
    finally:
        try:
            out0, _ = first.communicate(timeout=120)
        except subprocess.TimeoutExpired:
            first.terminate()
            out0, _ = first.communicate()
    assert first.returncode == 2 and second.returncode == 2, out0[-3000:] + second.stderr[-3000:]
    assert "Traceback" not in out0 + second.stderr
    return out0, second.stderr


@pytest.mark.slow
def test_two_nodes_started_with_different_iterations_both_exit_2_naming_them_before_training(
        plan_dir, tmp_path, capfd):
    """Each node's ranks once trained their own --iterations and waited for each other at the end until
    gloo's 30-minute timeout. They compare their settings as the process group is up, and refuse. Nodes
    given different plans (the plan_id was the rendezvous' id) waited for each other for 10 minutes
    (torchrun's join timeout), then were told their nodes did not meet."""
    out = tmp_path / "out"
    topology = tmp_path / "topology.yaml"
    topology.write_text(CPU_2PROC.read_text().replace("ddr_cap: 16GiB", "ddr_cap: 15GiB"))
    other = tmp_path / "other"
    assert main(["plan", "--no-track", str(DEMO), "--topology", str(topology), "--out", str(other)]) == 0
    common = ["train", "--no-track", "--out", str(out), "--warmup", "1", "--nnodes", "2",
              "--nproc-per-node", "1", "--rdzv-endpoint", f"127.0.0.1:{free_port()}", "--join-timeout", "120"]
    ids = [read_plan(p).plan_id for p in (plan_dir, other)]
    named = f"--iterations, --plan: 6, {ids[0]} (content "
    for output in refused_on_two_nodes(capfd, common, ["--plan", str(plan_dir), "--iterations", "6"],
                                       ["--plan", str(other), "--iterations", "7"]):
        refused = [line for line in output.splitlines() if "different settings" in line]
        assert len(refused) == 1 and named in refused[0] and f"; 7, {ids[1]} (content " in refused[0], output[-3000:]
    assert not (out / "iterations.parquet").exists()


@pytest.mark.slow
def test_a_node_whose_peer_never_comes_says_it_waits_and_fails_at_the_join_timeout(plan_dir, tmp_path, capfd):
    """The node showed "starting 2 ranks" for torchrun's 10 minutes, then said the nodes did not meet."""
    endpoint = f"127.0.0.1:{free_port()}"
    r = shardflow_here(capfd, "train", "--no-track", "--plan", str(plan_dir), "--out", str(tmp_path / "out"),
                       "--nnodes", "2", "--nproc-per-node", "1", "--rdzv-endpoint", endpoint, "--join-timeout", "3")
    assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr[-3000:]
    assert f"train: waiting for the 2 nodes to meet at {endpoint} (at most 3 s)" in r.stderr
    assert (f"the training failed: the 2 nodes did not all meet at {endpoint} within 3 s (--join-timeout): start "
            "every node with the same --nnodes and --rdzv-endpoint, each with its own --node-rank") in r.stderr


@pytest.mark.slow
def test_two_nodes_measuring_with_different_iterations_both_exit_2_naming_them(plan_dir, tmp_path, capfd):
    """``shardflow measure`` (and ``eval``, and calibrate's measuring jobs) on several nodes compare their
    settings as the training does: different --iterations waited until gloo's timeout."""
    common = ["measure", "--no-track", "--plan", str(plan_dir), "--out", str(tmp_path / "m"), "--warmup", "1",
              "--nnodes", "2", "--nproc-per-node", "1", "--rdzv-endpoint", f"127.0.0.1:{free_port()}"]
    for output in refused_on_two_nodes(capfd, common, ["--iterations", "3"], ["--iterations", "4"]):
        assert "--iterations: 3 on node 0; 4 on node 1" in output, output[-3000:]


@pytest.mark.slow
def test_a_training_that_diverges_stops_when_its_progress_shows_it_not_at_the_end(plan_dir, tmp_path, capfd):
    """The progress showed `loss nan` from the start and the ranks trained on for all their iterations
    (or up to the next checkpoint) before the training said it diverged."""
    r = shardflow_here(capfd, "train", "--no-track", "--plan", str(plan_dir), "--out", str(tmp_path / "out"),
                       "--iterations", "100000", "--warmup", "1", "--batch-size", "32",
                       "--dense-lr", "1e30", "--embedding-lr", "1e30")
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr[-3000:]
    failed = next(line for line in r.stderr.splitlines() if "The training diverged" in line)
    assert "loss: not finite (NaN or infinite) on rank 0, first seen at iteration " in failed
    seen = int(failed.split("first seen at iteration ")[1].split(":")[0])
    assert seen < 5000 and "(--dense-lr, --embedding-lr)" in failed
    assert not (tmp_path / "out" / "train_metrics.json").exists()


def test_gloo_settings_of_the_environment_that_fail_every_rank_are_named_before_launch(plan_dir, tmp_path,
                                                                                        capfd, monkeypatch):
    """GLOO_SOCKET_IFNAME naming no interface failed both ranks after the launch with `RuntimeError: ifa !=
    nullptr. Unable to find address for: nosuch0`, exit 1 (a Prefect run retried it); with
    TORCH_DISTRIBUTED_DEBUG=DETAIL every gloo rank crashed: `rank 0 exited with signal SIGSEGV`."""
    monkeypatch.setenv("GLOO_SOCKET_IFNAME", "lo,nosuch0")
    monkeypatch.setenv("TORCH_DISTRIBUTED_DEBUG", "DETAIL")
    r = shardflow_here(capfd, "train", "--no-track", "--plan", str(plan_dir), "--out", str(tmp_path / "out"))
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert "  - GLOO_SOCKET_IFNAME=lo,nosuch0: this machine has no network interface nosuch0 (it has " in r.stderr
    assert "  - TORCH_DISTRIBUTED_DEBUG=DETAIL: crashes the training's gloo ranks (SIGSEGV" in r.stderr
    assert not (tmp_path / "out").exists()
