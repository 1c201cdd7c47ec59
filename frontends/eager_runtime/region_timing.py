"""What rerunning a module costs in eager PyTorch, measured: the price of a checkpoint's recomputation.

Why: the captured graph's op costs are each op timed alone. A checkpointed module's recomputation
runs more than its ops: the module's Python, autograd recording the rerun's graph, fresh
allocations, and checkpoint's own hooks. On one CPU thread a transformers Llama decoder layer's
eager forward took 1.15x its ops' calibrated times, an RMSNorm 1.8x, and each ``checkpoint`` call
about 130 us besides (2026-12-07). Priced by its ops alone, the eager planner preferred mixes of
small regions that measured slower than the whole blocks it was predicted to beat.
"""

from __future__ import annotations

import statistics
import time

import torch

from frontends.eager_runtime.eager_ops import forwards_left_as_found

TIMING_BUDGET_S = 10.0
"""Seconds the timed forwards may take after the warm-up: a model whose forward takes longer than
``TIMING_BUDGET_S / repeats`` (a large one on a CPU) is timed fewer times, once at least."""


def time_module_forwards(model: torch.nn.Module, args: tuple, kwargs: dict | None = None,
                         repeats: int = 5) -> dict[str, float]:
    """Module path -> seconds its forward takes in a training forward (grad on), the median of
    ``repeats`` forwards after one warm-up (fewer where they would take over `TIMING_BUDGET_S`);
    modules called more than once per forward are left out. On CUDA the time is between events
    recorded when the module starts and returns (kernels and the host's gaps between them).

    The forwards run under `forwards_left_as_found`: autograd's saved tensors are dropped as they
    are made (the model may not fit a plain training step), and the model is left as found."""
    paths = {id(m): p for p, m in model.named_modules() if p}
    device = next((t.device for t in [*model.parameters(), *model.buffers()]), torch.device("cpu"))
    cuda = device.type == "cuda"
    marks: dict[str, list] = {}
    calls: dict[str, int] = {}

    def mark() -> object:
        if cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            return event
        return time.perf_counter()

    def pre(module, _args):
        path = paths.get(id(module))
        if path is not None:
            calls[path] = calls.get(path, 0) + 1
            marks.setdefault(path, []).append(mark())

    def post(module, _args, _out):
        path = paths.get(id(module))
        if path is not None:
            marks[path].append(mark())

    samples: dict[str, list[float]] = {}
    handles = [torch.nn.modules.module.register_module_forward_pre_hook(pre),
               torch.nn.modules.module.register_module_forward_hook(post)]
    try:
        with forwards_left_as_found(model, args, kwargs):
            run = 0
            while run <= repeats:
                marks.clear()
                calls.clear()
                start = time.perf_counter()
                out = model(*args, **(kwargs or {}))
                del out
                if cuda:
                    torch.cuda.synchronize(device)
                run += 1
                if run == 1:  # the warm-up (lazy initialisation, allocator growth) sets how many fit
                    forward_s = time.perf_counter() - start
                    repeats = max(1, min(repeats, int(TIMING_BUDGET_S / max(forward_s, 1e-9))))
                    continue
                for path, times in marks.items():
                    if calls[path] == 1 and len(times) == 2:
                        seconds = times[0].elapsed_time(times[1]) / 1e3 if cuda else times[1] - times[0]
                        samples.setdefault(path, []).append(seconds)
    finally:
        for h in handles:
            h.remove()
    return {path: statistics.median(s) for path, s in samples.items() if len(s) == repeats}
