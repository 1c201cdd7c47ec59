"""Distributed: data-parallel jobs (DDP, FSDP2) planned per rank and checked on local ranks.

Planning a model for one rank is `optimizer.ranks`; here `rank_loop` measures the optimizer over
what a rank steps (FSDP2: its shards), `rank_memory` measures what a rank really holds (one step,
or whole training iterations), and `gloo_ranks` runs a function on N local gloo CPU ranks (the
tests' stand-in for a cluster).
"""
