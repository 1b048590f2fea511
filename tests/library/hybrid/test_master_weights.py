"""bf16 parameters with fp32 masters (reference_impl/model/master_weights.py) against the same steps
done by hand: the fp32 gradient sums and the masters after AdamW are bit-identical (same
operations in the same order), and each bf16 parameter is its master rounded."""
import copy

import pytest
import torch

from reference_impl.model.master_weights import MasterWeights
from reference_impl.model import GPT, ModelConfig

CONFIG = ModelConfig(vocab_size=64, seq_len=16, hidden=32, heads=2, layers=2)


def batches(steps: int, micro: int):
    generator = torch.Generator().manual_seed(1)
    return [[torch.randint(CONFIG.vocab_size, (2, CONFIG.seq_len + 1), generator=generator)
             for _ in range(micro)] for _ in range(steps)]


def loss_of(model, data):
    logits = model(data[:, :-1]).float()
    return torch.nn.functional.cross_entropy(logits.flatten(0, 1), data[:, 1:].flatten())


@pytest.mark.parametrize("micro", [1, 3])
def test_masters_and_gradients_match_the_steps_done_by_hand(micro):
    torch.manual_seed(0)
    model = GPT(CONFIG)
    by_hand = copy.deepcopy(model).to(torch.bfloat16)
    masters = [p.detach().clone() for p in model.parameters()]
    adam = torch.optim.AdamW(masters, lr=1e-2, foreach=False)
    wrapped = MasterWeights(model, lambda m: torch.optim.AdamW(m, lr=1e-2, foreach=False))
    for step, micro_batches in enumerate(batches(3, micro)):
        wrapped.zero_grad()
        sums = [torch.zeros_like(m) for m in masters]
        for data in micro_batches:
            loss_of(model, data).backward()
            by_hand.zero_grad(set_to_none=True)
            loss_of(by_hand, data).backward()
            for total, p in zip(sums, by_hand.parameters()):
                total.add_(p.grad)  # fp32 sum of the bf16 gradients
        assert all(p.grad is None for p in model.parameters()), "a bf16 gradient was kept"
        for name_grad, total in zip(wrapped.main_grads, sums):
            assert torch.equal(name_grad, total), f"step {step}: fp32 gradient sums differ"
        for master, total in zip(masters, sums):
            master.grad = total
        adam.step()
        wrapped.step()
        with torch.no_grad():
            for p, master in zip(by_hand.parameters(), masters):
                p.copy_(master)
        for (name, p), ours, theirs in zip(model.named_parameters(), wrapped.masters, masters):
            assert p.dtype == torch.bfloat16, name
            assert torch.equal(ours, theirs), f"step {step}: master of {name} differs"
            assert torch.equal(p, theirs.to(torch.bfloat16)), f"step {step}: {name} is not its master rounded"


def test_zero_grad_clears_the_fp32_sums_in_place():
    model = GPT(CONFIG)
    wrapped = MasterWeights(model, lambda m: torch.optim.AdamW(m, lr=1e-3))
    buffers = [g.data_ptr() for g in wrapped.main_grads]
    loss_of(model, batches(1, 1)[0][0]).backward()
    assert any(g.abs().sum() > 0 for g in wrapped.main_grads)
    wrapped.zero_grad()
    assert all(not g.any() for g in wrapped.main_grads)
    assert [g.data_ptr() for g in wrapped.main_grads] == buffers


def test_a_model_that_is_not_fp32_is_refused_by_name():
    model = GPT(CONFIG).to(torch.bfloat16)
    with pytest.raises(ValueError, match="takes an fp32 model.*bfloat16"):
        MasterWeights(model, lambda m: torch.optim.AdamW(m))
