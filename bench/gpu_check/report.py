"""The GPU check's report: ``gpu_check.json`` (the machine's figures) and ``gpu_check.md`` (for a person).

Format ``shardflow.gpu_check/v1``: ``versions`` (what it ran with), ``budget`` and, per section in
the order run, ``status`` (``ok``, ``failed``, ``skipped``), ``seconds``, ``reason`` (why it failed
or was skipped, the targets it missed; null when ok), ``figures`` (the section's numbers,
docs/gpu.md) and ``targets`` (each ``{name, value, bound, kind, met}``, ``bench.gpu_check.targets``);
and ``passed``: whether the check passed (every section ok, every target met).
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any

from bench.gpu_check.targets import Target
from rec.disk_full import write_whole

REPORT_FORMAT = "shardflow.gpu_check/v1"
JSON_FILE = "gpu_check.json"
MD_FILE = "gpu_check.md"


class Status(StrEnum):
    OK = "ok"
    FAILED = "failed"
    SKIPPED = "skipped"


@dataclass
class Section:
    name: str
    status: Status = Status.SKIPPED
    seconds: float = 0.0
    reason: str | None = None
    figures: dict[str, Any] = field(default_factory=dict)
    summary: str = ""  # one line for a person
    targets: list[Target] = field(default_factory=list)


@dataclass
class Report:
    device: str
    ranks: int
    minutes: float
    versions: dict[str, Any]
    sections: list[Section] = field(default_factory=list)
    started_at: str = ""
    seconds: float = 0.0

    @property
    def failed(self) -> list[Section]:
        return [s for s in self.sections if s.status is Status.FAILED]

    @property
    def passed(self) -> bool:
        """Every section ran and is ok (every target met): none failed, none skipped; a check that ran
        none (stopped before its first) has not passed."""
        return bool(self.sections) and all(s.status is Status.OK for s in self.sections)

    def to_dict(self) -> dict[str, Any]:
        return {"format": REPORT_FORMAT, "started_at": self.started_at, "seconds": round(self.seconds, 1),
                "device": self.device, "ranks": self.ranks, "budget_minutes": self.minutes,
                "versions": self.versions, "passed": self.passed,
                "sections": {s.name: {**{k: v for k, v in asdict(s).items() if k not in ("name", "summary", "targets")},
                                      "status": s.status.value, "seconds": round(s.seconds, 1),
                                      "figures": _finite(s.figures),
                                      "targets": [_finite(t.to_dict()) for t in s.targets]}
                             for s in self.sections}}


def _finite(value: Any) -> Any:
    """JSON has no NaN or infinity: such a figure (or a bound that is none, cpu's infinite ones) is
    written as null."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


def write_report(out_dir: Path, report: Report) -> tuple[Path, Path]:
    """Both files, each replaced whole."""
    data = report.to_dict()
    json_path, md_path = out_dir / JSON_FILE, out_dir / MD_FILE
    write_whole(json_path, json.dumps(data, indent=1, allow_nan=False) + "\n")
    write_whole(md_path, render_markdown(report))
    return json_path, md_path


def render_markdown(report: Report) -> str:
    v = report.versions
    lines = [f"# shardflow GPU check: {v.get('gpu') or report.device} x {report.ranks}", "",
             f"{report.started_at}, {report.seconds:.0f} s of a {report.minutes:g}-minute budget; "
             f"torch {v.get('torch')}, torchrec {v.get('torchrec')}, fbgemm-gpu {v.get('fbgemm_gpu')}, "
             f"CUDA {v.get('cuda')}, Python {v.get('python')}.", "",
             "| section | status | seconds | result |", "|---|---|---:|---|"]
    for s in report.sections:
        result = s.summary if s.status is Status.OK else (s.reason or "")
        lines.append(f"| {s.name} | {s.status.value} | {s.seconds:.0f} | {_cell(result)} |")
    not_ok = [f"{s.name} {s.status.value}" for s in report.sections if s.status is not Status.OK]
    lines += ["", "**Passed**: every section ok, every target met." if report.passed
              else f"**Not passed**: {', '.join(not_ok)}.", "",
              "| section | target | value | bound | met |", "|---|---|---:|---:|---|"]
    for s in report.sections:
        for t in s.targets:
            shown = "-" if t.to_dict()["value"] is None else f"{t.value:.4g}"
            sign = "<=" if t.kind.value == "at_most" else ">="
            lines.append(f"| {s.name} | {t.name} | {shown} | {sign} {t.bound:g} | {'yes' if t.met else '**no**'} |")
    for s in report.sections:
        if s.figures:
            lines += ["", f"## {s.name}", "", "```json", json.dumps(_finite(s.figures), indent=1)[:20_000], "```"]
    return "\n".join(lines) + "\n"


def _cell(text: str) -> str:
    """``text`` in a Markdown table's cell: its own ``|`` (a median |error|, a workload's name) escaped."""
    return text.replace("|", "\\|")
