"""One planning request: the budget and every setting a plan depends on, checked once.

Why one object: `optimize`, `plan_only`, `apply_checkpointing`, `remat_backend`, rank planning
and the CLI all plan the same way, and each used to repeat the same dozen keywords (and re-parse
the budget). Each now takes ``**settings`` and builds a `PlanRequest` with `PlanRequest.of`,
which parses the budget into a `Budget`, and refuses a setting the entry point does not honour,
naming the ones it does (an unknown keyword is a typo or a setting of another runtime, never
something to ignore silently). The request travels down to the frontends and the planner as it
is. Torch-free: the capture settings are plain strings that the frontends check where they are
used.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from dataclasses import dataclass

from solvers import SOLVERS
from solvers.base import SolverOptions
from solvers.ir.allocator import AllocatorModel
from solvers.ir.budget import Budget, BudgetError, parse_bytes
from solvers.ir.link import Link, offload_link_of

MILP_ENGINES = ("auto", "cbc", "highs")


class SettingsError(TypeError):
    """A setting the entry point does not take, or one of the wrong type; the message lists the
    settings it takes."""


@dataclass(frozen=True)
class PlanRequest:
    """What to plan for. Every field but ``budget`` has the default the API documents."""

    budget: Budget
    """Peak bytes of one training step, or a percentage of plain autograd's peak (`Budget`)."""
    solver: str = "auto"
    """One of `solvers.SOLVERS` (the graph runtime), or ``auto`` (the eager runtime's own planner)."""
    time_limit: float = 60.0
    """Seconds the solver may take (the best plan found by then is used)."""
    threads: int = 1
    verbose: bool = False
    milp_engine: str = "auto"
    """``cbc``, ``highs`` or ``auto`` (see `solvers.checkmate.milp_engines`)."""
    cost_model: str = "auto"
    """``auto`` (time on the model's GPU, ``flops`` elsewhere), ``device``, ``flops``, ``flop-count``,
    ``roofline:<device>`` or ``profile`` (see `frontends.measure.costs`)."""
    allocator: AllocatorModel | None = None
    """A CUDA caching allocator's rounding and margins, added to every peak."""
    grad_outputs: str = "losses"
    """``losses``: backward from the scalar loss only; ``all``: from every output."""
    python_side_effects: str = "error"
    """``error``: refuse a forward the graph cannot replay; ``ignore``: plan it as captured."""
    outputs: str = "all"
    """``all``: return every output; ``loss``: the scalar losses only (the rest is dropped)."""
    split: int | str | None = None
    """The LM head and its loss in k row chunks, ``"auto"`` to choose k; None (with ``split_mlp``
    None): whole, split as under ``"auto"`` only where no whole-tensor plan fits; 1: never split."""
    split_mlp: int | str | None = None
    """Every MLP in m row chunks, ``"auto"``, or None (whole; searched too under ``split="auto"``,
    and where no whole-tensor plan fits when ``split`` is None too); 1: never split."""
    optimizer: object = None
    """The training loop's optimizer: a ``torch.optim.Optimizer``, a description (``"adamw"``,
    ``"adamw-8bit"``, ``"sgd-momentum"``, ...: `frontends.measure.optimizer_memory`), or None (its
    state is not counted, and the plan says so). With one, the budget is the whole iteration's."""
    grad_accumulation: int = 1
    """Micro-batches per optimizer step: above 1, the gradients are held through forward and backward."""
    offload: bool | str = False
    """``"auto"``: each saved value may also be copied to host memory after forward and back before
    backward, where that makes the step faster within the budget (`solvers.offload`); False: keep or
    recompute only."""
    link: Link | str | None = None
    """The device-host link offloads are priced on: a `solvers.ir.link.Link` or a preset name
    (``pcie4``, ``pcie5``, ``nvlink-c2c``); None: ``pcie5``. Only with ``offload="auto"``.
    `optimize` and `plan_only` also take ``"measured"``: the model's device's link, timed there
    (`frontends.measure.link_bandwidth`)."""
    host_budget: int | str | None = None
    """Pinned host memory offloaded values may hold at once (bytes or a size like ``64GB``); None: no limit."""

    def __post_init__(self) -> None:
        if not isinstance(self.budget, Budget):
            raise SettingsError("PlanRequest.budget is a Budget: build the request with PlanRequest.of(budget, ...)")
        if self.solver not in SOLVERS:
            raise ValueError(f"unknown solver {self.solver!r}: choose one of {', '.join(SOLVERS)}")
        if isinstance(self.time_limit, bool) or not isinstance(self.time_limit, (int, float)) or self.time_limit <= 0:
            raise ValueError(f"time_limit must be a positive number of seconds, got {self.time_limit!r}")
        if isinstance(self.threads, bool) or not isinstance(self.threads, int) or self.threads < 1:
            raise ValueError(f"threads must be a positive integer, got {self.threads!r}")
        if self.milp_engine not in MILP_ENGINES:
            raise ValueError(f"unknown milp_engine {self.milp_engine!r}: choose one of {', '.join(MILP_ENGINES)}")
        k = self.grad_accumulation
        if isinstance(k, bool) or not isinstance(k, int) or k < 1:
            raise ValueError(f"grad_accumulation is a positive number of micro-batches per optimizer step, got {k!r}")
        offload_link_of(self.offload, self.link)  # a bad offload or link fails here, naming the choices
        if self.host_budget is not None:
            if self.offload is False:
                raise ValueError("host_budget= limits offloaded values: pass offload='auto' with it")
            try:
                parse_bytes(self.host_budget)
            except BudgetError as err:
                raise ValueError(f"host_budget: {err}") from None
        if self.allocator is not None and not isinstance(self.allocator, AllocatorModel):
            raise SettingsError(f"allocator must be an AllocatorModel or None, got {type(self.allocator).__name__}")

    @classmethod
    def of(cls, budget: PlanRequest | Budget | str | int, caller: str, accepted: Iterable[str] | None = None,
           **settings: object) -> PlanRequest:
        """The request for ``budget`` with ``settings``, or ``budget`` itself when it is a whole
        request (the CLI builds one and hands it on). ``caller`` (the entry point's name) and
        ``accepted`` (the settings it honours; None: all) word the refusal of any other."""
        allowed = SETTINGS if accepted is None else tuple(accepted)
        if isinstance(budget, PlanRequest):
            if settings:
                raise SettingsError(f"{caller}() got a PlanRequest and settings {', '.join(map(repr, settings))}: "
                                    "put them in the request (request.replace(...))")
            settings = {name: getattr(budget, name) for name in SETTINGS
                        if getattr(budget, name) != _DEFAULTS[name]}
        unknown = [name for name in settings if name not in allowed]
        if unknown:
            raise SettingsError(f"{caller}() got {'an unknown setting' if len(unknown) == 1 else 'unknown settings'} "
                                f"{', '.join(map(repr, unknown))}: it takes {', '.join(allowed)}")
        if isinstance(budget, PlanRequest):
            return budget
        return cls(budget=Budget.of(budget), **settings)

    @property
    def solver_options(self) -> SolverOptions:
        return SolverOptions(time_limit_s=float(self.time_limit), threads=self.threads, verbose=self.verbose,
                             milp_engine=self.milp_engine)

    @property
    def offload_settings(self) -> dict[str, object]:
        """`solvers.planning.planner.plan_graph`'s offload keywords for this request."""
        host = None if self.host_budget is None else parse_bytes(self.host_budget)
        return {"offload": self.offload, "link": self.link, "host_budget": host}

    def replace(self, **changes: object) -> PlanRequest:
        """This request with ``changes`` (a budget as any `Budget.of` reads)."""
        if "budget" in changes:
            changes["budget"] = Budget.of(changes["budget"])
        return dataclasses.replace(self, **changes)


SETTINGS: tuple[str, ...] = tuple(f.name for f in dataclasses.fields(PlanRequest) if f.name != "budget")
"""Every setting ``**settings`` may name, in the order the API documents them."""
_DEFAULTS = {f.name: f.default for f in dataclasses.fields(PlanRequest) if f.name != "budget"}
