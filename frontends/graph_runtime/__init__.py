"""Graph runtime: the plan run as rewritten graphs, in place of the user's forward.

A schedule becomes forward and backward GraphModules (`rewrite`), random ops recomputed by
replaying their generator state (`rng_replay`), and `RematModule` (`remat_module`) trains the
model through them, at the planned input sizes and smaller ones (`shape_variants`).
"""
