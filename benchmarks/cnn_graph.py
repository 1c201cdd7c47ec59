"""A generated ResNet-like training graph of any depth, shaped as a captured one is.

Why: the exact models' scale target (issue 40) is a 1,000-op-group CNN; this builds one without
torch, with what matters for memory: per layer a convolution, a batch norm (three outputs: the
normalized value and the saved mean and inverse std, with a workspace), a ReLU and every second
layer a residual add; activations halve and channels double every stage, so parameter gradients
grow with depth. Backward mirrors autograd: ReLU backward reads the ReLU's output, batch-norm
backward the convolution's output and the saved statistics, convolution backward the layer's
input and yields the input and weight gradients (one op, two outputs, with a workspace).
"""

from __future__ import annotations

import random

from solvers.ir.graph import Node, NodeKind, Phase, RematGraph

F, B = Phase.FORWARD, Phase.BACKWARD


def _op(name, phase, nbytes, inputs, cost, group=None, temp=0) -> Node:
    return Node(name, NodeKind.OP, phase, nbytes, tuple(inputs), group=group or name, cost=cost,
                flops=cost, temp_bytes=temp)


def resnet_like(layers: int, seed: int = 0, stages: int = 4, width: int = 1 << 20) -> RematGraph:
    """``layers`` conv-bn-relu layers in ``stages`` stages; 7 op groups per layer, about."""
    rng = random.Random(seed)
    nodes = [Node("x", NodeKind.INPUT, F, width)]
    per_stage = max(1, layers // stages)
    act, params, prev, skip = width, [], "x", "x"
    record = []  # (layer, input, conv, bn members, relu, out, act, weight bytes)
    for i in range(layers):
        s = min(i // per_stage, stages - 1)
        act = max(1024, width >> s)  # activations halve per stage, channels double
        wbytes = 4096 << (2 * s)
        w = f"w{i}"
        nodes.append(Node(w, NodeKind.PARAMETER, F, wbytes))
        params.append(w)
        flops = act * (1 << s) * 9 * (0.7 + 0.6 * rng.random())
        nodes.append(_op(f"conv{i}", F, act, [prev, w], flops))
        nodes.append(_op(f"bn{i}", F, act, [f"conv{i}", w], act * 4, group=f"bn{i}", temp=act // 8))
        nodes.append(_op(f"bn{i}_mean", F, 256 << s, [f"conv{i}", w], 0.0, group=f"bn{i}"))
        nodes.append(_op(f"bn{i}_rstd", F, 256 << s, [f"conv{i}", w], 0.0, group=f"bn{i}"))
        nodes.append(_op(f"relu{i}", F, act, [f"bn{i}"], act))
        out = f"relu{i}"
        if i % 2 == 1 and i // per_stage == (i - 1) // per_stage and skip != "x":
            nodes.append(_op(f"add{i}", F, act, [out, skip], act))
            out = f"add{i}"
        record.append((i, prev, act, wbytes, out))
        if i % 2 == 1:
            skip = out
        prev = out
    nodes.append(_op("loss", F, 4, [prev], act))
    nodes.append(Node("t", NodeKind.TANGENT, B, 4))
    grads: dict[str, list[str]] = {prev: ["t"]}
    outputs = []

    def grad_of(value: str, size: int, tag: str) -> str:
        incoming = grads.pop(value)
        if len(incoming) == 1:
            return incoming[0]
        nodes.append(_op(f"gsum_{tag}", B, size, incoming, size))
        return f"gsum_{tag}"

    for i, inp, act, wbytes, out in reversed(record):
        if out.startswith("add"):
            g = grad_of(out, act, f"add{i}")
            grads.setdefault(f"relu{i}", []).append(g)
            skip_in = next(n for n in nodes if n.name == out).inputs[1]
            grads.setdefault(skip_in, []).append(g)
        g = grad_of(f"relu{i}", act, f"relu{i}")
        nodes.append(_op(f"grelu{i}", B, act, [g, f"relu{i}"], act))
        nodes.append(_op(f"gbn{i}", B, act, [f"grelu{i}", f"conv{i}", f"bn{i}_mean", f"bn{i}_rstd", f"w{i}"],
                         act * 8, group=f"gbn{i}", temp=act // 8))
        nodes.append(_op(f"gbn{i}_w", B, 64, [f"grelu{i}", f"conv{i}", f"bn{i}_mean", f"bn{i}_rstd", f"w{i}"],
                         0.0, group=f"gbn{i}"))
        outputs.append(f"gbn{i}_w")
        conv_reads = [f"gbn{i}", inp, f"w{i}"]
        if inp == "x":  # no input gradient for the image
            nodes.append(_op(f"gconv{i}_w", B, wbytes, conv_reads, 2 * act * 9, temp=act // 2))
        else:
            nodes.append(_op(f"gconv{i}_x", B, act, conv_reads, 2 * act * 9, group=f"gconv{i}",
                             temp=act // 2))
            nodes.append(_op(f"gconv{i}_w", B, wbytes, conv_reads, 0.0, group=f"gconv{i}"))
            grads.setdefault(inp, []).append(f"gconv{i}_x")
        outputs.append(f"gconv{i}_w")
    return RematGraph(tuple(nodes), forward_outputs=("loss",), user_outputs=("loss",),
                      backward_outputs=tuple(outputs), name=f"resnet_like_{layers}")
