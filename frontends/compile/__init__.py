"""Compile: remat-opt as a ``torch.compile`` backend, and PyTorch's own partitioner as a strategy.

`compile_backend` plans every graph dynamo hands it (with the joint-graph adjustments of
`dynamo_joint`, the row and MLP splits of `compile_split`, and remat-opt's errors passed through
dynamo by `compile_errors`); `compiled_memory` measures a compiled step from inside its graphs,
`inductor_memory` predicts its peak from Inductor's buffer plan and `inductor_fit` re-plans until
that peak meets the budget. `torch_partitioner` runs torch.compile's min-cut partitioner for
comparison.
"""
