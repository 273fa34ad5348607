"""A HiGHS worker: ``python -m rec.highs.worker PARENT_PID``, started by ``rec.highs.process``.

It reads a model per frame on stdin (``rec.highs.wire``: the options, the ``MODEL_ARRAYS``, a start),
runs HiGHS on it and answers with one frame on stdout, until stdin ends. It ends with the process
that started it (Linux: ``PR_SET_PDEATHSIG``; elsewhere a thread that watches its parent), so a run
that loops never outlives the planning. Ctrl-C is the parent's to handle: the worker ignores SIGINT.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from typing import Any

PR_SET_PDEATHSIG = 1  # linux/prctl.h


def main(argv: list[str]) -> int:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _end_with(int(argv[0]))
    # The frames keep the pipe of stdout to themselves: whatever else would print goes to stderr.
    reply_fd, request_fd = os.dup(1), 0
    os.dup2(2, 1)
    sys.stdout = sys.stderr

    from rec.highs.instance import MODEL_ARRAYS, run_model
    from rec.highs.wire import frame, read_frame, write_frame

    write_frame(reply_fd, frame({"ready": True}, {}))
    while (request := read_frame(request_fd)) is not None:
        header, arrays = request
        try:
            options = tuple((str(name), value) for name, value in header["options"])
            run = run_model({name: arrays[name] for name in MODEL_ARRAYS}, options, arrays.get("initial"))
        except Exception as e:  # answered, not raised: the caller names it
            write_frame(reply_fd, frame({"error": f"{type(e).__name__}: {e}"}, {}))
            continue
        assert run is not None  # waited for until it returned
        reply: dict[str, Any] = {
            "status": [run.status.text, run.status.optimal, run.status.timed_out, run.status.has_solution],
            "objective": run.objective, "dual_bound": run.dual_bound, "nodes": run.nodes,
            "iterations": run.iterations, "seconds": run.seconds}
        write_frame(reply_fd, frame(reply, {} if run.values is None else {"values": run.values}))
    return 0


def _end_with(parent: int) -> None:
    """End this process when ``parent`` ends (or has already)."""
    if sys.platform.startswith("linux"):
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
    else:
        def watch() -> None:
            while os.getppid() == parent:
                time.sleep(0.5)
            os._exit(0)

        threading.Thread(target=watch, name="watch-parent", daemon=True).start()
    if os.getppid() != parent:  # it ended before the signal was asked for
        os._exit(0)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
