"""Coverage sweep: timm and transformers architectures built as users build them, each planned,
run for one step and checked against plain autograd.

Every model is built from its library's default configuration at a small size (no downloads:
``timm.create_model(name, pretrained=False, num_classes=10, ...)``, transformers config classes
with tiny widths, 2 layers and a 128-token vocabulary); dropout, attention implementation and
``use_cache`` stay at the library defaults. For each model, in a forked child with a wall-clock
limit (one failure or hang does not stop the sweep):

1. capture the training step once (`frontends.capture.costed_capture.capture_with_costs`, what
   ``optimize`` runs) and plan it with ``store-all`` for plain autograd's peak;
2. budget = fixed + 0.6 * (store-all peak - fixed), fixed = parameters + gradients + inputs
   (``plan.breakdown``'s split): "60% of activations". remat-opt's own percentages are of the
   whole step's peak (`solvers.ir.budget.resolve_budget`), so the budget is passed in bytes;
3. plan with ``auto`` and build the RematModule from the same capture (``optimize``'s two steps:
   `plan_graph` + `RematModule`);
4. one eager step and one remat step, each after ``torch.manual_seed(1)`` from the same buffers
   (dropout draws the same masks); gradients and buffers compared (max |a-b| / max |b| per
   tensor);
5. one more remat step under `frontends.measure.memory_tracker.track_live_memory`: the measured peak is
   the tracked peak plus the storages resident before the step (parameters, buffers, inputs and
   the rewritten graphs' lifted constants, each storage once), `frontends.measure.step`'s
   accounting, against ``plan.predicted_peak_bytes``.

A model *holds* when its plan fits the budget, its gradients and buffers match eager within the
dtype's threshold (float64: 1e-8; float32, only where the library has no float64 kernel:
1e-4), and |measured - predicted| <= 0.5% of predicted.

``--runtime eager`` sweeps the eager runtime instead (what a user who keeps their own module
gets): steps 1-2 give the same budget in bytes, then ``apply_checkpointing`` checkpoints a copy
of the model in place for it, and that copy's step is compared with eager's gradients and
measured with `frontends.measure.step.measure_step` (the peak of the step, parameters, buffers
and inputs included). A model whose checkpointing plans cannot reach the budget is *refused*:
``InfeasibleBudgetError`` with the leanest budget the family reaches, a clear error and not a
failure; the table says how far above the budget that is.

    python benchmarks/coverage.py --out benchmarks/coverage.md          # the sweep
    python benchmarks/coverage.py --only gpt2,t5 --out /tmp/c.md         # a few of them
    python benchmarks/coverage.py --runtime eager --out benchmarks/coverage_eager.md
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import gc
import json
import multiprocessing
import operator
import os
import platform
import re
import sys
import time
import traceback
import warnings
from collections import defaultdict
from typing import Any, Callable

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch import nn  # noqa: E402
from torch.utils._pytree import tree_flatten  # noqa: E402
from vs_pytorch_measure import max_relative_error  # noqa: E402  (this folder is on sys.path)

from frontends.capture.costed_capture import capture_with_costs  # noqa: E402
from frontends.graph_runtime.remat_module import RematModule  # noqa: E402
from frontends.measure.memory_tracker import track_live_memory  # noqa: E402
from frontends.measure.step import measure_step, unique_storage_bytes  # noqa: E402
from optimizer import InfeasibleBudgetError, apply_checkpointing  # noqa: E402
from solvers.base import SolverOptions  # noqa: E402
from solvers.planning.planner import plan_graph  # noqa: E402

VOCAB = 128
BATCH = 2
IMAGE_BATCH = 4
SEQ = 32
ACTIVATION_FRACTION = 0.6
PEAK_TOLERANCE = 0.005
THRESHOLDS = {torch.float64: 1e-8, torch.float32: 1e-4}


# ------------------------------------------------------------------------------ models
@dataclasses.dataclass(frozen=True)
class Spec:
    name: str
    family: str
    library: str
    build: Callable[[], tuple[nn.Module, tuple, dict]]
    dtype: torch.dtype = torch.float64
    note: str = ""


class ClassifierStep(nn.Module):
    """A timm classifier's training step as users write it: logits, then cross-entropy."""

    def __init__(self, net: nn.Module):
        super().__init__()
        self.net = net

    def forward(self, images: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(self.net(images), targets)


def _timm(name: str, size: int, **kwargs) -> Callable:
    def build():
        import timm
        net = timm.create_model(name, pretrained=False, num_classes=10, **kwargs)
        gen = torch.Generator().manual_seed(0)
        images = torch.randn(IMAGE_BATCH, 3, size, size, generator=gen)
        targets = torch.randint(0, 10, (IMAGE_BATCH,), generator=gen)
        return ClassifierStep(net), (images, targets), {}
    return build


def _tokens(seq: int = SEQ) -> torch.Tensor:
    return torch.randint(3, VOCAB, (BATCH, seq), generator=torch.Generator().manual_seed(0))


def _hf(model_class: str, config_class: str, inputs: str = "lm", **config) -> Callable:
    def build():
        import transformers
        cfg = getattr(transformers, config_class)(**config)
        model = getattr(transformers, model_class)(cfg)
        ids = _tokens()
        if inputs == "lm":  # causal LM, masked LM, seq2seq: labels are the tokens
            kwargs = {"input_ids": ids, "labels": ids}
        elif inputs == "cls":  # sequence classification, default 2 labels
            kwargs = {"input_ids": ids, "labels": torch.tensor([0, 1])}
        elif inputs == "mlm-mask":  # input_ids + attention_mask, as a tokenizer returns them
            kwargs = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids}
        elif inputs == "image":
            gen = torch.Generator().manual_seed(0)
            size = config["image_size"]
            kwargs = {"pixel_values": torch.randn(BATCH, 3, size, size, generator=gen),
                      "labels": torch.randint(0, config["num_labels"], (BATCH,), generator=gen)}
        else:
            raise ValueError(inputs)
        return model, (), kwargs
    return build


