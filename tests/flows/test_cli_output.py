"""What the CLI prints: topology defaults, which table sits where, preflight refusals in seconds,
and no traceback when the reader of its output goes away."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from flows.cli import main
from tests.flows.cli_in_process import shardflow_here
from tests.paths import CPU_2PROC, DEMO, H100, SHARDFLOW, TWO_TOWER_SEQ


@pytest.fixture(scope="module")
def cuda_plan(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("cuda")
    assert main(["plan", "--no-track", str(DEMO), "--topology", str(H100), "--out", str(out), "--no-chart"]) == 0
    return out


def test_plan_and_spec_show_name_the_topology_defaults_they_use(tmp_path, capsys):
    topology = tmp_path / "bare.yaml"
    topology.write_text("world_size: 4\ncompute_device: cuda\n")
    assert main(["plan", "--no-track",
                 str(DEMO), "--topology", str(topology), "--out", str(tmp_path / "p"), "--no-chart"]) == 0
    out = capsys.readouterr().out
    defaults = out[out.index("defaults:"):]
    for key, value in (("ddr_cap", "128.0 GiB"), ("hbm_cap", "32.0 GiB"), ("batch_size", "512"),
                       ("storage_reservation", "0.15"), ("inter_host_bw", "12.5 GiB/s")):
        assert f"{key} {value}" in " ".join(defaults.split()), key

    assert main(["spec", "show", str(DEMO), "--topology", str(topology)]) == 0
    rows = {line.split()[0]: line for line in capsys.readouterr().out.splitlines() if line.strip()}
    assert "file" in rows["world_size"] and "default" in rows["ddr_cap"] and "128.0 GiB" in rows["ddr_cap"]


def test_a_plans_report_names_the_constants_its_critical_path_is_counted_in(tmp_path, capsys):
    from tests.paths import ROOT

    topology = tmp_path / "bare.yaml"
    topology.write_text("world_size: 4\ncompute_device: cuda\n")
    assert main(["plan", "--no-track", str(DEMO), "--topology", str(topology), "--out", str(tmp_path / "d"),
                 "--no-chart"]) == 0
    out = capsys.readouterr().out  # without a profile: TorchRec's defaults, every bandwidth among them
    assert "(TorchRec cost model)" in out and "hbm_mem_bw" in out[out.index("defaults:"):]
    profile = ROOT / "examples" / "profiles" / "h100_sxm_datasheet.yaml"  # sets every bandwidth
    assert main(["plan", "--no-track", str(DEMO), "--topology", str(topology), "--profile", str(profile),
                 "--out", str(tmp_path / "p"), "--no-chart"]) == 0
    out = capsys.readouterr().out
    assert "(TorchRec cost model)" not in out
    assert "critical path:" in out and "(TorchRec's cost model under profile h100-sxm-datasheet)" in out
    # The defaults line names the topology's defaults the plan used, not the bandwidths the profile replaced.
    defaults = " ".join(out[out.index("defaults:"):out.index("profile:")].split())
    assert "ddr_cap 128.0 GiB" in defaults
    assert not any(bw in defaults for bw in ("hbm_mem_bw", "ddr_mem_bw", "intra_host_bw", "inter_host_bw"))


def test_show_tells_which_tables_sit_on_a_rank_and_its_compute_and_communication(cuda_plan, capsys):
    import json

    plan = json.loads((cuda_plan / "plan.json").read_text())
    sharded = next(t for t in plan["tables"] if not t.get("replicated"))
    rank = sharded["shards"][0]["rank"]
    assert main(["show", str(cuda_plan), "--rank", str(rank)]) == 0
    out = capsys.readouterr().out
    assert sharded["name"] in out and f"rank {rank}:" in out and "communication" in out
    assert main(["show", str(cuda_plan), "--table", sharded["name"]]) == 0
    assert f"table {sharded['name']}: {sharded['sharding_type']}" in capsys.readouterr().out
    assert main(["show", str(cuda_plan)]) == 0
    lines = capsys.readouterr().out.splitlines()
    header = lines[0].split()
    assert header[:5] == ["rank", "perf_ms", "compute_ms", "comm_ms", "comm"]
    # a rule under each named column, none under the unnamed one that marks the critical path
    named = ["rank", "perf_ms", "compute_ms", "comm_ms", "comm", "shards", "costliest (ms)"]
    assert len(lines[1].split()) == len(named) and "<- critical path" in lines[2]
    assert main(["show", str(cuda_plan), "--table", "no_such_*"]) == 2


def test_show_names_each_table_of_another_module_with_its_module(tmp_path, capsys):
    # two_tower_seq has an item_id in the item tower and another in the sequence tower
    assert main(["plan", "--no-track", str(TWO_TOWER_SEQ), "--topology", str(H100), "--out", str(tmp_path),
                 "--no-chart"]) == 0
    capsys.readouterr()
    assert main(["show", str(tmp_path), "--table", "*item_id"]) == 0
    titles = [line.split(":")[0] for line in capsys.readouterr().out.splitlines() if line.startswith("table ")]
    assert titles == ["table towers.item.ebc.item_id", "table sequence.ec.item_id"]
    assert main(["show", str(tmp_path), "--table", "sequence.ec.*"]) == 0
    assert "towers." not in capsys.readouterr().out
    assert main(["show", str(tmp_path), "--table", "item_id"]) == 2  # the name alone: where to find it
    hint = "a table outside the default module is module.name, e.g. 'towers.item.ebc.item_id'"
    assert hint in capsys.readouterr().err


def test_a_cuda_plan_on_a_machine_without_cuda_is_refused_before_anything_starts_with_one_message(
        cuda_plan, tmp_path, capfd, monkeypatch):
    pytest.importorskip("torch")
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    monkeypatch.chdir(tmp_path)
    for args in (["train", "--plan", str(cuda_plan), "--out", str(tmp_path / "train")],
                 ["run", str(DEMO), "--topology", str(H100), "--out", str(tmp_path / "run"),
                  "--tracking-uri", f"sqlite:///{tmp_path / 'm.db'}", "--state-dir", str(tmp_path / "s")]):
        r = shardflow_here(capfd, *args)
        assert r.returncode == 2, r.stderr
        assert r.stderr.count("without CUDA") == 1 and "NCCL" in r.stderr
        assert "Traceback" not in r.stderr and len(r.stderr.splitlines()) < 6
        assert not list(tmp_path.rglob("torchrun-node*.log"))  # nothing was launched, so nothing retried
    assert not (tmp_path / "m.db").exists()  # refused before Prefect and MLflow started


def test_a_closed_pipe_ends_the_output_quietly(tmp_path):
    spec = tmp_path / "many.yaml"
    spec.write_text("".join(f"- {{name: t{i}, num_embeddings: 10, embedding_dim: 4}}\n" for i in range(3000)))
    r = subprocess.run(f"'{SHARDFLOW}' spec show '{spec}' | head -2", shell=True, capture_output=True,
                       text=True, timeout=60)
    assert len(r.stdout.splitlines()) == 2
    assert r.stderr == ""


def test_compare_fits_its_table_to_the_terminal_most_telling_columns_first():
    from flows.commands.compare import HEADER, render_rows

    cells = {"plan_id": "0123456789abcdef", "planner": "torchrec-dp", "spec": "ranking_tables_2025_q3_all_markets",
             "topology": "h100_2x8", "profile": "default", "tables": "500", "world": "16", "pred_ms": "12.35",
             "lower_ms": "12.30", "gap": "0.407%", "spec_hash": "fedcba9876543210", "backend": "local",
             "previous": "-", "moved": "-", "run": "measure", "started": "2025-01-02 03:04", "batch": "512",
             "iters": "2000", "p50_ms": "15.02", "p90_ms": "16.10", "p50/pred": "1.22x", "samples_s": "545,300",
             "auc": "0.7887", "ne": "0.8114"}
    rows = [tuple(cells[name] for name in HEADER)] * 2
    narrow = render_rows(rows, 80)
    lines = narrow.splitlines()
    assert max(map(len, lines)) <= 80
    # Predicted against measured, who planned and which run (train or measure) before all else.
    assert lines[0].split()[:4] == ["plan_id", "planner", "spec", "topology"]
    assert {"pred_ms", "p50_ms", "run"} <= set(lines[0].split())
    spec = lines[2].split()[2]
    assert spec.startswith("ranking_") and spec.endswith("…")  # cut to make room; in full with --wide
    assert lines[-1].startswith("(") and "--wide" in lines[-1]
    wide = render_rows(rows, None).splitlines()
    assert wide[0].split() == list(HEADER) and "ranking_tables_2025_q3_all_markets" in wide[2]


def test_every_command_and_subcommand_prints_its_help(capsys):
    """argparse formats help text with %: a knob's help that says "within 2%" must not break --help."""
    import argparse

    from flows.cli import build_parser

    def commands(parser: argparse.ArgumentParser, path: tuple[str, ...]) -> list[tuple[str, ...]]:
        out = [path]
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, sub in action.choices.items():
                    out += commands(sub, (*path, name))
        return out

    for path in commands(build_parser(), ()):
        with pytest.raises(SystemExit) as done:
            build_parser().parse_args([*path, "--help"])
        assert done.value.code == 0, path
        assert "usage: shardflow" in capsys.readouterr().out


