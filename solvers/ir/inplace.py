"""Which computations of a schedule run in place: the output takes over an input's storage.

Eager autograd accumulates gradients in place (``add_``); a functional graph writes each sum to a
fresh buffer, which costs both a buffer's bytes while the op runs and the time to fill new memory.
An op whose node lists ``reuses`` (`solvers.ir.graph.Node`) may instead write into one of those
inputs. Both the simulator (bytes) and the graph runtime (``add_`` for ``add``) call `donations`, so
what is predicted is what runs.

Why a donation is safe. Step ``i`` computes value ``c`` and donates input ``x`` only when:
1. ``x`` is freed among the free steps right after step ``i``, in the same phase, before any
   other compute: no later step reads ``x``'s storage (aliases are not values: a view's reader
   reads ``x``), so overwriting it changes nothing any later step sees, and ``x`` needs no bytes
   of its own after the op. A value freed only at the boundary is not one: forward returns it
   (an updated buffer, an output);
2. ``x`` was last computed in the phase of step ``i``: a value forward saved for backward is never
   written, so backward sees what forward made;
3. the schedule never offloads ``x``: no copy to host reads it while it is written;
4. ``c`` is not a user output and ``c`` is not live (no throwaway copy of a held value), and the
   op's other inputs are other storages (the graph's check that ``x`` is among the op's inputs
   with ``c``'s bytes, `RematGraph`, and the capture's that no other input shares the storage).
Resident values, tangents and user outputs are never freed, so (1) excludes them.
"""

from __future__ import annotations

from solvers.ir.graph import RematGraph
from solvers.ir.schedule import Schedule, StepKind


def donations(graph: RematGraph, schedule: Schedule) -> dict[int, str]:
    """Step index (into ``schedule.steps``) of each computation run in place -> the input whose
    storage it takes over. Empty when no node of the graph may reuse an input."""
    candidates = {n.name: n.reuses for n in graph.ops if n.reuses and n.name not in graph.user_outputs}
    if not candidates:
        return {}
    steps = schedule.steps
    n_forward = len(schedule.forward)
    offloaded = {s.node for s in steps if s.kind is StepKind.OFFLOAD}
    computed_in_forward: dict[str, bool] = {}  # value -> its latest computation is in forward
    donated: dict[int, str] = {}
    COMPUTE, FREE = StepKind.COMPUTE, StepKind.FREE
    for i, step in enumerate(steps):
        if step.kind is not COMPUTE:
            continue
        name = step.node
        reuses = candidates.get(name)
        if reuses is not None:
            in_forward = i < n_forward
            end = n_forward if in_forward else len(steps)  # a value freed at the boundary is a forward output
            freed_next: set[str] = set()
            j = i + 1
            while j < end and steps[j].kind is FREE:
                freed_next.add(steps[j].node)
                j += 1
            for x in reuses:
                if (x in freed_next and x not in offloaded
                        and computed_in_forward.get(x) is in_forward):
                    donated[i] = x
                    break
        computed_in_forward[name] = i < n_forward
    return donated
