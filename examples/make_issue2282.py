"""Write a spec shaped like TorchRec issue 2282 (many small tables) in any spec format.

    python examples/make_issue2282.py --tables 500 --out out/issue2282_500.parquet
"""

from __future__ import annotations

import argparse
import sys

from rec.errors import InputError
from rec.exit_codes import ExitCode
from rec.spec import write_spec
from rec.spec.synthetic import issue2282_spec


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tables", type=int, required=True, metavar="N", help="number of tables")
    parser.add_argument("--seed", type=int, default=0, metavar="S", help="random seed (default 0)")
    parser.add_argument("--out", required=True, metavar="PATH",
                        help="output file: .parquet .arrow .feather .csv .yaml .json")
    args = parser.parse_args(argv)
    if args.tables < 1:
        parser.error("--tables must be at least 1")
    try:
        spec = issue2282_spec(args.tables, seed=args.seed)
        path = write_spec(spec, args.out)
    except (InputError, OSError) as e:
        print(f"make_issue2282: {e}", file=sys.stderr)
        return ExitCode.BAD_INPUT
    print(f"wrote {len(spec)} tables to {path} (spec hash {spec.spec_hash})")
    return ExitCode.OK


if __name__ == "__main__":
    sys.exit(main())
