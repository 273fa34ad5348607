"""The profile is a path setting of the search's settings: every command and flow that plans takes it."""

from __future__ import annotations

import inspect

import pytest

from flows.cli import build_parser
from rec.settings import from_flags
from tasks.search import SearchSettings, with_profile
from tests.paths import CPU_2PROC, DEMO, ROOT

PROFILE = ROOT / "examples" / "profiles" / "h100_sxm_datasheet.yaml"


@pytest.mark.parametrize("command", ["plan", "run", "replan"])
def test_every_planning_command_takes_a_profile_into_its_search_settings(command):
    args = build_parser().parse_args([command, str(DEMO), "--topology", str(CPU_2PROC), "--profile", str(PROFILE),
                                      *(["--out", "x"] if command == "plan" else [])])
    settings = from_flags(SearchSettings, args)
    assert settings.profile == str(PROFILE)
    assert with_profile(settings).cost.profile.name  # the file read into the cost model


def test_the_flows_take_the_profile_inside_searching():
    from flows.pipeline import pipeline_flow
    from flows.plan import plan_flow
    from flows.replan import replan_flow

    for flow in (plan_flow, replan_flow, pipeline_flow):
        assert "profile_path" not in inspect.signature(flow.fn).parameters
        assert "searching" in inspect.signature(flow.fn).parameters
