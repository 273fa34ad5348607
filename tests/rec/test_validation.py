"""One validation grammar (rec.validation): a number, a size, a name and an unknown key mean the same in a
spec, a topology and a profile, and every problem of a file is named, also when one key fails to parse."""

from __future__ import annotations

from pathlib import Path

import pytest

from rec.errors import InputError
from rec.profile import read_profile
from rec.spec import read_spec
from rec.topology import read_topology
from rec.validation import Problems, integer, positive_integer


def spec_file(tmp_path: Path, cell: str, column: str = "num_embeddings") -> Path:
    cells = {"name": "t", "num_embeddings": "1000", "embedding_dim": "16", column: cell}
    path = tmp_path / "spec.yaml"
    path.write_text("- {" + ", ".join(f"{k}: {v}" for k, v in cells.items()) + "}\n")
    return path


def topology_file(tmp_path: Path, key: str, value: str) -> Path:
    path = tmp_path / "topology.yaml"
    path.write_text(f"world_size: 2\ncompute_device: cpu\n{key}: {value}\n")
    return path


def profile_file(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "profile.yaml"
    path.write_text(text)
    return path


def read_all(tmp_path: Path, written: str) -> tuple[int, int, int]:
    """``written`` as a spec's num_embeddings, a topology's batch_size and a profile's machine.world_size."""
    spec = read_spec(spec_file(tmp_path, written))
    topology = read_topology(topology_file(tmp_path, "batch_size", written))
    profile = read_profile(profile_file(tmp_path, f"machine: {{device: cpu, world_size: {written}}}\n"))
    assert profile.machine is not None and profile.machine.world_size is not None
    return spec.tables[0].num_embeddings, topology.batch_size, profile.machine.world_size


@pytest.mark.parametrize("written", ["1000", "1e3", "1E3", "1000.0", "1.0e+3", "10e2", "+1000", "01000"])
def test_an_integer_is_read_the_same_way_in_specs_topologies_and_profiles(tmp_path, written):
    assert read_all(tmp_path, written) == (1000, 1000, 1000)


@pytest.mark.parametrize("written, reason", [
    ("true", "expected a positive integer, got True"),
    (".nan", "got NaN (not a number)"),
    (".inf", "expected a positive integer, got inf"),
    ("1000.5", "expected a positive integer, got 1000.5"),
    ("1.0005e3", "expected a positive integer, got 1000.5"),
    ("0", "must be > 0, got 0"),
    ("-1e3", "must be > 0, got -1,000"),
    ("'1_000'", "expected a positive integer, got '1_000'"),
    ("'0x10'", "expected a positive integer, got '0x10'"),
    ("1_000", "expected a positive integer, got '1_000'"),  # YAML 1.1's forms are text, as in YAML 1.2
    ("16:40", "expected a positive integer, got '16:40'"),
])
def test_what_is_no_positive_integer_is_refused_alike_everywhere(tmp_path, written, reason):
    for read, path in ((read_spec, spec_file(tmp_path, written)),
                       (read_topology, topology_file(tmp_path, "batch_size", written)),
                       (read_profile, profile_file(tmp_path, f"machine: {{device: cpu, world_size: {written}}}\n"))):
        with pytest.raises(InputError) as e:
            read(path)
        assert reason in e.value.render(), (read.__name__, e.value.render())


def test_text_is_a_number_only_where_the_format_has_no_types(tmp_path):
    """CSV cells are text: a spec reads "1e3" from them; a topology or a profile takes YAML numbers."""
    csv = tmp_path / "spec.csv"
    csv.write_text("name,num_embeddings,embedding_dim,pooling_factor\nt,1e3,16,2.5e-1\n")
    table = read_spec(csv).tables[0]
    assert (table.num_embeddings, table.pooling_factor) == (1000, 0.25)
    assert read_spec(spec_file(tmp_path, "'1e3'")).tables[0].num_embeddings == 1000
    with pytest.raises(InputError, match="batch_size: expected a positive integer, got '8'"):
        read_topology(topology_file(tmp_path, "batch_size", "'8'"))
    csv.write_text("name,num_embeddings,embedding_dim\nt,1_000,16\n")
    with pytest.raises(InputError, match="expected a positive integer, got '1_000'"):
        read_spec(csv)


def test_numbers_with_exponents_are_numbers_in_every_file(tmp_path):
    """YAML 1.1 (PyYAML) reads 1e-3 as text; shardflow reads it as the number JSON and YAML 1.2 mean."""
    topology = read_topology(topology_file(tmp_path, "storage_reservation", "1.5e-1"))
    assert topology.storage_reservation == 0.15
    profile = read_profile(profile_file(tmp_path, "coefficients: {table_wise: {fwd: {fixed_ms: 1e-3}}}\n"
                                                  "extensions: {iteration_ms: 2E-2}\n"))
    assert profile.coefficients.table_wise.fwd.fixed_ms == 0.001 and profile.extensions.iteration_ms == 0.02
    assert read_spec(spec_file(tmp_path, "5e-1", "pooling_factor")).tables[0].pooling_factor == 0.5
    assert read_topology(topology_file(tmp_path, "hbm_mem_bw", "9e11")).hbm_mem_bw == 9e8  # bytes/ms


def test_sizes_take_units_and_exponents(tmp_path):
    for written, size in (("80GiB", 80 * 2**30), ("1e9", 10**9), ("'1.5e3 KB'", 1_500_000), ("512 GB", 512 * 10**9)):
        assert read_topology(topology_file(tmp_path, "ddr_cap", written)).ddr_cap == size
    assert read_topology(topology_file(tmp_path, "inter_host_bw", "400Gbit/s")).inter_host_bw == 5e10 / 1000
    with pytest.raises(InputError, match=r"'100Gb/s': a lowercase b is a bit in network speeds"):
        read_topology(topology_file(tmp_path, "inter_host_bw", "100Gb/s"))


def test_every_problem_of_a_profile_is_named_when_a_time_is_no_time(tmp_path):
    """A timestamp YAML cannot build (month 13) is the key's problem, named with the others."""
    path = profile_file(tmp_path, "bandwith: {}\nmachine: {device: cpu, measured_at: 2025-13-01T00:00:00Z, "
                                  "world_size: 0}\nextensions: {iteration_ms: -1}\n")
    with pytest.raises(InputError) as e:
        read_profile(path)
    text = e.value.render()
    assert "machine.measured_at: expected an ISO 8601 time" in text and "2025-13-01" in text
    assert "machine.world_size: must be > 0, got 0" in text
    assert "bandwith: unknown key; did you mean 'bandwidths'?" in text
    assert "extensions.iteration_ms: must be between 0 and" in text
    assert "month must be" not in text and "line 1" not in text


def test_control_characters_in_names_are_refused_and_shown_escaped(tmp_path):
    path = profile_file(tmp_path, 'name: "calibrated\\x1b[2J\\non a GPU"\n'
                                  'machine: {device: cpu, device_name: "a\\tb"}\n')
    with pytest.raises(InputError) as e:
        read_profile(path)
    text = e.value.render()
    assert "name: " in text and "holds a control character" in text and "machine.device_name" in text
    assert "\x1b" not in text and "\t" not in text and text.count("\n") == 2
    csv = tmp_path / "spec.csv"
    csv.write_text("name,num_embeddings,embedding_dim,feature_names\nt,10,16,a\x1bb;c\n")
    with pytest.raises(InputError, match="control character"):
        read_spec(csv)


def test_unknown_keys_get_the_closest_known_one_in_every_file(tmp_path):
    cases = ((read_spec, spec_file(tmp_path, "16", "embeding_dim"), "did you mean 'embedding_dim'?"),
             (read_topology, topology_file(tmp_path, "batch_sise", "8"), "did you mean 'batch_size'?"),
             (read_profile, profile_file(tmp_path, "extensions: {iteration_mss: 1}\n"), "did you mean 'iteration_ms'?"))
    for read, path, hint in cases:
        with pytest.raises(InputError) as e:
            read(path)
        assert hint in e.value.render()


def test_rules_and_the_collector():
    problems = Problems(root="plan.json")
    inner = problems.within("topology")
    assert inner.take("world_size", positive_integer, "two") is None
    assert inner.take("batch_size", positive_integer, 2.0) == 2
    inner.add("", "expected a mapping")
    problems.add("", "is not a plan")
    assert [str(p) for p in problems.items] == ["topology.world_size: expected a positive integer, got 'two'",
                                                "topology: expected a mapping", "plan.json: is not a plan"]
    with pytest.raises(ValueError, match="must be at most"):
        integer(2**63, maximum=2**62)
    with pytest.raises(ValueError, match="expected an integer"):
        integer("١٢٣", text=True)  # digits of another script are not a number shardflow reads


def test_a_problem_line_cuts_long_places_and_keeps_its_reason_whole():
    from rec.errors import MAX_LINE, Problem

    reason = "a reason long enough to say what to do, " * 4
    paths = [f"/{'deep/' * 30}file-{i}" for i in range(5)]
    line = InputError("Bad:", [Problem(p, reason) for p in paths]).render().splitlines()[1]
    assert line.endswith(f" and 4 more: {reason}") and len(line) <= MAX_LINE + 4  # none of the others cut
    assert paths[0][:40] in line


def test_places_of_one_reason_are_named_whole_where_the_line_can_hold_them():
    """Two links under a long --out shared one line, cut in the second path: the user never saw it."""
    from rec.errors import Problem

    reason = "is a symbolic link: shardflow follows no link and opens no special file in a folder it owns; remove it"
    out = f"/tmp/{'a-long-folder/' * 7}out"
    two = [f"{out}/logs/rank-0.log", f"{out}/checkpoints/step_00000002"]
    assert InputError("Cannot train:", [Problem(p, reason) for p in two]).render().splitlines()[1:] == [
        f"  - {two[0]}: {reason}", f"  - {two[1]}: {reason}"]
    short = ["table 'a'", "table 'b'", "table 'c'", "table 'd'"]
    assert InputError("Bad:", [Problem(p, "too big") for p in short]).render().splitlines()[1] == \
        "  - table 'a', table 'b', table 'c' and 1 more: too big"
    many = [f"{out}/step_{i:08d}" for i in range(6)]  # as many whole as the line holds, then how many more
    line = InputError("Bad:", [Problem(p, reason) for p in many]).render().splitlines()[1]
    assert line == f"  - {many[0]} and 5 more: {reason}"


def test_problems_with_long_places_still_fit_one_screen():
    """Places too long to share a line take one each: the lines shown, not the reasons, are limited."""
    from rec.errors import MAX_LINE, MAX_PROBLEMS_SHOWN, Problem

    out = f"/tmp/{'a-long-folder/' * 12}out"
    problems = [Problem(f"{out}/{kind}-{i}", f"reason {i}") for i in range(40) for kind in ("logs", "checkpoints")]
    lines = InputError("Cannot train:", problems).render().splitlines()
    assert len(lines) == 1 + MAX_PROBLEMS_SHOWN + 1 and lines[-1] == "  ... and 50 more problems"
    assert all(len(line) <= MAX_LINE + 4 for line in lines)
