"""What a compile backend plans with, checked once when the backend is made.

`CompileSettings` holds the planning request (`solvers.planning.request.PlanRequest`: budget,
solver, cost model, allocator, splits) and the settings only ``torch.compile`` has: the compiler
Inductor or eager fx code, ``fullgraph``, and the Inductor fit. Everything is checked in
`CompileSettings.of`, so a bad setting fails where the user wrote it, not in the middle of the
first compile.
"""

from __future__ import annotations

from dataclasses import dataclass

from frontends.compile.compile_split import backend_split_choices
from frontends.compile.inductor_fit import FITS
from frontends.measure.costs import check_cost_model_name
from frontends.measure.optimizer_memory import check_optimizer
from frontends.torch_compat import inductor_get_cpp_compiler
from solvers.planning.request import PlanRequest

COMPILERS = ("auto", "inductor", "eager")
COMPILE_SETTINGS = ("solver", "time_limit", "threads", "verbose", "milp_engine", "cost_model", "allocator",
                    "split", "split_mlp", "optimizer", "grad_accumulation", "offload", "link", "host_budget")
"""The `PlanRequest` settings the compile backend honours (capture settings are dynamo's)."""
OFFLOAD_NEEDS_EAGER = (
    "offload='auto' runs its copies as Python functions in the fx graphs (side CUDA streams and events, "
    "frontends.graph_runtime.offload_ops), which Inductor cannot compile, and Inductor's buffer plan would not "
    "count the host copies: pass compiler='eager' (or 'auto', which picks it for offload), or offload=False "
    "to compile with Inductor")
"""Why ``compiler="inductor"`` refuses offload (see `remat_backend`)."""


def inductor_available() -> bool:
    """Inductor's CPU code needs a C++ compiler; CUDA code needs Triton."""
    try:
        inductor_get_cpp_compiler()()  # Inductor, imported only on its path
        return True
    except (ImportError, RuntimeError, OSError):  # no compiler, or an Inductor that cannot load
        return False


@dataclass(frozen=True)
class CompileSettings:
    """A checked backend configuration; ``compiler`` is resolved (never ``auto``)."""

    request: PlanRequest
    compiler: str
    fullgraph: bool = False
    fit: str | None = None
    fit_iterations: int = 4
    fit_tolerance: float = 0.02
    heads: tuple[int, ...] = (1,)
    """Head chunk counts to plan (several under ``split="auto"``)."""
    mlps: tuple[int, ...] = (1,)
    """MLP chunk counts to plan (several under ``split="auto"`` / ``split_mlp="auto"``)."""

    @property
    def percent(self) -> bool:
        """The budget is a percentage: each graph's own plain-autograd peak's (not shared bytes)."""
        return self.request.budget.is_percentage

    @classmethod
    def of(cls, request: PlanRequest, *, compiler: str = "auto", fullgraph: bool = False,
           fit: str | None = None, fit_iterations: int = 4, fit_tolerance: float = 0.02) -> CompileSettings:
        """Check every setting and resolve ``compiler="auto"`` (Inductor when it can compile here)."""
        heads, mlps = backend_split_choices(request.split, request.split_mlp)
        if compiler not in COMPILERS:
            raise ValueError(f"unknown compiler {compiler!r}: choose one of {', '.join(COMPILERS)}")
        if request.cost_model.strip().lower() == "profile":
            raise ValueError("cost_model='profile' needs the real model: use 'flops' or "
                             "'roofline:<device>' with torch.compile")
        check_cost_model_name(request.cost_model)
        check_optimizer(request.optimizer)
        if request.offload is not False:
            if compiler == "inductor":
                raise ValueError(OFFLOAD_NEEDS_EAGER)
            compiler = "eager"  # "auto": the one compiler that runs the copies
        if compiler == "auto":
            compiler = "inductor" if inductor_available() else "eager"
        if fit is not None:
            if fit not in FITS:
                raise ValueError(f"unknown fit {fit!r}: choose one of {', '.join(FITS)} or None")
            if compiler != "inductor":
                raise ValueError("fit='inductor' fits the plan to Inductor's buffer plan: it needs "
                                 "compiler='inductor' (and a C++ compiler for Inductor)")
            if request.allocator is not None:
                raise ValueError("fit='inductor' counts Inductor's buffers without an allocator model: "
                                 "pass allocator=None, or fit=None to plan with the allocator")
            if request.optimizer is not None or request.grad_accumulation > 1:
                raise ValueError("fit='inductor' fits forward and backward's compiled peak only, not yet the "
                                 "optimizer's state and step: pass fit=None to plan the whole iteration")
            if fit_iterations < 1:
                raise ValueError(f"fit_iterations must be at least 1, got {fit_iterations}")
            if not 0 <= fit_tolerance < 1:
                raise ValueError(f"fit_tolerance must be in [0, 1), got {fit_tolerance}")
        return cls(request=request, compiler=compiler, fullgraph=fullgraph, fit=fit,
                   fit_iterations=fit_iterations, fit_tolerance=fit_tolerance, heads=heads, mlps=mlps)
