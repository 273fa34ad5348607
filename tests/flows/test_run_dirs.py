"""Runs never mix their outputs: an explicit --out is locked for the run, defaults are per run."""

from __future__ import annotations

from pathlib import Path

from flows.cli import main
from tasks.run_dirs import RunDirs, lock_dir
from tests.paths import CPU_2PROC, DEMO


def test_a_second_run_into_a_directory_in_use_is_refused_at_once(tmp_path, capfd):
    assert main(["plan", "--no-track", str(DEMO), "--topology", str(CPU_2PROC), "--out", str(tmp_path / "plan"),
                 "--no-chart"]) == 0
    out = tmp_path / "busy"
    with lock_dir(str(out)):  # another run holds it
        code = main(["train", "--plan", str(tmp_path / "plan"), "--out", str(out), "--iterations", "3",
                     "--warmup", "1", "--no-track"])
    err = capfd.readouterr().err
    assert code == 2 and "in use by another shardflow run" in err and "Traceback" not in err
    assert not (out / "train_metrics.json").exists()


def test_planning_only_into_a_directory_a_run_holds_is_refused(tmp_path, prefect_api, mlflow_uri):
    """``run --plan-only --out O`` beside a ``run --out O`` once replaced the plan the run was about
    to train (the ranks now refuse a plan other than the one checked, too)."""
    import pytest

    from flows.plan import plan_flow
    from rec.errors import InputError
    from tasks.tracking import TrackingSettings

    out = tmp_path / "busy"
    with lock_dir(str(out)), pytest.raises(InputError, match="in use by another shardflow run"):  # a run holds it
        plan_flow(str(DEMO), str(CPU_2PROC), out_dir=str(out),
                  tracking=TrackingSettings(mlflow_uri, state_dir=str(tmp_path / "state")))
    assert not (out / "plan").exists()


def test_shardflow_plan_into_the_plan_folder_of_a_run_in_progress_is_refused(tmp_path, capfd):
    """``plan --out O/plan`` beside a ``run --out O`` replaced the plan the run trains."""
    out = tmp_path / "busy"
    plan = ["plan", "--no-track", str(DEMO), "--topology", str(CPU_2PROC), "--no-chart", "--out"]
    with lock_dir(str(out)):  # a run holds it
        for target in (out / "plan", out):
            assert main([*plan, str(target)]) == 2
            err = capfd.readouterr().err
            assert f"{out} is in use by another shardflow run (locked by pid " in err and "Traceback" not in err
        assert not (out / "plan").exists() and not (out / "plan.json").exists()
    assert main([*plan, str(out / "plan")]) == 0  # the run ended
    assert (out / "plan" / "plan.json").is_file()


def test_default_directories_differ_per_run_and_latest_points_at_the_newest(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    dirs = RunDirs.of(None)
    first, second = dirs.train_dir("abc"), dirs.train_dir("abc")
    assert first != second and Path(first).parent == Path(second).parent == Path("out", "abc")
    for d in (first, second):
        Path(d).mkdir(parents=True)
        dirs.mark_latest(d)
    assert Path("out", "latest").resolve() == Path(second).resolve()


def test_a_training_into_a_folder_named_with_a_tab_is_refused_before_launch(tmp_path, capfd):
    assert main(["plan", "--no-track", str(DEMO), "--topology", str(CPU_2PROC), "--out", str(tmp_path / "plan"),
                 "--no-chart"]) == 0
    capfd.readouterr()
    code = main(["train", "--plan", str(tmp_path / "plan"), "--out", str(tmp_path / "a\tb"), "--iterations", "3",
                 "--warmup", "1", "--no-track"])
    err = capfd.readouterr().err
    assert code == 2 and "holds the control character '\\t'" in err and "a\\tb" in err, err
    assert not (tmp_path / "a\tb" / "logs").exists()


def test_a_second_node_given_the_same_node_rank_is_told_to_give_each_node_its_own(tmp_path):
    """It was told to use another --out: the nodes' outputs then split, and node 0 could not report the
    metrics its ranks did not write."""
    import pytest

    from rec.errors import InputError

    out = str(tmp_path / "shared")
    with lock_dir(out, node_rank=0, nodes=2), pytest.raises(InputError) as refused:
        with lock_dir(out, node_rank=0, nodes=2):
            pass
    reason = refused.value.problems[0].reason
    assert "give each of the 2 nodes its own --node-rank (0 to 1)" in reason and "another --out" not in reason
