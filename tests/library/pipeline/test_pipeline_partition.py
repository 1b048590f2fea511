"""Stage partitions: contiguous, balanced (the largest stage as small as any cut allows), or
the cut points given; and the course GPT as a flat list of layers."""
from itertools import combinations
import random

import pytest
import torch
from torch import nn

from reference_impl.model import GPT, ModelConfig
from reference_impl.pipeline.pipeline_partition import gpt_layers, layer_sizes, partition


def largest_stage(sizes, stages):
    return max(sum(sizes[i] for i in stage) for stage in stages)


@pytest.mark.parametrize("sizes, p, expected", [
    ([1] * 8, 4, [range(0, 2), range(2, 4), range(4, 6), range(6, 8)]),
    ([5, 1, 1, 1, 1, 1], 2, [range(0, 1), range(1, 6)]),
    ([1, 1, 1, 1, 1, 5], 2, [range(0, 5), range(5, 6)]),
    ([3, 1, 1, 1, 3], 3, [range(0, 1), range(1, 4), range(4, 5)]),
    ([7, 2, 9], 1, [range(0, 3)]),
    ([4, 4, 4], 3, [range(0, 1), range(1, 2), range(2, 3)]),
])
def test_balanced_partitions(sizes, p, expected):
    assert partition(sizes, p) == expected


def test_largest_stage_is_as_small_as_any_cut_allows():
    generator = random.Random(0)
    for _ in range(200):
        n = generator.randint(1, 8)
        sizes = [generator.randint(0, 20) for _ in range(n)]
        p = generator.randint(1, n)
        stages = partition(sizes, p)
        assert [i for stage in stages for i in stage] == list(range(n))  # contiguous, in order
        assert len(stages) == p and all(len(stage) > 0 for stage in stages)
        best = min(largest_stage(sizes, partition(sizes, p, list(cuts)))
                   for cuts in combinations(range(1, n), p - 1))
        assert largest_stage(sizes, stages) == best, (sizes, p)


def test_given_cut_points_are_used():
    assert partition([1] * 8, 3, cut_points=[2, 5]) == [range(0, 2), range(2, 5), range(5, 8)]
    assert partition([1, 2], 1, cut_points=[]) == [range(0, 2)]


@pytest.mark.parametrize("sizes, p, cuts, message", [
    ([1, 1, 1], 4, None, "cannot split 3 layers into 4 stages"),
    ([1, 1, 1], 0, None, "the number of stages p must be an integer >= 1, got 0"),
    ([1, -2, 1], 2, None, r"layer costs must be >= 0, got \[1, -2, 1\]"),
    ([1] * 8, 3, [4], r"3 stages need 2 cut points, got 1: \[4\]"),
    ([1] * 8, 3, [5, 2], r"strictly increasing integers between 1 and 7 .*got \[5, 2\]"),
    ([1] * 8, 3, [0, 4], r"got \[0, 4\]"),
    ([1] * 8, 3, [4, 8], r"got \[4, 8\]"),
    ([1] * 8, 3, [2, 2], r"got \[2, 2\]"),
    ([1] * 8, 2, [2.5], r"got \[2.5\]"),
])
def test_bad_partitions_are_refused(sizes, p, cuts, message):
    with pytest.raises(ValueError, match=message):
        partition(sizes, p, cuts)


def test_layer_sizes_count_parameters():
    assert layer_sizes([nn.Linear(3, 4), nn.LayerNorm(5), nn.GELU()]) == [16, 10, 0]


def test_gpt_as_layers_computes_the_same_and_shares_its_parameters():
    torch.manual_seed(0)
    config = ModelConfig(layers=3)
    gpt = GPT(config)
    layers = gpt_layers(gpt)
    assert len(layers) == config.layers + 2
    tokens = torch.randint(0, config.vocab_size, (2, config.seq_len))
    assert torch.equal(nn.Sequential(*layers)(tokens), gpt(tokens))
    assert sum(layer_sizes(layers)) == sum(p.numel() for p in gpt.parameters())
    assert layers[0].token_embedding.weight is gpt.token_embedding.weight
    stages = partition(layer_sizes(layers), 2)
    assert [i for stage in stages for i in stage] == list(range(len(layers)))
    x = tokens
    for stage in stages:  # running the stages one after another is the whole model
        x = nn.Sequential(*(layers[i] for i in stage))(x)
    assert torch.equal(x, gpt(tokens))
