"""A checkpoint's index (DCP's pickled ``.metadata``) is read without running anything in it.

The crafted indexes are built opcode by opcode, as an attacker would write them; most create a
marker file when plain ``pickle`` loads them (the others try opcodes or names a loader must not
follow), and none may run here."""

from __future__ import annotations

import os
import pickle
import struct
from pathlib import Path

import pytest
import torch
import torch.distributed.checkpoint as dcp

from rec.train import restricted_pickle
from rec.train.checkpoint import (
    CheckpointMetadataError,
    SafeFileSystemReader,
    check_index,
    index_globals,
    read_index,
)
from rec.train.restricted_pickle import RefusedPickle
from rec.train.resume import step_dir

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled")  # one-process checkpoints
METADATA = "torch.distributed.checkpoint.metadata"
P2, P4, STOP = b"\x80\x02", b"\x80\x04", b"."
MARK, TUPLE, TUPLE1, EMPTY_TUPLE, EMPTY_DICT = b"(", b"t", b"\x85", b")", b"}"
REDUCE, BUILD, NEWOBJ, SETITEM, STACK_GLOBAL = b"R", b"b", b"\x81", b"s", b"\x93"


def text(value: str) -> bytes:
    """BINUNICODE: a str in any protocol from 1 on."""
    data = value.encode()
    return b"X" + struct.pack("<I", len(data)) + data


def global_(module: str, name: str) -> bytes:
    """GLOBAL (protocols 0-3): the module and name as lines."""
    return b"c" + f"{module}\n{name}\n".encode()


def stack_global(module: str, name: str) -> bytes:
    """STACK_GLOBAL (protocol 4): module and name from the stack, dotted names allowed."""
    return text(module) + text(name) + STACK_GLOBAL


def shell(marker: Path) -> bytes:
    return text(f"touch {marker}")


def crafted(marker: Path) -> dict[str, bytes]:
    """Indexes that run ``touch marker`` when unpickled by anything that trusts what they name."""
    run = shell(marker) + TUPLE1 + REDUCE
    metadata_object = stack_global(METADATA, "Metadata") + EMPTY_TUPLE + NEWOBJ
    return {
        "protocol 2 GLOBAL os.system + REDUCE": P2 + global_("os", "system") + run + STOP,
        "protocol 2 GLOBAL builtins.exec + REDUCE": P2 + global_("builtins", "exec")
        + text(f"open({str(marker)!r}, 'w')") + TUPLE1 + REDUCE + STOP,
        "protocol 2 GLOBAL naming a dotted name in an allowed module": P2 + global_(METADATA, "os.system") + run + STOP,
        "STACK_GLOBAL dotted through DCP's metadata module": P4 + stack_global(METADATA, "os.system") + run + STOP,
        "STACK_GLOBAL dotted through torch": P4 + stack_global("torch", "os.system") + run + STOP,
        "STACK_GLOBAL dotted through pathlib": P4 + stack_global("pathlib", "os.system") + run + STOP,
        "STACK_GLOBAL dotted through an allowed class": P4
        + stack_global("torch", "Size.__init__.__globals__") + STOP,
        "NEWOBJ of a class outside the allow-list": P4 + stack_global("subprocess", "Popen")
        + MARK + MARK + text("touch") + text(str(marker)) + b"l" + TUPLE + NEWOBJ + STOP,
        "REDUCE nested in the state of a legitimate Metadata": P4 + metadata_object + EMPTY_DICT
        + text("state_dict_metadata") + stack_global("os", "system") + run + SETITEM + BUILD + STOP,
        "REDUCE nested deep in a legitimate Metadata's storage": P4 + metadata_object + EMPTY_DICT
        + text("storage_data") + EMPTY_DICT + text("x") + stack_global("posix", "system") + run
        + SETITEM + SETITEM + BUILD + STOP,
        "INST": MARK + shell(marker) + b"ios\nsystem\n" + STOP,
        "OBJ": MARK + global_("os", "system") + shell(marker) + b"o" + STOP,
        "extension registry (EXT1)": P2 + b"\x82\x01" + run + STOP,
        "persistent id (BINPERSID)": P2 + shell(marker) + b"Q" + STOP,
    }


CASES = sorted(crafted(Path("m")))


