"""Planning, the top layer of the torch-free core: turns a `RematGraph` and a `PlanRequest` into a
checked `Plan` (planner), sweeps of budgets and strategies, the largest-batch search, per-rank
budgets for DDP/FSDP2, per-graph budgets for torch.compile and the eager runtime's region
knapsack. Torch-free: imports only the IR and the solvers; the frontends call it while they run.
"""
