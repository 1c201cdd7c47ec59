"""Layer 2, planning: turns a `RematGraph` and a budget into a checked `Plan` (planner), sweeps of
budgets and strategies, the largest-batch search, per-rank budgets for DDP/FSDP2 and per-graph
budgets for torch.compile. Torch-free: imports only the IR and the solvers.
"""