# Small decoder settings shared by the Llama-like configs.
_DEC = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
_GROUPED_MM = ("float32: the default experts implementation (grouped_mm) has no float64 kernel, "
               "in eager too")
_ENC = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
            num_attention_heads=4, max_position_embeddings=64)

SPECS: tuple[Spec, ...] = (
    # ---------------------------------------------------------------- timm CNNs
    Spec("resnet18", "CNN", "timm", _timm("resnet18", 128)),
    Spec("resnet50", "CNN", "timm", _timm("resnet50", 64)),
    Spec("mobilenetv3_small_100", "CNN", "timm", _timm("mobilenetv3_small_100", 64)),
    Spec("efficientnet_b0", "CNN", "timm", _timm("efficientnet_b0", 64)),
    Spec("densenet121", "CNN", "timm", _timm("densenet121", 64)),
    Spec("regnetx_002", "CNN", "timm", _timm("regnetx_002", 64)),
    Spec("convnext_atto", "CNN", "timm", _timm("convnext_atto", 64)),
    Spec("ghostnet_100", "CNN", "timm", _timm("ghostnet_100", 64)),
    Spec("mixnet_s", "CNN", "timm", _timm("mixnet_s", 64)),
    # ---------------------------------------------------------------- timm vision transformers
    Spec("vit_tiny_patch16_224", "ViT", "timm", _timm("vit_tiny_patch16_224", 128, img_size=128, depth=4)),
    Spec("deit_tiny_patch16_224", "ViT", "timm", _timm("deit_tiny_patch16_224", 128, img_size=128, depth=4)),
    Spec("swin_tiny_patch4_window7_224", "ViT", "timm",
         _timm("swin_tiny_patch4_window7_224", 64, img_size=64, window_size=4, depths=(1, 1, 2, 1))),
    Spec("mobilevit_xxs", "hybrid", "timm", _timm("mobilevit_xxs", 64)),
    Spec("levit_128s", "hybrid", "timm", _timm("levit_128s", 64, img_size=64)),
    # ---------------------------------------------------------------- decoder-only
    Spec("gpt2", "decoder", "transformers",
         _hf("GPT2LMHeadModel", "GPT2Config", n_layer=2, n_embd=32, n_head=4, vocab_size=VOCAB,
             n_positions=64)),
    Spec("llama", "decoder", "transformers", _hf("LlamaForCausalLM", "LlamaConfig", **_DEC)),
    Spec("mistral", "decoder", "transformers", _hf("MistralForCausalLM", "MistralConfig", **_DEC)),
    Spec("qwen2", "decoder", "transformers", _hf("Qwen2ForCausalLM", "Qwen2Config", **_DEC)),
    Spec("qwen3", "decoder", "transformers", _hf("Qwen3ForCausalLM", "Qwen3Config", head_dim=8, **_DEC)),
    Spec("gemma2", "decoder", "transformers", _hf("Gemma2ForCausalLM", "Gemma2Config", head_dim=8, **_DEC)),
    Spec("phi3", "decoder", "transformers", _hf("Phi3ForCausalLM", "Phi3Config", pad_token_id=0, **_DEC),
         note="pad_token_id=0: the default (32000) is outside a 128-token vocabulary"),
    Spec("gpt_neox", "decoder", "transformers",
         _hf("GPTNeoXForCausalLM", "GPTNeoXConfig", **{k: v for k, v in _DEC.items()
                                                        if k != "num_key_value_heads"})),
    Spec("opt", "decoder", "transformers",
         _hf("OPTForCausalLM", "OPTConfig", vocab_size=VOCAB, hidden_size=32, ffn_dim=64,
             num_hidden_layers=2, num_attention_heads=4, max_position_embeddings=64,
             word_embed_proj_dim=32)),
    Spec("bloom", "decoder", "transformers",
         _hf("BloomForCausalLM", "BloomConfig", vocab_size=VOCAB, hidden_size=32, n_layer=2, n_head=4)),
    # ---------------------------------------------------------------- mixture of experts
    Spec("mixtral", "MoE", "transformers",
         _hf("MixtralForCausalLM", "MixtralConfig", num_local_experts=4, num_experts_per_tok=2, **_DEC),
         torch.float32, _GROUPED_MM),
    Spec("qwen2_moe", "MoE", "transformers",
         _hf("Qwen2MoeForCausalLM", "Qwen2MoeConfig", moe_intermediate_size=32,
             shared_expert_intermediate_size=64, num_experts=4, num_experts_per_tok=2, **_DEC),
         torch.float32, _GROUPED_MM),
    # ---------------------------------------------------------------- encoder-only
    Spec("bert", "encoder", "transformers", _hf("BertForMaskedLM", "BertConfig", "mlm-mask", **_ENC)),
    Spec("roberta", "encoder", "transformers",
         _hf("RobertaForSequenceClassification", "RobertaConfig", "cls", **_ENC)),
    Spec("distilbert", "encoder", "transformers",
         _hf("DistilBertForSequenceClassification", "DistilBertConfig", "cls", vocab_size=VOCAB,
             dim=32, hidden_dim=64, n_layers=2, n_heads=4, max_position_embeddings=64)),
    Spec("albert", "encoder", "transformers",
         _hf("AlbertForMaskedLM", "AlbertConfig", embedding_size=16, **_ENC)),
    Spec("electra", "encoder", "transformers",
         _hf("ElectraForMaskedLM", "ElectraConfig", embedding_size=16, **_ENC)),
    Spec("deberta_v2", "encoder", "transformers",
         _hf("DebertaV2ForSequenceClassification", "DebertaV2Config", "cls", **_ENC)),
    # ---------------------------------------------------------------- encoder-decoder
    Spec("t5", "encoder-decoder", "transformers",
         _hf("T5ForConditionalGeneration", "T5Config", vocab_size=VOCAB, d_model=32, d_ff=64,
             num_layers=2, num_heads=4, d_kv=8, decoder_start_token_id=0),
         note="decoder_start_token_id=0 (t5-small's; transformers 5's T5Config has no default)"),
    Spec("bart", "encoder-decoder", "transformers",
         _hf("BartForConditionalGeneration", "BartConfig", vocab_size=VOCAB, d_model=32,
             encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
             decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64,
             max_position_embeddings=64)),
    # ---------------------------------------------------------------- vision (transformers)
    Spec("vit_hf", "ViT", "transformers",
         _hf("ViTForImageClassification", "ViTConfig", "image", hidden_size=32, num_hidden_layers=2,
             num_attention_heads=4, intermediate_size=64, image_size=32, patch_size=8, num_labels=10)),
)


