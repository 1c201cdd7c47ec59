"""Distributed: data-parallel jobs (DDP, FSDP2) planned per rank and checked on local ranks.

`data_parallel` captures a model and plans it for one rank, `rank_memory` measures what a rank
really holds, and `gloo_ranks` runs a function on N local gloo CPU ranks (the tests' stand-in for
a cluster).
"""
