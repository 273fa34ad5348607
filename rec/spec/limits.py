"""What a spec may hold, and why: what TorchRec can build, and what the cost model computes exactly.

The cost model (``rec.cost``) counts bytes in int64 and adds them up in float64. Its largest
numbers are a data_parallel table's bytes summed over every rank (table bytes x up to 3 for Adam's
state x world_size) and a rank's input/output buffers (ids or pooled values per sample x
world_size x batch_size x 8 bytes). With the topology's bounds (``rec.topology.types``: at most
2^16 ranks and 2^30 samples per step) the bounds below keep each of them under 2^62, and a rank's
total under 2^53 bytes (exact in float64), instead of wrapping around to a wrong plan.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable

from rec.errors import Problem
from rec.sharding import ComputeKernel, ShardingType
from rec.topology.types import MAX_SAMPLES_PER_STEP, MAX_WORLD_SIZE
from rec.units import format_bytes, format_count, power_of_two

MAX_TABLES = 1_000_000
MAX_EMBEDDING_DIM = 65_536
MAX_TABLE_WEIGHTS = 2**42  # x 4 B x 3 (Adam) x 2^16 ranks < 2^62
MAX_SPEC_WEIGHTS = 2**48  # x 4 B x 3 on one rank < 2^53
MAX_IDS_PER_SAMPLE = 2**27  # x 2^30 samples x 8 B < 2^61
MAX_POOLED_WIDTH = 2**27  # x 2^30 samples x 4 B < 2^60
DIM_MULTIPLE = 4  # FBGEMM's fused (TBE) kernels: "local_cols ... not divisible by 4"
MAX_NAME_LENGTH = 128
MAX_MODULE_LENGTH = 512
_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_-]*")
# A submodule's fully qualified name as torch's named_modules() gives it: attribute names, and the
# indices of an nn.ModuleList or nn.Sequential, joined by '.'.
# A part is an attribute name, a list index or a ModuleDict key ("user-tower": PyTorch takes any key without '.')
_MODULE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_-]*(?:\.[A-Za-z0-9_][A-Za-z0-9_-]*)*")
MODULE_RULE = (
    "a module's fully qualified name in the model, as named_modules() gives it: attribute names, list indices "
    "or ModuleDict keys (ASCII letters, digits, '_' and '-', not starting with '-') joined by '.', at most "
    f"{MAX_MODULE_LENGTH} characters, e.g. 'towers.0.user_ebc'"
)
NAME_RULE = (
    f"use ASCII letters, digits, '_' and '-' (at most {MAX_NAME_LENGTH}, not starting with '-'): shardflow's rule, "
    "stricter than TorchRec's (each table is a module, whose name cannot contain '.')"
)
# The attributes of torch.nn.ModuleDict (torch 2.13, dunders aside), which holds TorchRec's tables: a
# table named like one fails with "attribute 'items' already exists" (tests compare with the installed torch).
MODULE_DICT_NAMES = frozenset((
    "_apply", "_backward_hooks", "_backward_pre_hooks", "_buffers", "_call_impl", "_compiled_call_impl",
    "_forward_hooks", "_forward_hooks_always_called", "_forward_hooks_with_kwargs", "_forward_pre_hooks",
    "_forward_pre_hooks_with_kwargs", "_get_backward_hooks", "_get_backward_pre_hooks", "_get_name",
    "_is_full_backward_hook", "_load_from_state_dict", "_load_state_dict_post_hooks",
    "_load_state_dict_pre_hooks", "_maybe_warn_non_full_backward_hook", "_modules", "_named_members",
    "_non_persistent_buffers_set", "_parameters", "_register_load_state_dict_pre_hook",
    "_register_state_dict_hook", "_replicate_for_data_parallel", "_save_to_state_dict", "_slow_forward",
    "_state_dict_hooks", "_state_dict_pre_hooks", "_version", "_wrapped_call_impl",
    "T_destination", "add_module", "apply", "bfloat16", "buffers", "call_super_init", "children", "clear",
    "compile", "cpu", "cuda", "double", "dump_patches", "eval", "extra_repr", "float", "forward", "get_buffer",
    "get_extra_state", "get_parameter", "get_submodule", "half", "ipu", "items", "keys", "load_state_dict",
    "modules", "mtia", "named_buffers", "named_children", "named_modules", "named_parameters", "parameters",
    "pop", "register_backward_hook", "register_buffer", "register_forward_hook", "register_forward_pre_hook",
    "register_full_backward_hook", "register_full_backward_pre_hook", "register_load_state_dict_post_hook",
    "register_load_state_dict_pre_hook", "register_module", "register_parameter",
    "register_state_dict_post_hook", "register_state_dict_pre_hook", "requires_grad_", "set_extra_state",
    "set_submodule", "share_memory", "state_dict", "to", "to_empty", "train", "training", "type", "update",
    "values", "xpu", "zero_grad",
))
RESERVED_RULE = ("is the name of a method of PyTorch's nn.ModuleDict, which holds TorchRec's tables "
                 "(\"attribute already exists\"); rename the table")
# What nn.ModuleDict adds to nn.Module: the other names are every module's, which no submodule can take.
MODULE_DICT_ONLY = frozenset(("clear", "items", "keys", "pop", "update", "values"))
MODULE_PART_RULE = ("is the name of an attribute of PyTorch's nn.Module, which no submodule can take "
                    "(\"attribute already exists\"); rename that part of the module path")
DIM_RULE = (
    "FBGEMM's CUDA kernels stop at 2,048 and wider tables split into thousands of column-wise shards"
)


def too_many_tables(count: int) -> str:
    """The reason a spec of ``count`` tables is refused (only when ``count > MAX_TABLES``)."""
    return (f"the spec has {count:,} tables, more than {MAX_TABLES:,}: shardflow is built for up to 100,000, "
            "and so many rows more likely mean a wrong file than a spec")


def is_table_name(name: str) -> bool:
    """A name TorchRec can use as a module name and that is safe as a file name."""
    return len(name) <= MAX_NAME_LENGTH and _NAME.fullmatch(name) is not None and not is_reserved(name)


def is_module_path(path: str) -> bool:
    """A dotted module name (``MODULE_RULE``)."""
    return len(path) <= MAX_MODULE_LENGTH and _MODULE.fullmatch(path) is not None


def is_reserved(name: str) -> bool:
    """A name an nn.ModuleDict (or nn.Module) already uses for itself."""
    return name in MODULE_DICT_NAMES or (name.startswith("__") and name.endswith("__"))


def is_module_attribute(name: str) -> bool:
    """A name every nn.Module already uses for itself: no part of a module path."""
    return is_reserved(name) and name not in MODULE_DICT_ONLY


def dense_only(
    sharding_types: tuple[ShardingType, ...] | None, compute_kernels: tuple[ComputeKernel, ...] | None
) -> bool:
    """The allow-lists leave only data_parallel, whose dense kernel takes any embedding_dim on cpu.

    (On cuda FBGEMM's dense kernel wants the dims of a kernel group to add up to a multiple of 4:
    that depends on the device, which the spec does not know; see the planner's device rules.)
    """
    return sharding_types == (ShardingType.DATA_PARALLEL,) or compute_kernels == (ComputeKernel.DENSE,)


def table_problems(
    rows: int,
    dim: int,
    sharding_types: tuple[ShardingType, ...] | None,
    compute_kernels: tuple[ComputeKernel, ...] | None,
) -> list[str]:
    """Why a table with valid cells cannot be planned or built (empty if it can)."""
    reasons = []
    if rows * dim > MAX_TABLE_WEIGHTS:
        reasons.append(
            f"num_embeddings x embedding_dim is {format_count(rows * dim)} weights, more than "
            f"{power_of_two(MAX_TABLE_WEIGHTS)} ({_fp32(MAX_TABLE_WEIGHTS)}): shardflow's cost model counts a "
            f"table's bytes with optimizer state on each of up to {MAX_WORLD_SIZE:,} ranks in 64-bit integers, "
            "which this would overflow"
        )
    if dim % DIM_MULTIPLE and not dense_only(sharding_types, compute_kernels):
        below = dim - dim % DIM_MULTIPLE
        choices = f"{below} or {below + DIM_MULTIPLE}" if below else f"{DIM_MULTIPLE}"
        reasons.append(
            f"embedding_dim {dim} is not a multiple of {DIM_MULTIPLE}, which FBGEMM's fused kernels need "
            f"(TorchRec: 'local_cols={dim} not divisible by {DIM_MULTIPLE}'); TorchRec uses them for every "
            f"sharding type but data_parallel: use {choices}, or sharding_types: [data_parallel] (dense kernel, "
            "cpu only)"
        )
    return reasons


def spec_problems(weights: Iterable[int], ids: Iterable[float], widths: Iterable[float]) -> list[Problem]:
    """Bounds on the whole spec, from each table's weights, ids per sample and output width (an
    unpooled table's is embedding_dim x features x pooling_factor: one vector per id)."""
    problems = []
    samples = f"{power_of_two(MAX_SAMPLES_PER_STEP)} samples per step (world_size x batch_size)"
    total = int(sum(weights))
    if total > MAX_SPEC_WEIGHTS:
        problems.append(Problem("spec", (
            f"the tables hold {format_count(total)} weights in all (num_embeddings x embedding_dim), more than "
            f"{power_of_two(MAX_SPEC_WEIGHTS)} ({_fp32(MAX_SPEC_WEIGHTS)}): the cost model adds up a rank's bytes "
            "in float64, exact only below 2^53"
        )))
    total_ids = math.fsum(ids)
    if total_ids > MAX_IDS_PER_SAMPLE:
        problems.append(Problem("spec", (
            f"the tables read {total_ids:.3g} ids per sample in all (pooling_factor x features), more than "
            f"{power_of_two(MAX_IDS_PER_SAMPLE)}: with up to {samples} the cost model's 64-bit byte counts of "
            "input buffers overflow"
        )))
    width = int(sum(widths))
    if width > MAX_POOLED_WIDTH:
        problems.append(Problem("spec", (
            f"one sample's embedding outputs are {format_count(width)} values wide (embedding_dim x features, "
            "x pooling_factor where pooling is NONE), "
            f"more than {power_of_two(MAX_POOLED_WIDTH)}: with up to {samples} the cost model's 64-bit byte "
            "counts of output buffers overflow"
        )))
    return problems


def _fp32(weights: int) -> str:
    return f"{format_bytes(4 * weights)} in FP32"
