"""Compile: remat-opt as a ``torch.compile`` backend, and PyTorch's own partitioner as a strategy.

`compile_backend` is the hook dynamo calls for every graph (made by `optimizer.compile.remat_backend`
from `backend_settings`): it reads the joint graph (`dynamo_joint`), plans it or fits it to
Inductor's buffers (`joint_planning`, `inductor_fit`), splits its LM head and MLPs
(`compile_split`, chosen by `auto_split` under ``split="auto"``), and passes remat-opt's errors
through dynamo (`compile_errors`). `compiled_memory` measures a compiled step from inside its
graphs and `inductor_memory` predicts its peak from Inductor's buffer plan. `torch_partitioner`
runs torch.compile's min-cut partitioner for comparison.
"""
