"""The Checkmate MILP (Jain et al., MLSys 2020) over the op groups of a `RematGraph`, in PuLP.

Stages are the op groups in topological order (forward groups first). Stage ``t`` computes
group ``t`` and may recompute earlier groups, each at most once and in topological order;
what it keeps for later stages is decided by ``S``. The variables, as in the paper:

- ``R[t, g]`` (binary, ``g < t``; ``R[t, t] = 1``): group ``g`` is computed in stage ``t``.
  Siblings of a multi-output op share one ``R``: the op allocates all of them at once.
- ``S[t, v]`` (binary): value ``v`` is live when stage ``t`` starts (computed in an earlier
  stage and kept). Each sibling has its own ``S``: siblings are freed apart.
- ``FREE[t, v, k]``: ``v`` is freed right after group ``k`` runs in stage ``t``; ``k`` is
  ``v``'s own group or a group that reads ``v``. ``FREE = 1`` iff ``R[t, k] = 1``, ``v`` is not
  kept into stage ``t + 1`` and no later reader of ``v`` runs in stage ``t``. Linearized with
  the paper's hazard count ``h = (1 - R[t, k]) + keep + sum_j R[t, j]``: ``1 - FREE <= h`` and
  ``h_max * (1 - FREE) >= h``, plus one ``FREE <= 1 - hazard`` per hazard (the paper's second
  constraint disaggregated: same integer points, a much tighter LP relaxation). With those,
  ``FREE`` is integral whenever ``R`` and ``S`` are, so it is a continuous variable.
- ``U[t, g]`` (continuous): live bytes while group ``g`` runs in stage ``t`` (its inputs
  still live, its outputs allocated), by the paper's recurrence ``U[t, g] = U[t, prev] -
  freed after prev + R[t, g] * bytes(g)``; ``U <= budget`` and ``U + R * temp_bytes <= budget``.

Adaptations to this project's IR and simulator (`solvers.ir.simulator` is the judge):

- **Run-once ops** (``compute_once``): only ``R[g, g] = 1`` exists, so they run exactly once,
  in forward (checked), in the original order.
- **Forward / backward boundary.** Forward groups come first, so ``R[t, g]`` with ``g <= t``
  never puts a backward op in a forward stage. ``forward_outputs`` must be live when the last
  forward stage ends (they are not freed in it); whether they stay live into backward is the
  separate decision ``S[F, v]``. Tangents are values with ``S`` only, from the first backward
  stage on: they arrive at the boundary, are freed after their last read, are never
  recomputed. The boundary has its own constraint, the moment the simulator checks:
  resident + every tangent + every value live when forward ends <= budget.
- **End of step.** ``user_outputs`` and ``backward_outputs`` are live when the last stage
  ends (a virtual stage ``T`` with ``S[T, v] = 1``). A user output computed in forward is
  returned to the caller, who holds that copy to the end of the step, so ``S[t, v] = 1`` in
  every backward stage: it is never freed at the boundary and recomputed in backward. (The
  simulator would accept that, but the memory could not actually be released; stricter
  than the simulator, so never optimistic.)
- Resident bytes (parameters, buffers, inputs) are a constant in every ``U``.
- Valid tightenings (same integer solutions, tighter LP relaxation): ``S[t, v] + R[t,
  group(v)] <= 1`` (the simulator never computes a live value, and readers in stage ``t``
  come after the recompute, so a kept copy is useless); ``S[t+1, v] + sum_k FREE[t, v, k] <=
  S[t, v] + R[t, group(v)]`` (a live copy is kept or freed once, never both: without it the
  LP frees bytes it never held).
- Groups no output (and no run-once op) depends on are never computed.

The model's memory accounting is exact for the *literal* schedule of its stages (every
computation made, each value freed right after its last read), which is what
`solvers.brute_force` searches independently. The returned schedule is built by
`Schedule.from_computes`, which also drops computations nobody reads (a stage's own group
that is neither kept nor read before being recomputed): its cost and peak can only be lower
than the model's, so ``SolveResult.objective`` (the simulated cost) is at most the model's
optimum, `MilpSolution.model_cost`.

Variables exist only where they can be nonzero: ``R[t, g]`` for needed groups, up to the last
stage that can read a value of ``g``; ``S[t, v]`` from ``v``'s birth to its last possible read;
``FREE`` where ``v`` can be live and ``k`` can run and no constant hazard blocks it. With
``T`` groups, ``V`` values and ``E`` (value, reader) pairs, at most about ``T^2/2`` R,
``V*T`` S, ``(V + E)*T`` FREE and ``T^2/2`` U variables; ``E*T`` read, ``3*V*T`` keep,
no-double and free-once, about ``4*(V + E)*T`` free and ``T^2/2`` memory constraints
(`model_size` counts them for a graph).

Bytes are scaled so that the model's numbers stay below about 1e4, and the capacity gets a
margin of 5e-6 of the total bytes (none for graphs under 1e4 bytes), so solver tolerances
can never let an extracted schedule exceed the budget.

Anytime: the back-end gets the cheapest schedule that fits among store-all, recompute-all and
the greedy saved-set schedule for the budget (in the stages' literal form) as a MIP start, so a
time limit leaves an incumbent no worse than that seed (CBC through PuLP's ``warmStart``;
HiGHS through ``Highs.setSolution``, which PuLP's interface does not call itself).
``SolverOptions.progress`` gets HiGHS's incumbent and bound while it solves (its callbacks on
the ``highspy.Highs`` object PuLP keeps); CBC runs as a separate program and reports nothing
until it ends.

Bound: when HiGHS runs, its own best bound (``mip_dual_bound`` plus the objective's constant,
the stages' own groups, which PuLP does not pass to HiGHS). PuLP does not expose the best
bound CBC proves, so with CBC a time-limited solve reports the optimum of the model's LP
relaxation (solved afterwards, time limit 10% of the main one), never less than the store-all
cost (each needed op runs at least once); an optimal solve reports ``bound == objective``.

Files: `solvers.checkmate.data` (the graph by index, which variables exist),
`solvers.checkmate.milp_model` (the PuLP model), `solvers.checkmate.milp_engines` (HiGHS / CBC, MIP start, bound,
progress), `solvers.checkmate.stages` (schedules <-> stages), `solvers.checkmate.contract` (the
contract shared with CP-SAT: shortcuts, seeds, fallbacks, simulation).
"""

