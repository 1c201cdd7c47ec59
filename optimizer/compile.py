"""``torch.compile(model, backend=remat_backend(budget="60%"))``, and where dynamo breaks a step.

The backend itself (the compile hook, planning each joint graph, the Inductor fit, the splits) is
`frontends.compile`; this is the entry point that checks the settings once and makes it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from frontends.compile.backend_settings import COMPILE_SETTINGS, CompileSettings
from frontends.compile.compile_backend import RematBackend
from frontends.torch_compat import dynamo_explain
from solvers.ir.budget import Budget
from solvers.planning.request import PlanRequest


def remat_backend(budget: PlanRequest | Budget | int | str, *, compiler: str = "auto", fullgraph: bool = False,
                  fit: str | None = None, fit_iterations: int = 4, fit_tolerance: float = 0.02,
                  **settings: Any) -> RematBackend:
    """A backend for ``torch.compile(model, backend=remat_backend(budget="60%"))``.

    ``budget``: bytes of the whole training step as in `optimizer.optimize` (parameters,
    gradients, inputs, activations), or a percentage, which applies to each graph's own
    plain-autograd peak. ``settings``: `COMPILE_SETTINGS` (``solver``, ``time_limit``,
    ``threads``, ``verbose``, ``milp_engine``, ``cost_model``, ``allocator``, ``split``,
    ``split_mlp``, ``optimizer``, ``grad_accumulation``, ``offload``, ``link``, ``host_budget``), as
    `optimize` takes them. ``optimizer``
    (an instance, or a description such as ``"adamw"``, counted over the parameters the graphs
    read) and ``grad_accumulation=k`` put the optimizer's state, its step and gradients kept
    across micro-batches in each graph's budget (``backend.plans[i].plan.breakdown``); not with
    ``fit="inductor"``. ``compiler``: ``inductor`` (the default when a C++
    compiler is present), ``eager`` (fx code; what `backend.meter` measures) or ``auto``.
    ``fullgraph``: refuse graph breaks (the exact mode). ``fit="inductor"``: re-plan each graph
    (at most ``fit_iterations`` plans, each probed by a trial Inductor compile that stops at the
    buffer plan) until its compiled peak is within ``fit_tolerance`` under its budget, keeping
    the cheapest plan that fits (`frontends.compile.inductor_fit`). ``backend.plans`` lists the
    plans made; ``backend.summary()`` says how the budget was split across graph breaks, the
    compiled peak, the budget left unused, the recomputation bought and the fit iterations.
    ``split=k`` / ``split_mlp=m``: run each graph's LM head + loss / MLPs in k / m chunks of
    token rows, split on the graph dynamo hands over before AOTAutograd traces it
    (`frontends.compile.compile_split`; ``backend.plans[i].splits`` says what was split); a chain
    the split refuses, or a graph with no such chain before any graph was split that way, raises
    `frontends.split.row_split.RowSplitError`. ``split="auto"`` (``split_mlp="auto"``): each
    graph plans k = 1, 2, 4, 8 (then m = 2, 4, 8) and is split the way whose plan is cheapest and
    fits, as ``optimize(split="auto")`` chooses; a graph with no chain is compiled unsplit, and
    the plan's message names the choice. With ``split`` and ``split_mlp`` left at None, a graph
    for which no whole-tensor plan fits is split as ``optimize`` splits it (finest split, then
    ``"auto"``), and its plan's message says so; ``split=1`` never splits.
    ``offload="auto"`` (with ``link`` and ``host_budget`` as in `optimize`): each graph's plan may
    copy saved values to host after forward and back before backward reads them; the copies run
    in the fx graphs, so ``compiler="auto"`` then means ``eager`` and ``compiler="inductor"`` is
    refused (Inductor compiles torch ops only; torch's own offload pass uses custom ops that need
    an accelerator stream). ``backend.meter`` counts host copies apart (``host_peak_bytes``).
    """
    request = PlanRequest.of(budget, "remat_backend", COMPILE_SETTINGS, **settings)
    return RematBackend(CompileSettings.of(request, compiler=compiler, fullgraph=fullgraph, fit=fit,
                                           fit_iterations=fit_iterations, fit_tolerance=fit_tolerance))


@dataclass(frozen=True)
class GraphBreakReport:
    """Where dynamo splits a step, found by dynamo's own ``explain`` (nothing is planned)."""

    graphs: int
    graph_breaks: int
    reasons: tuple[str, ...]
    """Each break's reason and the user line that caused it."""


def find_graph_breaks(model: torch.nn.Module, *args: Any, **kwargs: Any) -> GraphBreakReport:
    """Run ``torch._dynamo.explain`` on ``model(*args, **kwargs)`` and summarise the breaks."""
    explained = dynamo_explain()(model)(*args, **kwargs)
    reasons = []
    for reason in explained.break_reasons:
        frames = [f for f in reason.user_stack or [] if "site-packages" not in f.filename]
        where = f" at {frames[-1].filename}:{frames[-1].lineno}" if frames else ""
        reasons.append(f"{str(reason.reason).strip().splitlines()[0]}{where}")
    return GraphBreakReport(graphs=explained.graph_count, graph_breaks=explained.graph_break_count,
                            reasons=tuple(reasons))
