"""A plan's one predicted iteration time, as every report prints it and every MLflow run logs it
(``predicted_iteration_ms``): the critical path of its cost model plus its profile's plan-level
terms (``rec.analysis.rank_times``), shown as those two parts when the profile has such terms.
Every report prints ``Prediction.text``, so one plan has one predicted number wherever it is shown.
"""

from __future__ import annotations

from dataclasses import dataclass

from rec.analysis.rank_times import plan_level_ms, widest_excess_ms
from rec.plan.types import Plan
from rec.profile.validate import profile_hash


@dataclass(frozen=True)
class Prediction:
    """What an iteration of a plan should take under the profile it was made under."""

    critical_path_ms: float  # the busiest rank's shards in the cost model: metrics.critical_path
    plan_level_ms: float  # the profile's per-iteration terms, the same on every rank (0: TorchRec's defaults)
    batch_size: int  # per rank: what it predicts for (the topology's); other batch sizes take other times
    widest_ms: float = 0.0  # what the kernel groups' widest rows add to the critical path (rec.cost.widest)

    @property
    def iteration_ms(self) -> float:
        """The prediction: ``rec.analysis.rank_times.predicted_critical_path`` to the last bit."""
        return self.critical_path_ms + self.widest_ms + self.plan_level_ms

    def text(self) -> str:
        """``23.2260 ms per iteration = critical path 13.7530 ms + the profile's plan-level terms
        9.4730 ms``; the parts only where the profile adds something."""
        total = f"{ms(self.iteration_ms)} per iteration"
        if not (self.plan_level_ms or self.widest_ms):
            return total
        widest = f" + the kernel groups' widest rows {ms(self.widest_ms)}" if self.widest_ms else ""
        return (f"{total} = critical path {ms(self.critical_path_ms)}{widest} + the profile's plan-level terms "
                f"{ms(self.plan_level_ms)}")


def prediction(plan: Plan) -> Prediction:
    """The prediction of ``plan`` under its own profile."""
    return Prediction(plan.metrics.critical_path, plan_level_ms(plan), plan.topology.batch_size,
                      widest_excess_ms(plan))


def cost_model_label(plan: Plan) -> str:
    """What a plan's critical path is counted in: TorchRec's cost model with its default constants,
    or with the profile the plan was made under (whose bandwidths replace the topology's)."""
    profile = plan.planner.profile
    if profile.is_default:
        return "TorchRec cost model"
    return f"TorchRec's cost model under profile {profile.name or profile_hash(profile)}"


# Beside a measured time under TorchRec's defaults: why it is far from the prediction, and the fix.
UNCALIBRATED_NOTE = ("the prediction uses TorchRec's default constants, not this machine's: measure them with "
                     "`shardflow calibrate --topology TOPO --out profile.yaml`, then plan with --profile profile.yaml")


def ms(value: float) -> str:
    """A time as reports print predicted and measured iteration times: ``23.2260 ms``."""
    return f"{value:.4f} ms"


def ratio_text(measured_ms: float, predicted_ms: float) -> str:
    """``1.316x predicted``: measured over predicted, as reports print it (MLflow: ``measured_over_predicted``)."""
    return f"{measured_ms / predicted_ms:.3f}x predicted" if predicted_ms > 0 else "nothing predicted"
