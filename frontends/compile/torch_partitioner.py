"""PyTorch's own min-cut partitioner as a strategy, judged by remat-opt's simulator.

``torch.compile`` decides what to recompute with
``torch._functorch.partitioners.min_cut_rematerialization_partition``, steered by
``torch._functorch.config.activation_memory_budget`` (1.0: its runtime-optimal min cut; 0.0:
save only the inputs; in between, a knapsack over what the min cut would save). What-if reports
compare against it on the *same* joint graph remat-opt plans: the partitioner runs on a copy of
`CapturedStep.gm`, and its answer is read back as a schedule of our IR:

- the forward graph's ops, in its order, are the forward computes;
- the backward graph's ops, in its order, are the backward computes: its backward ops plus the
  forward ops it recomputes (copied under their joint-graph names);
- `Schedule.from_computes` derives the frees, the simulator gives peak and cost.

Two adjustments keep the comparison honest and runnable, and each is reported:
- CSE is off, so both partitions see one graph (torch's CSE would merge duplicate ops our IR
  keeps apart);
- run-once ops (random, or reading state the step updates) that the partitioner recomputes in
  backward (it relies on inductor's functionalized RNG to replay random ops exactly) are kept
  from forward instead, as remat-opt's rewrite must.

A budget at which torch's partitioner raises (DESIGN.md: BatchNorm models in train mode at
budgets below 1) is reported as failed with torch's reason, never as an error of ours.
"""

from __future__ import annotations

import contextlib
import copy
import logging
import warnings
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from frontends.capture.step import CapturedStep
from frontends.torch_compat import PARTITIONER_LOGGER, functorch_config, min_cut_rematerialization_partition
from solvers.ir.graph import Phase
from solvers.ir.schedule import Schedule
from solvers.ir.simulator import InvalidScheduleError, simulate

STRATEGY_NAME = "torch-min-cut"
DEFAULT_FRACTIONS = (0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0)
"""``activation_memory_budget`` values tried by default (torch accepts 0 <= m <= 1)."""


@dataclass(frozen=True)
class TorchPartition:
    """What torch's partitioner chose at one ``activation_memory_budget``, as our schedule."""

    fraction: float
    """The ``activation_memory_budget`` it ran with."""
    schedule: Schedule | None
    """The partition as a remat-opt schedule; None when torch failed or the result cannot run."""
    saved: tuple[str, ...] = ()
    """IR values torch's forward graph returns for backward (its saved set)."""
    recomputed_ops: int = 0
    """Ops torch's backward graph computes again after its forward graph computed them."""
    run_once_kept: tuple[str, ...] = ()
    """Run-once ops torch would recompute in backward that are kept from forward instead."""
    message: str = ""
    """Why it failed, or what was adjusted."""
    graphs: tuple[torch.fx.GraphModule, torch.fx.GraphModule] | None = None
    """torch's own forward and backward graphs, when ``schedule`` is exactly them (nothing was
    adjusted): they may save a view where remat-opt's rewrite of the schedule saves its base,
    which Inductor compiles to a lower peak. Not to be mutated: copy them to compile."""

    @property
    def label(self) -> str:
        """Short name of the setting for tables: ``amb=0.5`` (activation_memory_budget)."""
        return f"amb={self.fraction:g}"


