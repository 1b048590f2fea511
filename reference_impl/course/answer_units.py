"""The exercises the answer finder tries shipped functions on: each a function of plain inputs,
with the inputs it is tried on (sizes that divide and that do not, the graded checks' ranges).

A unit's expected results are the reference's, computed where the kit is (never shipped). A
unit's ``recorded`` snapshot keys hold its own results, shipped by design so that checks read
numbers instead of an algorithm; a function that only looks them up is not counted as an
answer (the finder hides them from the functions it tries).
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Callable

import torch


@dataclass(frozen=True)
class Unit:
    lab: str
    name: str  # the exercise, as the notebook names it
    reference: Callable  # the reference, called with each of ``draws``
    draws: list[tuple]
    recorded: tuple[tuple[str, str], ...] = ()  # (lab, snapshot key) of its own results
    renderings: Callable | None = None  # result -> texts that state it (for tables)
    tables: bool = field(default=False)  # whether a literal equal to a result is an answer


def _schedule_texts(schedule) -> list[str]:
    return [schedule.format(rank) for rank in range(schedule.ranks)]


def _zero_shard(tensor, member, members):
    from reference_impl.hybrid.zero import _ShardedParameter
    owner = _ShardedParameter(torch.nn.Parameter(tensor.clone()), members, member)
    return owner.my_slice(tensor)


def _partials(seed: int):
    generator = torch.Generator().manual_seed(seed)
    out1, out2 = (torch.randn(2, 3, 5, 4, generator=generator) for _ in range(2))
    lse1, lse2 = (torch.randn(2, 3, 5, generator=generator) for _ in range(2))
    lse2[0, 0, 0] = float("-inf")
    return out1, lse1, out2, lse2


def units() -> list[Unit]:
    """Every unit the finder tries (imports the reference lazily: only where the kit is)."""
    from reference_impl.comm import alpha_beta
    from reference_impl.comm.expert_groups import expert_parallel_groups
    from reference_impl.cp.load_balance import chunks_of_rank, token_positions, visible_part
    from reference_impl.cp.online_softmax import merge_partials
    from reference_impl.moe.router import keep_within_capacity
    from reference_impl.perf import capacity
    from reference_impl.pipeline.pipeline_schedules import gpipe, one_f_one_b
    from reference_impl.tp.tp_layers import shard

    sizes = [(p, m) for p in range(1, 7) for m in range(1, 11)]
    links = [(2.0 ** 20, 4, 5e-6, 1e11), (3e6, 8, 1e-5, 2.5e10), (1e3, 2, 2e-6, 5e10)]
    pipelines = [(4, 8), (4, 8, 2), (8, 32, 1), (3, 7), (2, 4, 4)]
    groups = [([list(range(8))], 2), ([[0, 2, 4, 6], [1, 3, 5, 7]], 4),
              ([[5, 1, 3], [0, 4, 2]], 3)]
    experts = [(torch.tensor([[0, 1], [0, 2], [0, 1], [2, 0]]), 3, 2),
               (torch.tensor([[1], [1], [1], [0], [1]]), 2, 3)]
    return [
        Unit("lab0", "ring_all_reduce_seconds", alpha_beta.ring_all_reduce_seconds, links),
        Unit("lab0", "recursive_doubling_seconds", alpha_beta.recursive_doubling_seconds, links),
        Unit("lab0", "crossover_bytes", alpha_beta.crossover_bytes, [d[1:] for d in links]),
        Unit("lab2", "shard", shard, [(torch.arange(24.).reshape(4, 6), 1, 1, 3),
                                      (torch.arange(24.).reshape(4, 6), 0, 3, 4),
                                      (torch.arange(36.).reshape(6, 6), 0, 1, 2, 3)]),
        Unit("lab4", "gpipe", gpipe, sizes, recorded=(("lab4", "orders"),),
             renderings=_schedule_texts, tables=True),
        Unit("lab4", "one_f_one_b", one_f_one_b, sizes, recorded=(("lab4", "orders"),),
             renderings=_schedule_texts, tables=True),
        Unit("lab5", "my_slice", _zero_shard, [(torch.arange(10.), 1, 4), (torch.ones(3, 3), 2, 2),
                                               (torch.arange(7.), 0, 3)],
             recorded=(("lab5", "owners"),)),
        Unit("lab7", "bubble_fraction", capacity.bubble_fraction, pipelines),
        Unit("lab7", "in_flight_microbatches", capacity.in_flight_microbatches, pipelines),
        Unit("lab7", "pipeline_seconds", capacity.pipeline_seconds,
             [(0.25, *draw) for draw in pipelines]),
        Unit("lab7", "tp_all_reduce_bytes_per_layer", capacity.tp_all_reduce_bytes_per_layer,
             [(1, 2048, 4096), (4, 1024, 8192, 4), (2, 512, 1024, 1)]),
        Unit("lab7", "tp_seconds_per_layer", capacity.tp_seconds_per_layer,
             [(1, 2048, 4096, 8, 5e-6, 1e11), (4, 1024, 8192, 4, 1e-5, 5e10, 4),
              (2, 512, 1024, 1, 2e-6, 2e10)]),
        Unit("lab7", "model_state_bytes_per_parameter", capacity.model_state_bytes_per_parameter,
             [(0, 8), (1, 8), (2, 4), (3, 16), (1, 3, "megatron")]),
        Unit("lab8", "chunks_of_rank", chunks_of_rank,
             [(cp, rank) for cp in (1, 2, 3, 4, 8) for rank in range(cp)],
             recorded=(("lab8", "chunks"),)),
        Unit("lab8", "token_positions", token_positions,
             [(2 * cp * chunk, cp, rank) for cp, chunk in ((2, 2), (3, 1), (4, 3))
              for rank in range(cp)], recorded=(("lab8", "layouts"),), tables=True),
        Unit("lab8", "visible_part", visible_part,
             [(cp, rank, owner, local) for cp, local in ((2, 4), (3, 2), (4, 6))
              for rank, owner in itertools.product(range(cp), repeat=2)],
             recorded=(("lab8", "visible"),)),
        Unit("lab8", "merge_partials", merge_partials, [_partials(seed) for seed in range(3)]),
        Unit("lab9", "keep_within_capacity", keep_within_capacity, experts),
        Unit("lab9", "expert_parallel_groups", expert_parallel_groups, groups),
    ]
