"""The measuring job's settings (``shardflow measure``, ``shardflow calibrate``): one frozen dataclass.

The CLI flags and the job's own command line (``python -m rec.train.measure_job``) both come from
``MeasureConfig`` (``rec.settings``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from rec.settings import MAX_TIME_LIMIT_S, knob
from rec.train.synthetic_pool import MAX_POOL, MIN_POOL, POOL_BYTES, TOUCH_FACTOR

MAX_MEASURE_ITERATIONS = 100_000  # per plan; a measurement, not a training
SETTLE_TOLERANCE = 0.02  # two warm-up blocks this close (relative): the GPU's clocks have settled
SETTLE_BLOCK_MS = 25.0  # a settling block lasts at least this long: shorter ones differ by their noise
LATER_SETTLE_S = 0.2  # the settling of every plan after a job's first (the GPU stays busy in between)
AUTO_POOL = 0  # synthetic_batches: sized for the plan's caches (rec.train.synthetic_pool)


@dataclass(frozen=True)
class MeasureConfig:
    iterations: int = field(default=24, metadata=knob(
        "timed iterations per plan, after the warm-up (at least: each block is rounded up to whole passes "
        "over the synthetic batches, unless an automatic pool is larger than a block)",
        minimum=1, maximum=MAX_MEASURE_ITERATIONS))
    warmup: int = field(default=5, metadata=knob(
        "untimed iterations before them", minimum=0, maximum=MAX_MEASURE_ITERATIONS))
    blocks: int = field(default=3, metadata=knob(
        "the timed iterations run in this many blocks, each timed as a whole (on cuda without a host sync "
        "inside it); the measured time is the median of the blocks' per-iteration times, their spread the "
        "noise", minimum=1, maximum=1000))
    settle_s: float = field(default=2.0, metadata=knob(
        "cuda: after the warm-up, at most this many seconds of further warm-up blocks until two in a row "
        f"agree within {SETTLE_TOLERANCE:.0%} (the GPU's clocks ramp up under load; a job's later plans: at "
        f"most {LATER_SETTLE_S:g} s); 0: none",
        minimum=0.0, maximum=600.0, metavar="SECONDS"))
    seed: int = field(default=0, metadata=knob("random seed of the synthetic ids"))
    synthetic_batches: int = field(default=AUTO_POOL, metadata=knob(
        "distinct synthetic batches, cycled; 0: enough that every fused_uvm_caching table's ids touch "
        f"{TOUCH_FACTOR:g}x the rows its cache holds (at least {MIN_POOL} batches, at most {MAX_POOL} and "
        f"{POOL_BYTES >> 30} GiB per rank: fewer, down to 1, for larger batches; docs/measure.md); a number "
        "given is drawn as given, beside the plan's tables (a pool the GPU cannot hold fails the plan: out of "
        "memory)",
        minimum=0, maximum=1 << 10))
    embedding_lr: float = field(default=0.05, metadata=knob(
        "learning rate of the fused row-wise Adagrad the backward applies", minimum=0.0))
    time_limit_s: float = field(default=600.0, metadata=knob(
        "seconds one plan may take: its timed blocks stop there (at least one is kept); a plan whose "
        "warm-up and first block take longer is reported as timed out", flag="time-limit",
        above=0.0, maximum=MAX_TIME_LIMIT_S, metavar="SECONDS"))