def test_show_rank_lists_the_costliest_shards_first_and_every_one_with_all(tmp_path, capsys):
    spec = tmp_path / "many.yaml"
    spec.write_text("".join(f"- {{name: t{i:02d}, num_embeddings: {1000 * (i + 1)}, embedding_dim: 16}}\n"
                            for i in range(60)))
    assert main(["plan", "--no-track", str(spec), "--topology", str(CPU_2PROC), "--out", str(tmp_path / "p"),
                 "--no-chart"]) == 0
    capsys.readouterr()
    assert main(["show", str(tmp_path / "p"), "--rank", "0"]) == 0
    summary = capsys.readouterr().out.splitlines()
    shards = int(summary[-1].split(": ", 1)[1].split()[0])  # rank 0: N shards, ...
    assert shards > 20
    rows = [line for line in summary if line.startswith("t") and not line.startswith("table ")]
    assert len(rows) == 20 and f"... {shards - 20:,} more rows (--all shows every row)" in summary
    costs = [float(next(cell for cell in line.split() if "." in cell)) for line in rows]  # perf_ms
    assert costs == sorted(costs, reverse=True)  # costliest first
    assert main(["show", str(tmp_path / "p"), "--rank", "0", "--all"]) == 0
    every = capsys.readouterr().out.splitlines()
    assert len([line for line in every if line.startswith("t") and not line.startswith("table ")]) == shards
    assert not any(line.startswith("...") for line in every)
    assert main(["show", str(tmp_path / "p"), "--all"]) == 2  # --all lists a rank's shards: it once did nothing
    assert "--all: lists every shard of one rank: give it with --rank R" in capsys.readouterr().err


