"""Eager runtime: remat-opt plans, ``torch.utils.checkpoint`` runs it, on the user's own model.

`optimizer.checkpointing.apply_checkpointing` captures the step for the plan only, lines
the captured ops up with what eager PyTorch runs in each module (`eager_ops`), and puts
selective-checkpoint wrappers on the user's modules (`eager_checkpoint`, which also loads and
saves plans without the planning machinery); `eager_split` runs MLPs in token chunks there.
"""
