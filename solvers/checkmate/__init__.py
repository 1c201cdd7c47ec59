"""The Checkmate model (stages of computes and frees, one per backward op) and its back-ends.

- `data`: the solver-neutral problem data (groups, costs, bytes, inputs) and its lower bound;
- `stages`: stage sequences and turning a solved model back into a `Schedule`;
- `milp_model` / `milp_engines` / `milp`: the PuLP MILP, its engines (HiGHS, CBC) and the solver;
- `cpsat_model` / `cpsat`: the OR-Tools CP-SAT model and the solver;
- `contract`: what every back-end adds (seeds, fallback, the simulator's verdict, the bound);
- `min_budget`: the smallest feasible budget, proven or found;
- `interval_model` / `interval_placement` / `interval_lns` / `intervals`: the same stage order as
  retention intervals (O(n) variables, one cumulative constraint; Moccasin), schedules <->
  placements, its large-neighbourhood search and the solver (seeded, with the LP bound), for
  graphs past `solvers.base.EXACT_MAX_GROUPS`.
"""
