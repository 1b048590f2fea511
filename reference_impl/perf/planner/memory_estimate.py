"""Memory per GPU of a layout, on the pipeline stage that needs most: the peak of PyTorch's
caching allocator, ``torch.cuda.max_memory_reserved`` (what torchtitan logs as "memory").

Model states (``framework_memory``), activations per layer (``layer_activations``, Korthikanti
et al. 2022) times the microbatches in flight, the loss and the blocks it strands, and
fragmentation; the CUDA context and NCCL's buffers come off the GPU's memory instead
(``Cluster.usable_bytes``). Term by term: docs/library.md, 'The planner's model, term by term'.
"""
from __future__ import annotations

from dataclasses import dataclass

from reference_impl.perf.capacity import in_flight_microbatches  # lab 7's term
from reference_impl.perf.planner.framework_memory import model_state_bytes
from reference_impl.perf.planner.layer_activations import activation_bytes, op_sac_bytes
from reference_impl.perf.planner.layout import Layout, first_stage_layers
from reference_impl.perf.planner.model_spec import ModelSpec


@dataclass(frozen=True)
class MemoryEstimate:
    stage: str                 # "first" or "last": the stage that needs most
    params_per_gpu: float
    model_state_bytes: float
    activation_per_layer_bytes: float
    layers_per_stage: int
    in_flight: float
    activation_bytes: float    # kept for the backward, every layer and microbatch in flight
    logits_bytes: float        # the loss's peak (the last stage)
    rebuilt_bytes: float = 0.0     # one layer rebuilt during its backward (recomputation)
    allocator_bytes: float = 0.0   # reserved but not allocated: blocks the loss strands
    fragmentation_bytes: float = 0.0  # reserved but not allocated: the activations' share

    @property
    def transient_bytes(self) -> float:
        """The larger of the loss's peak and a layer's rebuild (they do not overlap)."""
        return max(self.logits_bytes + self.allocator_bytes, self.rebuilt_bytes)

    @property
    def allocated_bytes(self) -> float:
        """The peak of ``torch.cuda.max_memory_allocated``: no stranded or fragmented blocks."""
        return (self.model_state_bytes + self.activation_bytes
                + max(self.logits_bytes, self.rebuilt_bytes))

    @property
    def total_bytes(self) -> float:
        """The reserved peak (``torch.cuda.max_memory_reserved``)."""
        return (self.model_state_bytes + self.activation_bytes + self.fragmentation_bytes
                + self.transient_bytes)


def activation_per_layer(model: ModelSpec, layout: Layout, recompute: str | None) -> float:
    sp = layout.sequence_parallel and layout.tp > 1
    s = model.seq_len // layout.cp
    if recompute == "selective" and layout.accounting == "fsdp":
        return op_sac_bytes(model, s, layout.micro_batch, layout.tp, sp)
    return activation_bytes(model, s, layout.micro_batch, layout.tp, sp, recompute,
                            layout.attention)


def rebuilt_layer_bytes(model: ModelSpec, layout: Layout) -> float:
    """One layer's activations rebuilt at a time in the backward: all of them under full
    recomputation; under torchtitan's op-level policy, those it did not keep; Megatron's
    selective recomputation rebuilds only the attention core (left out, as the paper does)."""
    if layout.recompute == "full":
        return activation_per_layer(model, layout, None)
    if layout.recompute == "selective" and layout.accounting == "fsdp":
        return (activation_per_layer(model, layout, None)
                - activation_per_layer(model, layout, "selective"))
    return 0.0