from __future__ import annotations

from solvers.base import SolveResult, SolverOptions
from solvers.checkmate.contract import MilpSolution, solve_checkmate
from solvers.checkmate.data import CheckmateData, lower_bound_bytes, prepare
from solvers.checkmate.milp_engines import solve_milp_model
from solvers.checkmate.milp_model import model_size
from solvers.ir.graph import RematGraph

__all__ = ["SOLVER_NAME", "MilpSolution", "model_size", "solve_checkmate", "solve_milp",
           "solve_milp_model", "CheckmateData", "lower_bound_bytes", "prepare"]

SOLVER_NAME = "checkmate-milp"


def solve_milp(graph: RematGraph, budget_bytes: int, options: SolverOptions) -> SolveResult:
    """Cheapest schedule whose simulated peak fits ``budget_bytes`` (the Checkmate MILP).

    - store-all fits: returned at once as OPTIMAL (each needed op must run at least once).
    - solved: OPTIMAL with ``bound == objective``; optimal over the Checkmate space (stage t
      computes group t, recomputations in topological order). ``objective`` is the simulated
      cost of the returned schedule, which can be below the model's optimum when
      `Schedule.from_computes` drops a computation nobody reads.
    - time limit with an incumbent: FEASIBLE, the cheaper of the incumbent and the classic
      schedules that fit; ``bound`` as described in the module docstring.
    - time limit without one: HEURISTIC, the cheapest classic schedule that fits (the solve
      is seeded with it, so this happens only when the back-end rejects the start or fails).
    - the model has no schedule within the budget but a classic one fits: HEURISTIC, that
      schedule (recompute-all runs forward ops nobody reads in forward only in backward, which
      the Checkmate stages cannot express; see `solvers.brute_force`).
    - nothing fits: `InfeasibleBudgetError` whose ``smallest_feasible_bytes`` is the lowest
      simulated peak of store-all and recompute-all: a budget known to be feasible, and above
      the budget (a classic schedule that fit would have been returned).

    Every returned schedule is simulated; a peak over budget raises AssertionError (that
    would be a formulation bug, never masked).
    """
    return solve_checkmate(graph, budget_bytes, options, solver_name=SOLVER_NAME,
                           solve_model=solve_milp_model)
