"""Paths the tests share: the repository, its examples, and the commands the install put beside
this Python (``from tests.paths import ROOT, DEMO, CPU_2PROC``; pytest runs from the repository root)."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
EXAMPLES = ROOT / "examples"
SPECS = EXAMPLES / "specs"
TOPOLOGIES = EXAMPLES / "topologies"
PROFILES = EXAMPLES / "profiles"

DEMO = SPECS / "cpu_demo.yaml"  # 8 tables, the demo `make run` plans and trains
TWO_TOWER_SEQ = SPECS / "two_tower_seq.yaml"  # several modules, an EmbeddingCollection among them
CPU_2PROC = TOPOLOGIES / "cpu_2proc.yaml"  # 2 CPU processes: what tests train on
H100 = TOPOLOGIES / "h100_1x8.yaml"
H100_2X8 = TOPOLOGIES / "h100_2x8.yaml"

BIN = Path(sys.executable).parent
SHARDFLOW = BIN / "shardflow"
TORCHRUN = BIN / "torchrun"