def test_the_commands_run_prints_read_back_the_same_values_with_spaces_and_a_leading_dash(tmp_path, monkeypatch):
    """`compare --experiment -x` was once printed as typed: a flag to argparse, and a path with a space
    two arguments."""
    import shlex

    from flows.cli import build_parser
    from flows.commands.run import hints
    from tasks.tracking import Tracking

    monkeypatch.chdir(tmp_path)
    tracking = Tracking(f"sqlite:///{tmp_path / 'my runs' / 'mlflow.db'}", "-x y", str(tmp_path / "outbox"))
    lines = hints(tracking, str(tmp_path / "out dir" / "plan" / "plan.json"))
    parsed = [build_parser().parse_args(shlex.split(line.split(None, 1)[1])[1:]) for line in lines]
    assert parsed[0].plan == str(tmp_path / "out dir" / "plan")
    assert (parsed[1].tracking_uri, parsed[1].experiment) == ("sqlite:///my runs/mlflow.db", "-x y")
    assert (parsed[2].tracking_uri, parsed[2].experiment) == (tracking.uri, "-x y")


def test_the_summary_names_an_earlier_evaluation_clearly_better_than_the_last():
    """A model that overfits after an epoch reported only its last evaluation: the best one, and when,
    is one line more (only where it beats the last by more than OVERFIT_AUC)."""
    from flows.reports import data_lines
    from rec.train.metrics import LatencyStats, LossStats, TrainMetrics

    def summary(*aucs: float) -> list[str]:
        evaluations: tuple[dict[str, float | int | None], ...] = tuple(
            {"iteration": 25 * (i + 1), "samples": 10, "auc": a, "logloss": 0.5, "ne": 0.9} for i, a in enumerate(aucs))
        stats = LatencyStats(1.0, 2.0, 3.0, 1.5)
        metrics = TrainMetrics("p", 2, 100, 1, 32, "naive", "dlrm", stats, LossStats(0.7, 0.5, 0.6), 100.0, {}, 0,
                               eval={k: v for k, v in evaluations[-1].items() if k != "iteration"},
                               evaluations=evaluations)
        return [line.strip() for line in data_lines(metrics)]

    assert summary(0.60, 0.698, 0.68, 0.666)[-1] == (
        "best auc 0.6980 after iteration 50: the model overfit after it (fewer --iterations, or lower learning rates)")
    assert summary(0.60, 0.668, 0.666)[-1].startswith("eval      auc 0.6660")  # within 0.005: no line


