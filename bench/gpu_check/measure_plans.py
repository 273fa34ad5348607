"""Measure plans in one launch of the measuring job, in the order given (a plan may come several times):
``shardflow measure``'s job and launcher (``tasks.measure.run_measuring_job``), in a process of its own
so that the GPU check can stop it at its budget (SIGTERM stops torchrun and every rank).

    python -m bench.gpu_check.measure_plans --out DIR --topology-of P1 --iterations 24 --warmup 4 -- P1 P2 P1 ...
"""

from __future__ import annotations

import argparse
import sys

from rec.exit_codes import ExitCode
from rec.settings import add_flags, from_flags
from rec.train.measure_config import MeasureConfig


def main(argv: list[str] | None = None) -> int:
    from rec.errors import InputError
    from rec.plan import read_plan
    from tasks.measure import MeasureFailed, Ranks, run_measuring_job

    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", required=True)
    parser.add_argument("plans", nargs="+")
    add_flags(parser, MeasureConfig)
    args = parser.parse_args(argv)
    try:
        topology = read_plan(args.plans[0]).topology
        run_measuring_job(args.plans, topology, args.out, from_flags(MeasureConfig, args), Ranks(), "gpu-check")
    except InputError as e:
        print(e.render(), file=sys.stderr)
        return ExitCode.BAD_INPUT
    except MeasureFailed as e:
        print(f"the measuring job failed: {e}", file=sys.stderr)
        return ExitCode.FAILED
    return ExitCode.OK


if __name__ == "__main__":
    sys.exit(main())
