"""The measuring job's settings (``shardflow measure``, ``shardflow calibrate``): one frozen dataclass.

The CLI flags and the job's own command line (``python -m rec.train.measure_job``) both come from
``MeasureConfig`` (``rec.settings``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from rec.settings import MAX_TIME_LIMIT_S, knob

MAX_MEASURE_ITERATIONS = 100_000  # per plan; a measurement, not a training


@dataclass(frozen=True)
class MeasureConfig:
    iterations: int = field(default=30, metadata=knob(
        "timed iterations per plan, after the warm-up", minimum=1, maximum=MAX_MEASURE_ITERATIONS))
    warmup: int = field(default=5, metadata=knob(
        "untimed iterations before them", minimum=0, maximum=MAX_MEASURE_ITERATIONS))
    seed: int = field(default=0, metadata=knob("random seed of the synthetic ids"))
    synthetic_batches: int = field(default=4, metadata=knob(
        "distinct synthetic batches, cycled", minimum=1, maximum=1 << 10))
    embedding_lr: float = field(default=0.05, metadata=knob(
        "learning rate of the fused row-wise Adagrad the backward applies", minimum=0.0))
    time_limit_s: float = field(default=600.0, metadata=knob(
        "seconds one plan may take: its timed iterations stop there (at least one is kept); a plan whose "
        "warm-up and first iteration take longer is reported as timed out", flag="time-limit",
        minimum=0.0, maximum=MAX_TIME_LIMIT_S, metavar="SECONDS"))