@pytest.mark.parametrize("case", CASES)
def test_a_crafted_index_is_refused_and_nothing_in_it_runs(case, tmp_path):
    marker = tmp_path / "ran"
    with pytest.raises(RefusedPickle):
        restricted_pickle.load(crafted(marker)[case], index_globals())
    assert not marker.exists()


def test_build_cannot_patch_an_allowed_class_nor_plant_a_method_in_an_instance():
    from torch.distributed.checkpoint.metadata import Metadata

    layout = stack_global("torch.serialization", "_get_layout")
    patch_class = (P4 + stack_global(METADATA, "Metadata") + MARK + b"N" + EMPTY_DICT + text("__eq__") + layout
                   + SETITEM + TUPLE + BUILD + STOP)
    plant = (P4 + stack_global(METADATA, "Metadata") + EMPTY_TUPLE + NEWOBJ + EMPTY_DICT + text("__setstate__")
             + layout + SETITEM + BUILD + STOP)
    eq = Metadata.__eq__
    for data, reason in ((patch_class, "not an instance"), (plant, "not a dict of field names")):
        with pytest.raises(RefusedPickle, match=reason):
            restricted_pickle.load(data, index_globals())
    assert Metadata.__eq__ is eq


class _RunsOnLoad:
    """What ``pickle.dumps`` writes for an object that runs a command when it is unpickled."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


@pytest.fixture(scope="module")
def real_step(tmp_path_factory) -> Path:
    """A real DCP checkpoint (one process): tensors, an optimizer's step count and learning rate."""
    step = step_dir(tmp_path_factory.mktemp("ckpt"), 4)
    state = {"model": {"table.weight": torch.randn(8, 4), "dense.bias": torch.zeros(3)},
             "optim": {"state": {"table.weight": {"momentum1": torch.ones(8), "step": torch.tensor(4.0)}},
                       "param_groups": [{"lr": 0.05, "params": ["table.weight"]}]}}
    dcp.save(state, checkpoint_id=str(step), no_dist=True)
    return step


def test_a_real_index_reads_exactly_as_pickle_reads_it(real_step):
    with open(real_step / ".metadata", "rb") as f:
        trusted = pickle.load(f)  # our own file, just written
    index = read_index(real_step)
    index.storage_meta.load_id = trusted.storage_meta.load_id
    assert index == trusted


def test_an_index_python_3_11_2_wrote_reads_as_a_later_pythons_and_getattr_reaches_only_enum_members(real_step):
    """Python 3.11.0-3.11.2 (Debian 12's) pickle an enum member as ``getattr(its class, its name)``: every
    checkpoint such a Python wrote was refused ("it names builtins.getattr"), so nothing could be
    resumed, evaluated or exported. getattr reaches an allowed enum's members, nothing else."""
    import collections
    import enum
    import io

    from torch.distributed.checkpoint.metadata import _MEM_FORMAT_ENCODING

    with open(real_step / ".metadata", "rb") as f:
        trusted = pickle.load(f)  # our own file, just written

    def written_so(value, reduce):
        class Old(pickle.Pickler):
            def reducer_override(self, obj):
                return reduce(obj)

        out = io.BytesIO()
        Old(out, protocol=4).dump(value)
        return out.getvalue()

    old = written_so(trusted, lambda obj: (getattr, (type(obj), obj.name)) if isinstance(obj, enum.Enum)
                     else NotImplemented)
    assert b"getattr" in old and restricted_pickle.load(old, index_globals()) == trusted
    for owner, name in ((_MEM_FORMAT_ENCODING, "__class__"), (collections.OrderedDict, "fromkeys")):
        marker = object()
        crafted = written_so(marker, lambda obj, o=owner, n=name, m=marker: (getattr, (o, n)) if obj is m
                             else NotImplemented)
        with pytest.raises(RefusedPickle, match="which is no enum member"):
            restricted_pickle.load(crafted, index_globals())


@pytest.mark.parametrize("protocol", [2, 4, 5])
def test_a_real_index_carrying_a_payload_is_refused_in_every_protocol(real_step, tmp_path, protocol):
    with open(real_step / ".metadata", "rb") as f:
        metadata = pickle.load(f)
    marker = tmp_path / "ran"
    metadata.planner_data = {"model.table.weight": (_RunsOnLoad(marker),)}
    (tmp_path / ".metadata").write_bytes(pickle.dumps(metadata, protocol=protocol))
    with pytest.raises(CheckpointMetadataError, match=r"names (os|posix)\.system"):
        read_index(tmp_path)
    assert not marker.exists()