# ------------------------------------------------------------------------------ one model
def _first_line(err: BaseException) -> str:
    """Type and first line of the message, and torch's "Caused by" source location if any."""
    text = str(err).strip().splitlines()
    line = f"{type(err).__name__}: {text[0] if text else ''}"[:300]
    cause: BaseException | None = err
    while cause is not None:
        found = re.search(r"Caused by: \((.*?)\)", str(cause))
        if found:
            return f"{line} [{found.group(1)}]"
        cause = cause.__cause__
    return line


def _loss_of(out) -> torch.Tensor:
    if isinstance(out, torch.Tensor):
        return out
    loss = getattr(out, "loss", None)  # a transformers ModelOutput
    if isinstance(loss, torch.Tensor):
        return loss
    return out[0]


def _step(module: nn.Module, model: nn.Module, args: tuple, kwargs: dict) -> None:
    """One forward + backward under seed 1; the outputs are held until backward ends."""
    model.zero_grad(set_to_none=True)
    torch.manual_seed(1)
    out = module(*args, **kwargs)
    _loss_of(out).backward()
    del out


def _grads(model: nn.Module) -> dict[str, torch.Tensor]:
    return {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}


def _buffers(model: nn.Module) -> dict[str, torch.Tensor]:
    return {n: b.detach().clone() for n, b in model.named_buffers()}