def test_predict_given_a_target_or_a_trainings_folder_says_what_it_takes(tmp_path, capfd):
    """Both once read as "model.json: no such file"."""
    (tmp_path / "run" / "checkpoints").mkdir(parents=True)
    for model, said in (("m/models.py:two_tower", "a model of your own (TARGET) is not exported"),
                        (str(tmp_path / "run"), f"is a training's folder: shardflow export --checkpoint {tmp_path}")):
        code = main(["predict", "--model", model, "--data", str(tmp_path / "d.parquet"), "--out",
                     str(tmp_path / "p.parquet")])
        err = capfd.readouterr().err
        assert code == 2 and said in err and "Traceback" not in err


def test_paths_in_the_commands_printed_to_run_next_work_as_typed():
    """`next shardflow predict --model sp ace/e`, `--data -c` (from `--out ./-c`) did not."""
    from flows.reports import shell_path

    assert shell_path("sp ace/e") == "'sp ace/e'"
    assert shell_path("-c") == "./-c" and shell_path("-c d") == "'./-c d'"
    assert shell_path("/abs/-c") == "/abs/-c"


def test_a_command_a_note_quotes_is_typed_as_this_shell_runs_shardflow(monkeypatch, tmp_path):
    """`measure them with `shardflow calibrate ...``: not on PATH where the venv is not activated,
    while `run` printed `.venv/bin/shardflow show ...` beside it."""
    from flows.reports import command, typed
    from rec.analysis.iteration_time import UNCALIBRATED_NOTE

    monkeypatch.setenv("PATH", str(tmp_path))  # no shardflow on it
    assert command("shardflow") != "shardflow" and command("shardflow").endswith("shardflow")
    assert f"`{command('shardflow')} calibrate --topology TOPO" in typed(UNCALIBRATED_NOTE)
    assert "`shardflow" not in typed(UNCALIBRATED_NOTE)


def test_metrics_one_class_of_labels_leaves_undefined_are_named_not_left_out():
    """An evaluation set of one class printed `eval      logloss 0.0001 on 50,000 held-out samples`:
    no word of the AUC and NE it was run for (null in eval_metrics.json)."""
    from flows.reports import shown_metrics

    assert shown_metrics({"auc": None, "logloss": 0.0001, "ne": None, "samples": 50_000}) == (
        "logloss 0.0001 (auc and ne undefined: every label of the evaluation data is the same; evaluate on "
        "data of both classes)")
    assert shown_metrics({"auc": 0.78866, "logloss": 0.4569, "ne": 0.8132, "samples": 5}) == \
        "auc 0.7887, logloss 0.4569, ne 0.8132"


def test_output_the_terminals_encoding_cannot_show_is_replaced_not_a_failure(tmp_path):
    """`LC_ALL=C` or `PYTHONIOENCODING=ascii`: a summary naming a path (or a message with a dash) that
    the encoding cannot show ended a command whose work had succeeded in a UnicodeEncodeError, exit 1."""
    out = tmp_path / "café"
    r = subprocess.run([str(SHARDFLOW), "plan", "--no-track", str(DEMO), "--topology", str(CPU_2PROC), "--out",
                        str(out)], env={"PATH": "/usr/bin:/bin", "PYTHONIOENCODING": "ascii"},
                       capture_output=True, timeout=120)
    assert r.returncode == 0 and b"Traceback" not in r.stderr, r.stderr[-2000:]
    assert f"wrote {tmp_path}/caf?/plan.json".encode() in r.stdout and (out / "plan.json").is_file()


def test_fbgemm_1_6s_notice_of_its_own_missing_version_is_not_printed(caplog):
    """FBGEMM 1.6.0 logs, per library it loads, that its compatibility table has no entry for 1.6: 84
    lines before `export`, `predict` or `spec from-model` said anything on the GPU image's stack. Its
    other warnings (an unlisted PyTorch) still reach the user."""
    import logging

    from flows.logs import set_up

    set_up(False)
    set_up(False)  # once per process, however often
    logging.warning("\n            _fbgemm_torch_compat_table has no entry for 1.6.0 of FBGEMM;\n"
                    "            cannot determine compatibility with PyTorch 2.11.0+cu130\n")
    logging.warning("FBGEMM_GPU version is 1.6.0, which is not guaranteed to be compatible with PyTorch 2.13.0")
    assert [r.getMessage()[:30] for r in caplog.records] == ["FBGEMM_GPU version is 1.6.0, w"]
    assert len([f for f in logging.getLogger().filters if type(f).__name__ == "UnlistedFbgemm"]) == 1
