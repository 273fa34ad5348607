"""Adagrad computed in float32 for parameters of any floating type.

The dense optimizer trains, beside the dense layers, the data_parallel tables (TorchRec's DENSE
kernel gives them no fused optimizer), which train as float16 where the spec's type is not FP32
(``rec.spec.torchrec_modules.trained_data_type``). ``torch.optim.Adagrad`` keeps its sum in the
parameter's type: a float16 table's untouched rows have gradient 0 and sum 0, and its eps (1e-10)
rounds to 0 in float16, so their step is 0/0 and the model turns NaN within a few iterations.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import torch


class Float32Adagrad(torch.optim.Optimizer):
    """``torch.optim.Adagrad(params, lr, eps)`` (no decay, sum from 0) with its sum in float32 and each
    step computed in float32, rounded to the parameter's type once; the same state names
    (``step``, ``sum``), so checkpoints read as torch's."""

    def __init__(self, params: Iterable[torch.Tensor], lr: float = 1e-2, eps: float = 1e-10):
        super().__init__(params, {"lr": lr, "eps": eps})

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None) -> Any:
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if not state:
                    state["step"] = torch.tensor(0.0)
                    state["sum"] = torch.zeros_like(p, dtype=torch.float32, memory_format=torch.preserve_format)
                grad = p.grad.to(torch.float32)
                state["step"] += 1
                state["sum"].addcmul_(grad, grad, value=1)
                stepped = p.to(torch.float32).addcdiv(grad, state["sum"].sqrt().add_(group["eps"]), value=-group["lr"])
                p.copy_(stepped)
        return loss