def _restore(model: nn.Module, buffers: dict[str, torch.Tensor]) -> None:
    with torch.no_grad():
        for n, b in model.named_buffers():
            b.copy_(buffers[n])


def _resident_bytes(rm: RematModule, model: nn.Module, args: tuple, kwargs: dict) -> int:
    """Storages alive before the step, each once: parameters, buffers, inputs, and the tensors
    the rewritten graphs hold as attributes (lifted constants)."""
    tensors = [*model.parameters(), *model.buffers(), *tree_flatten((args, kwargs))[0]]
    for gm in (rm.forward_graph, rm.backward_graph):
        for node in gm.graph.nodes:
            if node.op == "get_attr":
                tensors.append(operator.attrgetter(node.target)(gm))
    return unique_storage_bytes(tensors)


def run_one(spec: Spec, time_limit: float, report: Callable[[str], None] = lambda stage: None,
            runtime: str = "graph") -> dict[str, Any]:
    """Everything the table says about one model; ``reason`` names the first failing stage;
    ``report(stage)`` is called as each stage begins (the parent names it on a timeout);
    ``runtime="eager"``: the eager runtime at the same budget (`_eager_runtime`)."""
    row: dict[str, Any] = {"name": spec.name, "family": spec.family, "library": spec.library,
                           "dtype": str(spec.dtype).replace("torch.", ""), "note": spec.note}
    stage = "build"
    try:
        torch.manual_seed(0)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            model, args, kwargs = spec.build()
        model = model.to(spec.dtype).train()
        args = tuple(a.to(spec.dtype) if a.is_floating_point() else a for a in args)
        kwargs = {k: v.to(spec.dtype) if v.is_floating_point() else v for k, v in kwargs.items()}
        row["params"] = sum(p.numel() for p in model.parameters())
        start_buffers = _buffers(model)

        stage = "eager step"
        report(stage)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            _step(model, model, args, kwargs)
        ref_grads, ref_buffers = _grads(model), _buffers(model)
        model.zero_grad(set_to_none=True)
        _restore(model, start_buffers)

        stage = "capture"
        report(stage)
        start = time.perf_counter()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            captured = capture_with_costs(model, args, kwargs)
        row["capture_s"] = time.perf_counter() - start
        row["fx_nodes"] = len(captured.gm.graph.nodes)
        graph = captured.graph
        row["op_groups"] = len({n.group for n in graph.nodes if n.group})
        if max_relative_error(_buffers(model), start_buffers) != 0.0:
            raise AssertionError("capture changed the model's buffers")

        stage = "plan"
        report(stage)
        start = time.perf_counter()
        store_all = plan_graph(graph, "100%", "store-all")
        fixed = graph.parameter_bytes + graph.gradient_bytes + graph.input_bytes
        budget = fixed + int(ACTIVATION_FRACTION * (store_all.store_all_peak_bytes - fixed))
        row.update(store_all_bytes=store_all.store_all_peak_bytes, fixed_bytes=fixed, budget_bytes=budget)
        if runtime == "eager":
            return _eager_runtime(row, spec, model, args, kwargs, budget, ref_grads, ref_buffers,
                                  start_buffers, time_limit, report)
        options = SolverOptions(time_limit_s=time_limit, threads=1)
        plan = plan_graph(graph, budget, "auto", options, graph_nodes=row["fx_nodes"])
        if captured.notes:
            plan = dataclasses.replace(plan, message="; ".join(filter(None, (plan.message, *captured.notes))))
        row["solve_s"] = time.perf_counter() - start
        row.update(predicted_bytes=plan.predicted_peak_bytes, solver=plan.solver,
                   plan_status=plan.status, extra_percent=plan.extra_percent,
                   recomputed=len(plan.recomputed), message=plan.message)

        stage = "rewrite"
        report(stage)
        start = time.perf_counter()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            rm = RematModule(model, captured, plan, args, kwargs)
        row["rewrite_s"] = time.perf_counter() - start
        row["plan_s"] = row["capture_s"] + row["solve_s"] + row["rewrite_s"]

        stage = "remat step"
        report(stage)
        _step_against_eager(row, rm, model, args, kwargs, ref_grads, ref_buffers, start_buffers)

        stage = "measure"
        report(stage)
        gc.collect()
        resident = _resident_bytes(rm, model, args, kwargs)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            with track_live_memory() as tracker:
                _step(rm, model, args, kwargs)
        row["measured_bytes"] = resident + tracker.result.peak_bytes
        model.zero_grad(set_to_none=True)
        stage = "check"
        report(stage)
        row = _check(row, spec, budget, plan.predicted_peak_bytes, plan.extra_percent, plan.message)
    except Exception as err:  # noqa: BLE001 - every failure is a row of the table
        row["status"] = "fails"
        row["reason"] = f"{stage}: {_first_line(err)}"
        row["traceback"] = traceback.format_exc()[-4000:]
    return row