def partition_schedule(captured: CapturedStep, fraction: float,
                       static_inputs: Sequence[int] | None = None, *, keep_graphs: bool = False) -> TorchPartition:
    """Run torch's min-cut partitioner on a copy of the captured joint graph at ``fraction``;
    ``static_inputs``: the joint inputs that live through the step (default: the captured
    parameters and buffers, which come first); ``keep_graphs``: return torch's graphs too
    (`TorchPartition.graphs`)."""
    if not 0.0 <= fraction <= 1.0:
        raise ValueError(f"activation_memory_budget must be within [0, 1], got {fraction}")
    graph = captured.graph
    if static_inputs is None:
        static_inputs = range(len(captured.param_names) + len(captured.buffer_names))
    static_inputs = list(static_inputs)
    try:
        with warnings.catch_warnings(), _quiet_partitioner_logs():
            warnings.simplefilter("ignore")
            joint = copy.deepcopy(captured.gm)
            with functorch_config.patch(activation_memory_budget=float(fraction), cse=False):
                fw_module, bw_module = min_cut_rematerialization_partition(
                    joint, None, num_fwd_outputs=captured.num_fwd_outputs,
                    static_lifetime_input_indices=static_inputs,
                )
    except Exception as err:  # torch's failure is a finding of the comparison, not our bug
        return TorchPartition(fraction, None, message=f"torch's partitioner failed: {_one_line(err)}")

    torch_forward = _computes(fw_module, captured)
    forward = _with_rng_states(graph, torch_forward)
    backward = _computes(bw_module, captured)
    run_once_kept = tuple(dict.fromkeys(
        name for name in backward if graph[name].compute_once and graph[name].phase is Phase.FORWARD
    ))
    backward = [name for name in backward if name not in run_once_kept]
    in_forward = set(forward)
    recomputed = sum(1 for name in backward if name in in_forward)
    saved = _saved_values(fw_module, captured)
    note = (f"{len(run_once_kept)} random or state-reading op(s) kept from forward (torch would "
            "replay them in backward)" if run_once_kept else "")
    try:
        schedule = Schedule.from_computes(graph, forward, backward)
        simulate(graph, schedule)
    except (InvalidScheduleError, ValueError) as err:
        return TorchPartition(fraction, None, saved, recomputed, run_once_kept,
                              f"torch's partition does not run on remat-opt's graph: {_one_line(err)}")
    faithful = keep_graphs and not run_once_kept and forward == torch_forward
    return TorchPartition(fraction, schedule, saved, recomputed, run_once_kept, note,
                          (fw_module, bw_module) if faithful else None)


def partition_schedules(captured: CapturedStep,
                        fractions: tuple[float, ...] = DEFAULT_FRACTIONS) -> tuple[TorchPartition, ...]:
    """`partition_schedule` at each of ``fractions``."""
    return tuple(partition_schedule(captured, f) for f in fractions)


def _computes(module: torch.fx.GraphModule, captured: CapturedStep) -> list[str]:
    """IR values computed by ``module``'s ops, in its order (one name per op: its first output).

    Ops are matched to IR groups by name: the partitioner copies joint-graph nodes under their
    own names. Views, getitems and other aliases compute no new storage and are skipped.
    """
    groups = captured.graph.groups
    return [groups[node.name][0] for node in module.graph.nodes
            if node.op == "call_function" and node.name in groups]


def _with_rng_states(graph, forward: list[str]) -> list[str]:
    """``forward`` with each replayable random op's saved state computed right before its first
    run: the state is an IR input of the op only (no fx node reads it), so torch drops it."""
    out: list[str] = []
    for name in forward:
        state = graph[name].rng_state
        if state and state not in out:
            out.append(state)
        out.append(name)
    return out


def _saved_values(fw_module: torch.fx.GraphModule, captured: CapturedStep) -> tuple[str, ...]:
    """IR values behind the forward graph's outputs past the user outputs (what it saves)."""
    outputs = fw_module.graph.find_nodes(op="output")[0].args[0]
    names = [captured.value_of.get(out.name) for out in outputs[captured.num_fwd_outputs:]
             if isinstance(out, torch.fx.Node)]
    return tuple(dict.fromkeys(n for n in names if n is not None and captured.graph[n].is_op))


def _one_line(err: BaseException) -> str:
    lines = str(err).strip().splitlines()
    return f"{type(err).__name__}: {lines[0] if lines else ''}".rstrip(": ")


@contextlib.contextmanager
def _quiet_partitioner_logs():
    """The partitioner logs warnings (e.g. about its knapsack) that would bury our report."""
    logger = logging.getLogger(PARTITIONER_LOGGER)
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)
