"""Everything shardflow reads or writes of TorchRec beyond its public API, in one place.

Each function names the private attribute it uses; ``tests/rec/test_torchrec_internals.py`` checks
every one on the installed TorchRec (1.8.0 in CI) with real objects, and the GPU check ran them on
1.6.1 (docs/gpu.md, "Supported stacks"). A TorchRec release that renames one breaks that test, not a
user's training. Nothing here imports torch or torchrec: callers hand in TorchRec's objects.
"""

from __future__ import annotations

from typing import Any

CHECKED_ON = ("1.6.1", "1.8.0")  # the TorchRec versions these attributes were read on

OPTIMIZER_CLASSES = "_optimizer_classes"  # apply_optimizer_in_backward's mark on a parameter
OPTIMIZER_KWARGS = "_optimizer_kwargs"  # and the keyword arguments of each of its classes


def optimizer_classes(parameter: Any) -> list[Any]:
    """The optimizer classes ``apply_optimizer_in_backward`` marked ``parameter`` with ([] if none)."""
    return list(getattr(parameter, OPTIMIZER_CLASSES, None) or [])


def optimizer_kwargs(parameter: Any) -> list[dict[str, Any]]:
    """The keyword arguments ``apply_optimizer_in_backward`` gave each of ``parameter``'s optimizer
    classes, in their order ([] if none)."""
    return [dict(k) for k in getattr(parameter, OPTIMIZER_KWARGS, None) or []]


IN_BACKWARD_OPTIMIZERS = "_in_backward_optimizers"  # the optimizers apply_optimizer_in_backward made


def drop_in_backward_optimizers(parameter: Any, in_backward: Any) -> None:
    """Undo ``apply_optimizer_in_backward`` on ``parameter``: its hooks removed (from the map of them
    that DDP reads too, in ``in_backward``: the module ``torch.distributed.optim.apply_optimizer_in_backward``)
    and its marks deleted, so that no optimizer steps it in backward."""
    for handle in in_backward.param_to_optim_hook_handle_map.pop(parameter, []):
        handle.remove()
    for mark in (IN_BACKWARD_OPTIMIZERS, OPTIMIZER_CLASSES, OPTIMIZER_KWARGS):
        if hasattr(parameter, mark):
            delattr(parameter, mark)


def mark_optimizer(parameter: Any, optimizer_class: type[Any]) -> None:
    """Mark ``parameter`` as ``apply_optimizer_in_backward`` does, without hooking an optimizer: what
    TorchRec's planner reads to size the optimizer's state."""
    setattr(parameter, OPTIMIZER_CLASSES, [optimizer_class])


def module_shardings(module: Any) -> list[tuple[str, Any]]:
    """(sharding type, its ``EmbeddingSharding``) of a ``ShardedEmbeddingBagCollection`` or a
    ``ShardedEmbeddingCollection``: what DMP applied, table by table (``embedding_tables()``)."""
    by_type = getattr(module, "_sharding_type_to_sharding", None)
    if by_type is not None:  # ShardedEmbeddingCollection
        return list(by_type.items())
    return list(zip(module._sharding_types, module._embedding_shardings, strict=True))


def planner_result(planner: Any) -> tuple[list[Any], str, int, int]:
    """An ``EmbeddingShardingPlanner`` after ``plan``: (its best plan's sharding options, its proposers'
    class names joined by commas, the proposals it rated, the plans it partitioned)."""
    names = ",".join(type(p).__name__ for p in planner._proposers)
    return list(planner._best_plan), names, int(planner._num_proposals), int(planner._num_plans)


def reservation_percentage(reservation: Any) -> float:
    """The share of HBM a ``HeuristicalStorageReservation`` or ``FixedPercentageStorageReservation``
    keeps free."""
    return float(reservation._percentage)


def reservation_dense(reservation: Any) -> tuple[Any, Any]:
    """A ``HeuristicalStorageReservation``'s parameter multiplier and dense tensor estimate (None: none),
    as given."""
    return reservation._parameter_multiplier, reservation._dense_tensor_estimate


def reservation_absolute_bytes(reservation: Any) -> Any:
    """The bytes of HBM a ``FixedAbsoluteStorageReservation`` keeps free, as given."""
    return reservation._hbm_reserved_bytes