def _step_against_eager(row: dict[str, Any], module: nn.Module, model: nn.Module, args: tuple, kwargs: dict,
                        ref_grads: dict, ref_buffers: dict, start_buffers: dict) -> None:
    """One step of ``module`` (``model``'s parameters) from the start buffers: its gradient and
    buffer errors against eager's go into ``row``; the buffers are put back."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        _step(module, model, args, kwargs)
    row["grad_err"] = max_relative_error(_grads(model), ref_grads)
    row["buffer_err"] = max_relative_error(_buffers(model), ref_buffers) if ref_buffers else 0.0
    model.zero_grad(set_to_none=True)
    _restore(model, start_buffers)


def _check(row: dict[str, Any], spec: Spec, budget: int, predicted: int, extra_percent: float,
           message: str) -> dict[str, Any]:
    """``row`` with its status: holds when the plan fits ``budget``, gradients and buffers match
    eager's and the measured peak is the predicted one (`PEAK_TOLERANCE`)."""
    row["diff_bytes"] = row["measured_bytes"] - row["predicted_bytes"]
    threshold = THRESHOLDS[spec.dtype]
    problems = []
    if predicted > budget:
        problems.append(f"plan above budget ({predicted} > {budget} B)")
    if row["grad_err"] > threshold:
        problems.append(f"gradients differ from eager (rel err {row['grad_err']:.2e} > {threshold:g})")
    if row["buffer_err"] > threshold:
        problems.append(f"buffers differ from eager (rel err {row['buffer_err']:.2e})")
    if abs(row["diff_bytes"]) > PEAK_TOLERANCE * row["predicted_bytes"]:
        problems.append(f"measured peak {row['diff_bytes']:+d} B off the prediction "
                        f"({100 * row['diff_bytes'] / row['predicted_bytes']:+.2f}%)")
    row["status"] = "fails" if problems else "holds"
    row["reason"] = "; ".join(problems)
    if not problems and extra_percent > 100:  # holds, but say what it costs
        row["reason"] = (f"(holds; plan quality: {extra_percent:.0f}% extra compute, "
                         f"{message.split(';')[0].split(': ', 1)[-1]})")
    return row