def logit_elements(model: ModelSpec, layout: Layout) -> float:
    """Logits one rank holds for a microbatch: s/cp tokens x b x V/t (vocabulary-parallel)."""
    return (model.seq_len // layout.cp) * layout.micro_batch * model.vocab / layout.tp


def cross_entropy_bytes(model: ModelSpec, layout: Layout) -> float:
    """The loss's peak. Megatron-LM's fused vocabulary-parallel cross-entropy works in one fp32
    copy of the logits, 4 bytes each (Korthikanti et al. 2022, section 4.2.2). torchtitan's
    eager loss, ``cross_entropy(pred.float())``, holds three fp32 tensors of the logits' size
    at its backward: the log-softmax output it saved, NLL's gradient, and log-softmax's
    gradient, 12 bytes each (the bf16 logits are freed before the backward: ``del pred``)."""
    per_element = 12 if layout.accounting == "fsdp" else 4
    return per_element * logit_elements(model, layout)


FRAGMENTATION = 0.03


def fragmentation_bytes(activations: float) -> float:
    """Reserved memory the activations' many short-lived blocks leave free but split, a share
    ``FRAGMENTATION`` of them: the mechanism the ZeRO paper describes (Rajbhandari et al. 2020,
    section 3.2, interleaved short- and long-lived tensors) and PyTorch's caching allocator
    shows as reserved minus allocated (PyTorch docs, "CUDA semantics: memory management").
    The 3% is an assumption, not a measurement (see docs/library.md)."""
    return FRAGMENTATION * activations


def stranded_logits_bytes(model: ModelSpec, layout: Layout) -> float:
    """Reserved memory the loss leaves unusable under PyTorch's caching allocator (PyTorch docs,
    "CUDA semantics: memory management"): torchtitan frees the bf16 logits (2 bytes each)
    before the backward asks for fp32 tensors twice their size, which that block cannot hold,
    so it stays reserved beside them. Megatron-LM's fused loss strands none."""
    return 2 * logit_elements(model, layout) if layout.accounting == "fsdp" else 0.0


def estimate_memory(model: ModelSpec, layout: Layout, microbatches: int) -> MemoryEstimate:
    tp, pp, shards = layout.tp, layout.pp, layout.dp * layout.cp
    per_stage = first_stage_layers(model, layout)
    expert_params = model.expert_params_per_layer / (tp * layout.ep)  # one layer's, this GPU's
    layer_params = (model.params_per_layer - model.expert_params_per_layer) / tp + expert_params
    experts_on_stage = per_stage * expert_params
    vocab_params = model.vocab * model.hidden / tp
    head = 0 if model.tied_embeddings and pp == 1 else vocab_params
    first = per_stage * layer_params + vocab_params + (head if pp == 1 else 0)
    last = per_stage * layer_params + head if pp > 1 else first

    per_layer = activation_per_layer(model, layout, layout.recompute)
    in_flight = in_flight_microbatches(pp, microbatches, layout.v)
    rebuilt = rebuilt_layer_bytes(model, layout)
    logits = cross_entropy_bytes(model, layout)
    stranded = stranded_logits_bytes(model, layout)

    def states(params, root):
        if not experts_on_stage:
            return model_state_bytes(params, shards, layout.zero, layout.accounting,
                                     layer_params, root)
        return (model_state_bytes(params - experts_on_stage, shards, layout.zero,
                                  layout.accounting, layer_params, root)
                + model_state_bytes(experts_on_stage, shards // layout.ep, layout.zero,
                                    layout.accounting))

    first_root = vocab_params + (head if pp == 1 else 0)
    first_estimate = MemoryEstimate(
        "first", first, states(first, first_root), per_layer, per_stage, in_flight,
        per_layer * per_stage * in_flight, logits if pp == 1 else 0.0, rebuilt,
        stranded if pp == 1 else 0.0, fragmentation_bytes(per_layer * per_stage * in_flight))
    if pp == 1:
        return first_estimate
    last_estimate = MemoryEstimate(  # the last stage: one microbatch in flight
        "last", last, states(last, head), per_layer, per_stage, 1.0, per_layer * per_stage,
        logits, rebuilt, stranded, fragmentation_bytes(per_layer * per_stage))
    return max(first_estimate, last_estimate, key=lambda estimate: estimate.total_bytes)
