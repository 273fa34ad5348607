"""Flags are spelled out: no abbreviations, and an unknown flag is named first, with the flag it
most likely meant and the usage of the command it was given to."""

from __future__ import annotations

import argparse

from flows.cli import build_parser
from tests.flows.cli_in_process import shardflow_here
from tests.paths import CPU_2PROC, DEMO


def parsers(parser: argparse.ArgumentParser) -> list[argparse.ArgumentParser]:
    found = [parser]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                found += parsers(sub)
    return found


def test_no_parser_takes_abbreviations():
    every = parsers(build_parser())
    assert len(every) > 15
    assert all(p.allow_abbrev is False for p in every), [p.prog for p in every if p.allow_abbrev]


def test_an_abbreviation_is_refused_with_the_flag_it_means(capfd):
    result = shardflow_here(capfd, "train", "--plan", "plan.json", "--iteration", "50")
    assert result.returncode == 2
    assert "error: unrecognized arguments: --iteration (did you mean --iterations?)" in result.stderr
    assert result.stderr.startswith("usage: shardflow train")


def test_an_unknown_flag_is_named_before_a_missing_one(capfd):
    result = shardflow_here(capfd, "plan", "--no-track", str(DEMO), "--topolgy", str(CPU_2PROC))
    assert result.returncode == 2
    assert "--topolgy (did you mean --topology?)" in result.stderr
    assert "is required" not in result.stderr
    assert result.stderr.startswith("usage: shardflow plan")
    assert len(result.stderr.splitlines()) < 25


def test_an_unknown_flag_shows_the_usage_of_its_command(capfd):
    result = shardflow_here(capfd, "plan", "--no-track", str(DEMO), "--topology", str(CPU_2PROC), "--iters", "3")
    assert result.returncode == 2
    assert result.stderr.startswith("usage: shardflow plan"), result.stderr
    assert "unrecognized arguments: --iters" in result.stderr
    nested = shardflow_here(capfd, "spec", "show", str(DEMO), "--bogus")
    assert nested.returncode == 2 and nested.stderr.startswith("usage: shardflow spec show"), nested.stderr


def test_a_mistyped_command_is_named_with_the_one_it_most_likely_meant_whatever_flags_follow(capfd):
    """`shardflow trian --plan x` once said only that --plan was unrecognized."""
    for args, said in ((["trian", "--plan", "x"], "invalid choice: 'trian'"),
                       (["-v", "trian", "--plan", "x"], "invalid choice: 'trian'"),
                       (["spec", "shw", str(DEMO)], "invalid choice: 'shw'")):
        result = shardflow_here(capfd, *args)
        last = result.stderr.splitlines()[-1]
        assert result.returncode == 2 and said in last and "unrecognized" not in last, result.stderr
        assert last.endswith("; did you mean train?" if "trian" in said else "; did you mean show?"), last