def _eager_runtime(row: dict[str, Any], spec: Spec, model: nn.Module, args: tuple, kwargs: dict, budget: int,
                   ref_grads: dict, ref_buffers: dict, start_buffers: dict, time_limit: float,
                   report: Callable[[str], None]) -> dict[str, Any]:
    """`run_one`'s stages after the budget, for the eager runtime: checkpoint a copy of
    ``model`` in place with ``apply_checkpointing``, step it against eager, measure its peak."""
    stage = "apply_checkpointing"
    try:
        report(stage)
        start = time.perf_counter()
        _restore(model, start_buffers)
        checkpointed = copy.deepcopy(model)
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                plan = apply_checkpointing(checkpointed, args, kwargs, budget=budget, compare=False,
                                           time_limit=time_limit)
        except InfeasibleBudgetError as err:
            row["plan_s"] = time.perf_counter() - start
            row["status"] = "refused"
            smallest = err.smallest_feasible_bytes
            above = (f", leanest plan found {smallest:,} B (+{100 * (smallest - budget) / budget:.1f}%)"
                     if smallest else "")
            row["reason"] = f"InfeasibleBudgetError{above}: {str(err).splitlines()[0][:200]}"
            return row
        row["plan_s"] = time.perf_counter() - start
        row.update(predicted_bytes=plan.predicted_peak_bytes, plan_status=plan.plan.status,
                   extra_percent=plan.plan.extra_percent, message=plan.plan.message,
                   regions=len(plan.regions))

        stage = "checkpointed step"
        report(stage)
        _step_against_eager(row, checkpointed, checkpointed, args, kwargs, ref_grads, ref_buffers, start_buffers)

        stage = "measure"
        report(stage)
        gc.collect()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            row["measured_bytes"] = measure_step(checkpointed, args, kwargs, warmup=0, repeats=1).peak_bytes
        return _check(row, spec, budget, plan.predicted_peak_bytes, plan.plan.extra_percent, plan.plan.message)
    except Exception as err:  # noqa: BLE001 - every failure is a row of the table
        row["status"] = "fails"
        row["reason"] = f"{stage}: {_first_line(err)}"
        row["traceback"] = traceback.format_exc()[-4000:]
        return row


def _child(spec: Spec, time_limit: float, conn, runtime: str = "graph") -> None:
    torch.set_num_threads(1)
    start = time.perf_counter()
    try:
        row = run_one(spec, time_limit, lambda stage: conn.send(("stage", stage, time.perf_counter() - start)),
                      runtime)
        conn.send(("row", row))
    finally:
        conn.close()


def run_isolated(spec: Spec, time_limit: float, timeout: float, runtime: str = "graph") -> dict[str, Any]:
    """`run_one` in a forked child (imports are paid once, in the parent) killed at ``timeout``."""
    ctx = multiprocessing.get_context("fork")
    parent, child = ctx.Pipe(duplex=False)
    start = time.perf_counter()
    proc = ctx.Process(target=_child, args=(spec, time_limit, child, runtime))
    proc.start()
    child.close()
    row, stage, stages = None, "start", {}
    while row is None:
        left = timeout - (time.perf_counter() - start)
        if left <= 0 or not parent.poll(left):
            break
        try:
            message = parent.recv()
        except EOFError:
            break
        if message[0] == "stage":
            stage, stages[message[1]] = message[1], message[2]
        else:
            row = message[1]
    proc.join(5)
    if proc.is_alive():
        proc.kill()
        proc.join()
    wall = time.perf_counter() - start
    if row is None:
        base = {"name": spec.name, "family": spec.family, "library": spec.library,
                "dtype": str(spec.dtype).replace("torch.", ""), "note": spec.note, "status": "fails"}
        if wall >= timeout:
            base["reason"] = (f"{stage}: timeout: no result within {timeout:.0f} s ({stage} began at "
                              f"{stages.get(stage, 0):.0f} s)")
        else:
            base["reason"] = f"{stage}: crash: the child exited with code {proc.exitcode}"
        row = base
    row["wall_s"] = wall
    row["stage_start_s"] = stages
    return row


# ------------------------------------------------------------------------------ report
def _cell(value, fmt: str = "{}") -> str:
    return "" if value is None else fmt.format(value)


def table(rows: list[dict[str, Any]]) -> str:
    lines = ["| model | library | family | dtype | fx nodes | status | grad rel err | store-all | "
             "budget | predicted | measured | diff B | extra compute | plan s | reason |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(
            f"| {r['name']} | {r['library']} | {r['family']} | {r['dtype']} | "
            f"{_cell(r.get('fx_nodes'))} | **{r['status']}** | {_cell(r.get('grad_err'), '{:.1e}')} | "
            f"{_cell(r.get('store_all_bytes'), '{:,}')} | {_cell(r.get('budget_bytes'), '{:,}')} | "
            f"{_cell(r.get('predicted_bytes'), '{:,}')} | {_cell(r.get('measured_bytes'), '{:,}')} | "
            f"{_cell(r.get('diff_bytes'), '{:+,}')} | {_cell(r.get('extra_percent'), '{:.1f}%')} | "
            f"{_cell(r.get('plan_s'), '{:.1f}')} | {r.get('reason', '').replace('|', '/')} |")
    return "\n".join(lines)


