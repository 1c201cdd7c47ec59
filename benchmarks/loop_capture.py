"""Capture of a long loop: the joint written from three short traces against the whole trace.

For each length, the issue-25 loop (`long_chains.Loop`: a Linear+Tanh cell applied ``steps``
times as ``h = h + 0.1 cell(h)``, batch 256, width 64) is captured twice in one process,
alternating: with the stitch (`frontends.capture.joint_stitch`, the default) and traced whole
(``stitch_loops=False``). It prints both times (`frontends.capture.step.capture`, flops cost model)
and whether the two joints are the same node for node (`canonical_form`: ops, arguments, value
layouts, storage sharing, sequence numbers) and the two IRs equal.

    python benchmarks/loop_capture.py --steps 200 1000
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from long_chains import BATCH, WIDTH, Loop  # noqa: E402

from frontends.capture.joint_stitch import canonical_form  # noqa: E402
from frontends.capture.step import capture  # noqa: E402


def timed_capture(steps: int, stitch: bool):
    torch.manual_seed(0)
    model, x = Loop(steps), torch.randn(BATCH, WIDTH)
    start = time.perf_counter()
    captured = capture(model, (x,), stitch_loops=stitch)
    return captured, time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, nargs="+", default=[200, 1000])
    args = parser.parse_args()
    print("| steps | stitched (s) | whole (s) | ratio | fx nodes | same joint | same IR |")
    print("|---:|---:|---:|---:|---:|---|---|")
    for steps in args.steps:
        stitched, fast = timed_capture(steps, True)
        whole, slow = timed_capture(steps, False)
        assert stitched.stitched_loop is not None, "the loop was not stitched"
        same_joint = canonical_form(stitched.gm) == canonical_form(whole.gm)
        print(f"| {steps:,} | {fast:.1f} | {slow:.1f} | {slow / fast:.1f}x | {len(whole.gm.graph.nodes):,} | "
              f"{same_joint} | {stitched.graph == whole.graph} |", flush=True)


if __name__ == "__main__":
    main()
