"""Memory per GPU of a layout, on the pipeline stage that needs most.

* model states: :func:`framework_memory.model_state_bytes` on the stage's parameters (its layers
  / tp, the embedding on the first stage, the LM head on the last), sharded over dp x cp; with
  experts, a layer's experts are split over the EP group too (E / ep per rank, / tp each) and
  their states sharded over the dp x cp / ep ranks holding the same experts (Megatron-core's
  expert-data-parallel group);
* activations per layer: Korthikanti et al. 2022's count with the layer's real shapes (the
  MLP's width, a gated MLP, the key/value heads: :func:`layer_activations.activation_bytes`)
  on the s/cp tokens a CP rank holds; no 1-byte dropout masks for models without dropout
  (Llama); with flash attention no s x s term (the kernel keeps one fp32 log-sum-exp per row
  and head);
* layers per stage: ceil(L/pp) on the first, one fewer with the embedding counted in the split
  (``layout.first_stage_layers``);
* in flight on the first stage: 1F1B holds min(pp, m) microbatches; the interleaved schedule
  a factor 1 + (pp-1)/(pp v) more (Korthikanti et al. 2022, section 4.2.3); full recomputation
  keeps each layer's input and rebuilds one layer at a time (+ one layer's activations);
* the logits on the last stage: 4 s b V / t bytes (fp32, vocabulary-parallel cross-entropy),
  one microbatch at a time.
"""
from __future__ import annotations

from dataclasses import dataclass

from reference_impl.perf.planner.framework_memory import model_state_bytes
from reference_impl.perf.planner.layer_activations import activation_bytes
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
    activation_bytes: float
    logits_bytes: float

    @property
    def total_bytes(self) -> float:
        return self.model_state_bytes + self.activation_bytes + self.logits_bytes


def in_flight_microbatches(pp: int, microbatches: int, v: int) -> float:
    """Microbatches whose activations the first stage holds at once (module docstring)."""
    held = min(pp, microbatches)
    return held * (1 + (pp - 1) / (pp * v)) if v > 1 else held


def activation_per_layer(model: ModelSpec, layout: Layout, recompute: str | None) -> float:
    sp = layout.sequence_parallel and layout.tp > 1
    return activation_bytes(model, model.seq_len // layout.cp, layout.micro_batch, layout.tp,
                            sp, recompute, layout.attention)


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
    activations = per_layer * per_stage * in_flight
    if layout.recompute == "full":  # one layer rebuilt at a time during its backward
        activations += activation_per_layer(model, layout, None)
    logits = 4 * (model.seq_len // layout.cp) * layout.micro_batch * model.vocab / tp

    def states(params):
        if not experts_on_stage:
            return model_state_bytes(params, shards, layout.zero, layout.accounting, layer_params)
        return (model_state_bytes(params - experts_on_stage, shards, layout.zero,
                                  layout.accounting, layer_params)
                + model_state_bytes(experts_on_stage, shards // layout.ep, layout.zero,
                                    layout.accounting))

    first_total = states(first) + activations + (logits if pp == 1 else 0)
    last_total = states(last) + per_layer * per_stage + logits  # the last stage: 1 in flight
    if pp == 1 or first_total >= last_total:
        return MemoryEstimate("first", first, states(first), per_layer, per_stage, in_flight,
                              activations, logits if pp == 1 else 0.0)
    last_activations = per_layer * per_stage + (activations - per_layer * per_stage * in_flight)
    return MemoryEstimate("last", last, states(last), per_layer, per_stage, 1.0,
                          last_activations, logits)