def failures_by_cause(rows: list[dict[str, Any]]) -> str:
    groups: dict[str, list[str]] = defaultdict(list)
    for r in rows:
        if r["status"] == "fails":
            groups[r["reason"]].append(r["name"])
    if not groups:
        return "No failures."
    return "\n".join(f"- {', '.join(names)}: {reason}" for reason, names in sorted(groups.items()))


def versions() -> str:
    import importlib.metadata

    def version(name: str) -> str:
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            return "not installed"
    return f"torch {torch.__version__}, timm {version('timm')}, transformers {version('transformers')}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", help="write the Markdown report here")
    parser.add_argument("--json", help="write the rows (with tracebacks) here")
    parser.add_argument("--only", help="comma-separated model names")
    parser.add_argument("--time-limit", type=float, default=60.0,
                        help="solver time limit, s (optimize's default: 60)")
    parser.add_argument("--timeout", type=float, default=300.0, help="per-model wall limit, s")
    parser.add_argument("--runtime", choices=("graph", "eager"), default="graph",
                        help="plan with optimize (graph, default) or apply_checkpointing (eager)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    try:
        import timm  # noqa: F401 - imported once here, before the children fork
    except ImportError:  # torch 2.13.0: no torchvision pairs with it, so no timm; --only the transformers rows
        pass
    import transformers
    transformers.logging.set_verbosity_error()
    specs = SPECS
    if args.only:
        wanted = args.only.split(",")
        unknown = set(wanted) - {s.name for s in SPECS}
        if unknown:
            parser.error(f"unknown models: {sorted(unknown)}")
        specs = tuple(s for s in SPECS if s.name in wanted)
    start = time.perf_counter()
    rows = []
    for spec in specs:
        row = run_isolated(spec, args.time_limit, args.timeout, args.runtime)
        rows.append(row)
        print(f"{row['name']:32s} {row['status']:6s} {row['wall_s']:6.1f}s "
              f"err={_cell(row.get('grad_err'), '{:.1e}')} pred={row.get('predicted_bytes')} "
              f"meas={row.get('measured_bytes')} {row.get('reason', '')}", flush=True)
    total = time.perf_counter() - start
    held = sum(r["status"] == "holds" for r in rows)
    refused = sum(r["status"] == "refused" for r in rows)
    command = "python benchmarks/coverage.py " + " ".join(sys.argv[1:])
    eager = args.runtime == "eager"
    header = (
        f"# Coverage sweep{' of the eager runtime' if eager else ''}: {len(rows)} architectures at 60% of "
        f"activations\n\n"
        f"Command: `{command}` ({total / 60:.1f} min). {versions()}; "
        f"{platform.machine()}, {os.cpu_count()} cores (shared), one intra-op thread; "
        f"solver `auto`, {args.time_limit:g} s limit; {time.strftime('%Y-%m-%d %H:%M %Z')}.\n\n"
        f"**{held} of {len(rows)} hold ({100 * held / max(1, len(rows)):.0f}%)"
        + (f", {refused} refused with a clear error" if eager else "") + ".** Budget = fixed + "
        f"0.6 x (store-all peak - fixed), fixed = parameters + gradients + inputs. Holds: plan <= "
        f"budget, gradients and buffers within 1e-8 of eager (float64; 1e-4 for float32 rows), "
        f"|measured - predicted| <= {100 * PEAK_TOLERANCE:g}% of predicted. Bytes are exact; "
        + ("\"plan s\" is apply_checkpointing's whole call (capture, option timing, search); *refused*: "
           "InfeasibleBudgetError, nothing applied; "
           if eager else "\"plan s\" is capture + solve + rewrite; ")
        + "\"fx nodes\": nodes of the captured joint "
        f"(forward + backward) graph; \"extra compute\": recomputation as % of a plain step's "
        f"modelled time (`flops` cost model{', and the eager runtime timing its options' if eager else ''}).\n\n")
    notes = [f"- {r['name']}: {r['note']}" for r in rows if r.get("note")]
    report = (header + table(rows) + "\n\nFailures by cause:\n\n" + failures_by_cause(rows) + "\n"
              + ("\nNotes:\n\n" + "\n".join(notes) + "\n" if notes else ""))
    print(report)
    if args.out:
        with open(args.out, "w") as fh:
            fh.write(report)
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(rows, fh, indent=1, default=str)


if __name__ == "__main__":
    main()