def test_an_index_that_points_outside_its_checkpoint_or_at_missing_data_is_refused(real_step, tmp_path):
    import shutil

    with open(real_step / ".metadata", "rb") as f:
        metadata = pickle.load(f)
    copy = tmp_path / "copy"
    shutil.copytree(real_step, copy)
    data = next(copy.glob("*.distcp"))
    data.write_bytes(data.read_bytes()[:10])  # a checkpoint cut short
    with pytest.raises(CheckpointMetadataError, match="incomplete"):
        read_index(copy)
    for info in metadata.storage_data.values():
        info.relative_path = "../../etc/passwd"
    (copy / ".metadata").write_bytes(pickle.dumps(metadata))
    with pytest.raises(CheckpointMetadataError, match="outside its directory"):
        read_index(copy)


def test_the_in_job_load_refuses_a_crafted_index_with_nothing_run(real_step, tmp_path):
    """The ranks check the index themselves before DCP reads it (DCP would only log a refusal and
    fall back to per-rank indexes), and DCP reads it through the same loader."""
    import shutil

    from rec.errors import InputError

    marker = tmp_path / "ran"
    copy = tmp_path / "copy"
    shutil.copytree(real_step, copy)
    payload = crafted(marker)["STACK_GLOBAL dotted through DCP's metadata module"]
    (copy / ".metadata").write_bytes(payload)
    (copy / "__0.metadata").write_bytes(payload)  # DCP's fallback, per-rank index
    with pytest.raises(InputError, match=r"names torch\.distributed\.checkpoint\.metadata\.os\.system"):
        check_index(copy)
    state = {"model": {"table.weight": torch.zeros(8, 4), "dense.bias": torch.ones(3)}}
    with pytest.raises(BaseException, match="nothing in it was run"):  # DCP wraps what its reader raises
        dcp.load(state, storage_reader=SafeFileSystemReader(str(copy)), no_dist=True)
    assert not marker.exists() and torch.equal(state["model"]["dense.bias"], torch.ones(3))


def test_a_damaged_index_is_refused_with_a_reason_never_an_unexpected_error(real_step):
    import random

    from rec.train.checkpoint import parse_index

    data = (real_step / ".metadata").read_bytes()
    rng = random.Random(17)
    for _ in range(200):
        damaged = bytearray(data)
        for _ in range(rng.randint(1, 4)):
            damaged[rng.randrange(len(damaged))] = rng.randrange(256)
        if rng.random() < 0.2:
            damaged = damaged[:rng.randrange(len(damaged))]
        try:
            parse_index(bytes(damaged), real_step)
        except CheckpointMetadataError:
            pass


def test_a_checkpoint_of_another_model_is_bad_input_naming_the_parameter(single_process_group, tmp_path):
    """A model of one's own whose code changed since its checkpoint (a layer 32 wide, now 48), resumed:
    DCP's size mismatch failed the ranks with exit 1, which Prefect and --max-restarts retried; a
    parameter the checkpoint lacks did the same. Bad input now, naming the parameter and the way on."""
    from torch import nn

    from rec.errors import InputError
    from rec.train import checkpoint

    def model_and_optimizer(width: int, extra: bool = False):
        model = nn.Sequential(nn.Linear(4, width), nn.Linear(width, 1), *([nn.Linear(1, 1)] if extra else []))
        return model, torch.optim.Adagrad(model.parameters())

    model, optimizer = model_and_optimizer(32)
    state = {"model": model.state_dict(), "optim": optimizer.state_dict()}
    dcp.save(state, checkpoint_id=str(step_dir(tmp_path, 10)))
    for wider, extra, named in ((48, False, "Size mismatch between saved torch.Size([32, 4]) and current: "
                                            "torch.Size([48, 4]) for model.0.weight"),
                                (32, True, "Missing key in checkpoint state_dict: model.2.weight")):
        with pytest.raises(InputError) as e:
            checkpoint.load(tmp_path, 10, *model_and_optimizer(wider, extra))
        (problem,) = e.value.problems
        assert named in problem.reason and "resume with the model it was trained with" in problem.reason
