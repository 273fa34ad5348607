"""What the GPU check runs on and with: the ranks it found, the versions of the stack, and the
``shardflow`` command line run as ``python -m flows.cli`` from this checkout (nothing installed)."""

from __future__ import annotations

import os
import platform
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.gpu_check.workloads import GIB, Ranks
from rec.sharding import ComputeDevice

ROOT = Path(__file__).resolve().parents[2]
CPU_RANKS = 2
CPU_HBM = 4 * GIB  # recorded only: TorchRec keeps cpu ranks' tables in DDR
CPU_DDR = 16 * GIB


def pick_device(choice: str) -> ComputeDevice:
    """``--device``: cuda or cpu as given; auto: cuda if torch sees a GPU (else cpu, said in one line:
    a check that passes on cpu says nothing of the cuda path)."""
    if choice != "auto":
        return ComputeDevice(choice)
    import torch

    if torch.cuda.is_available():
        return ComputeDevice.CUDA
    built = f"CUDA {torch.version.cuda}" if torch.version.cuda else "no CUDA"
    print(f"gpu_check: torch {torch.__version__} ({built}) sees no GPU: the cuda path is not checked; the same "
          "sections run on 2 cpu ranks instead (--device cuda: fail without a GPU)", flush=True)
    return ComputeDevice.CPU


def find_ranks(device: ComputeDevice) -> Ranks:
    """Every visible GPU a rank (cuda), or 2 gloo ranks (cpu). ValueError when cuda has no GPU."""
    if device is ComputeDevice.CPU:  # a small machine's ranks plan no more than it holds (a 24-GiB CI box)
        return Ranks(device, CPU_RANKS, CPU_HBM, min(CPU_DDR, _host_memory() // CPU_RANKS))
    import torch

    count = torch.cuda.device_count()
    if count == 0:
        raise ValueError("no GPU is visible to torch (torch.cuda.device_count() is 0); "
                         "--device cpu checks the same sections on 2 gloo ranks")
    hbm = min(torch.cuda.get_device_properties(i).total_memory for i in range(count))
    return Ranks(device, count, hbm, _host_memory() // count)


# The share of the host's memory the ranks' plans may put there (fused_uvm tables, caches' backing
# rows): the rest is the processes' own (torch, CUDA's context, the synthetic batches) and the system's.
# A plan that filled it all had the measuring rank killed for memory, and with it every plan of the launch.
HOST_SHARE = 0.75
CGROUP_LIMITS = ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes")


def _host_memory() -> int:
    """``HOST_SHARE`` of the memory this process may use: the machine's, or its container's limit
    (cgroup v2 or v1) where lower."""
    try:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):
        total = 64 * GIB
    for path in CGROUP_LIMITS:
        try:
            limit = Path(path).read_text(encoding="ascii").strip()
        except OSError:
            continue
        if limit.isdigit():  # "max" (v2) or a huge number (v1): no limit below the machine's
            total = min(total, int(limit))
    return int(HOST_SHARE * total)


def versions(device: ComputeDevice) -> dict[str, Any]:
    """Python, torch, torchrec, fbgemm-gpu, CUDA, NCCL and the GPU model, as this process sees them."""
    import torch

    out: dict[str, Any] = {"python": platform.python_version(), "torch": str(torch.__version__),
                           "cuda": torch.version.cuda, "platform": platform.platform()}
    for name in ("torchrec", "fbgemm_gpu"):
        try:
            module = __import__(name)
            out[name] = str(getattr(module, "__version__", "unknown"))
        except Exception as e:  # a broken install is what the check reports
            out[name] = f"not importable: {type(e).__name__}: {e}"[:200]
    if device is ComputeDevice.CUDA and torch.cuda.is_available():
        out["gpu"] = torch.cuda.get_device_name(0)
        out["gpu_count"] = torch.cuda.device_count()
        out["capability"] = ".".join(map(str, torch.cuda.get_device_capability(0)))
        out["nccl"] = ".".join(map(str, torch.cuda.nccl.version()))
        out["driver"] = _driver()
    out["shardflow_commit"] = _commit()
    return out


def _driver() -> str | None:
    try:
        r = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                           capture_output=True, text=True, timeout=20)
        return r.stdout.strip().splitlines()[0] if r.returncode == 0 and r.stdout.strip() else None
    except (OSError, subprocess.SubprocessError):
        return None


def _commit() -> str | None:
    try:
        r = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True,
                           text=True, timeout=10)
        return r.stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


@dataclass(frozen=True)
class Finished:
    code: int
    seconds: float
    output: str  # the end of stdout and stderr together

    @property
    def cause(self) -> str:
        """The last lines that say what went wrong, for a report's ``reason``."""
        lines = [line for line in self.output.strip().splitlines() if line.strip()]
        return " | ".join(lines[-3:])[-600:] or f"exit {self.code}"


class TimedOut(Exception):
    pass


def shardflow(args: list[str], cwd: Path, timeout_s: float, log: Path, module: str = "flows.cli") -> Finished:
    """``python -m flows.cli ARGS`` (or another ``module`` of this checkout) in ``cwd``, its output appended
    to ``log``; TimedOut past ``timeout_s``."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
           "PYTHONUNBUFFERED": "1"}
    started = time.monotonic()
    with log.open("a") as sink:
        sink.write(f"\n$ python -m {module} {' '.join(args)}\n")
        sink.flush()
        proc = subprocess.Popen([sys.executable, "-m", module, *args], cwd=cwd, env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True, errors="replace", start_new_session=True)
        try:
            output, _ = proc.communicate(timeout=max(1.0, timeout_s))
        except subprocess.TimeoutExpired:
            _stop(proc)
            what = f"shardflow {args[0]}" if module == "flows.cli" else module
            raise TimedOut(f"{what} ran past its {timeout_s:.0f}-s share of the budget") from None
        except BaseException:  # Ctrl-C or SIGTERM of the check: its own session would outlive it
            _stop(proc)
            raise
        sink.write(output)
    return Finished(proc.returncode, time.monotonic() - started, output[-8000:])


def _stop(proc: subprocess.Popen[str]) -> None:
    """SIGTERM, as a user's Ctrl-C would (shardflow stops torchrun and its ranks), then SIGKILL; a
    second Ctrl-C or SIGTERM meanwhile waits until they are stopped."""
    import signal

    held = {sig: signal.signal(sig, signal.SIG_IGN) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        for sig, wait in ((signal.SIGTERM, 20.0), (signal.SIGKILL, 10.0)):
            try:
                os.killpg(proc.pid, sig)
            except ProcessLookupError:
                return
            try:
                proc.communicate(timeout=wait)
                return
            except subprocess.TimeoutExpired:
                continue
    finally:
        for sig, handler in held.items():
            signal.signal(sig, handler)
