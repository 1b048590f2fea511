"""The data-parallel kinds (``hybrid/dp_kinds/``) as one registry, FSDP2 (``fully_shard``)
against one device and against the kit's ZeRO-3, and sharded checkpoints
(``hybrid/checkpoint.py``) resumed under another data-parallel layout.

Tolerances: fp32 on CPU, every kind only reorders additions, so losses and weights agree with
single-device training to 1e-5 (``support/training.py``'s ATOL; observed 4.8e-7), and FSDP2
with ZeRO-3 to the same. A resumed run's losses match the uninterrupted run's to 1e-5.
"""
import pytest
import torch

from reference_impl import train
from reference_impl.checks import assert_close
from reference_impl.hybrid import parallel_gpt as hybrid
from reference_impl.hybrid.dp_kinds.kind import DataParallelKind
from reference_impl.hybrid.dp_kinds.registry import KINDS, kind_of
from reference_impl.hybrid.training_plan import TrainingPlan
from reference_impl.hybrid.parallelize import build_optimizer, parallelize_gpt
from reference_impl.hybrid.zero import padded_numel
from reference_impl.memory.model_states import zero_memory_formula
from reference_impl.model import GPT, ModelConfig
from support.training import ATOL, assert_the_trainer_trains_as_one_device, make_optimizer

TINY = ["--layers", "2", "--hidden", "16", "--heads", "2", "--seq", "8", "--vocab", "30",
        "--batch", "8", "--adam-eps", "1e-4", "--lr", "1e-2"]


def test_every_kind_is_in_the_registry_under_its_name_and_the_trainer_offers_them_all():
    assert set(KINDS) == {"sync", "ddp_hooks", "zero1", "zero2", "zero3", "fsdp2"}
    for name, kind in KINDS.items():
        assert isinstance(kind, DataParallelKind) and kind.name == name
    assert train.parse_args(["--dp-kind", "fsdp2"]).dp_kind == "fsdp2"
    with pytest.raises(ValueError, match="dp_kind must be one of sync, ddp_hooks, zero1, zero2, "
                                         "zero3, fsdp2, got 'fsdp3'"):
        kind_of("fsdp3")


@pytest.mark.parametrize("name", [name for name, kind in KINDS.items() if kind.reduces_in_hooks])
def test_kinds_that_reduce_in_hooks_refuse_a_split_backward(name):
    with pytest.raises(ValueError, match=f"dp_kind {name} with the zb-h1 schedule"):
        TrainingPlan(dp=2, pp=2, dp_kind=name, schedule="zb-h1")


@pytest.mark.parametrize("flags", [
    "--dp 2 --tp 2 --sp --recompute full",
    "--dp 2 --pp 2 --schedule interleaved --chunks 2 --microbatches 2 --layers 4",
    "--model llama --dp 2 --cp 2 --dtype bf16",
])
def test_fsdp2_trains_as_one_device(flags):
    argv = [*TINY, *flags.split(), "--dp-kind", "fsdp2", "--steps", "3"]
    if "bf16" in flags:  # bf16 against bf16 on one device: the trainer's own check is fp32's
        result = train.main(argv)
        losses, _ = train.train_one_device(train.parse_args(argv))
        assert_close(torch.tensor(result["losses"]), torch.tensor(losses),
                     f"fsdp2 {flags}: the losses", atol=2e-2 * max(losses), rtol=0)
    else:
        assert_the_trainer_trains_as_one_device(argv, f"fsdp2 {flags}")


CONFIG = ModelConfig(vocab_size=30, seq_len=8, hidden=16, heads=2, layers=2)


def fsdp2_and_zero3_on_rank(gpt, dataset):
    """The same 3 steps under fsdp2 and zero3 (dp 2): losses, gathered weights, and FSDP2's
    model-state bytes on this rank after the last step (gradients still held)."""
    results = {}
    for kind in ("fsdp2", "zero3"):
        plan = TrainingPlan(dp=2, dp_kind=kind)
        model = parallelize_gpt(gpt, plan, plan.dims.build())
        optimizer = build_optimizer(model, make_optimizer("adam")(model.parameters()))
        losses = []
        for tokens, targets in dataset:
            losses.append(hybrid.train_step(model, tokens, targets, optimizer).item())
        if kind == "fsdp2":
            held = [p.to_local() for p in model.parameters()]
            held += [p.grad.to_local() for p in model.parameters()]
            held += [value.to_local() for state in optimizer.state.values()
                     for key, value in state.items() if key != "step"]
            memory = sum(t.numel() * t.element_size() for t in held)
        results[kind] = (losses, hybrid.gather_full_state(model))
    return results, memory


def test_fsdp2_matches_the_kits_zero3_and_its_memory_formula(run_on_ranks):
    torch.manual_seed(0)
    gpt = GPT(CONFIG)
    dataset = hybrid.make_dataset(0, 3, 8, CONFIG.seq_len, CONFIG.vocab_size)
    expected, _ = hybrid.train_single_device(gpt, dataset, make_optimizer("adam"))
    results = run_on_ranks(fsdp2_and_zero3_on_rank, 2, gpt, dataset, timeout=120)
    parameters = sum(p.numel() for p in gpt.parameters())
    for rank, (by_kind, memory) in enumerate(results):
        (fsdp_losses, fsdp_state), (zero_losses, zero_state) = by_kind["fsdp2"], by_kind["zero3"]
        assert_close(torch.tensor(fsdp_losses), torch.tensor(expected), "fsdp2's losses",
                     rank=rank, atol=ATOL)
        assert_close(torch.tensor(fsdp_losses), torch.tensor(zero_losses),
                     "fsdp2's losses vs zero3's", rank=rank, atol=ATOL)
        for name, value in zero_state.items():
            assert_close(fsdp_state[name], value, f"{name} after 3 steps, fsdp2 vs zero3",
                         rank=rank, atol=ATOL)
        # ZeRO-3's 16 bytes per parameter over N = 2 ranks, fp32: within each tensor's rounding
        # to whole rows (FSDP2 splits dim 0; the kit's ZeRO pads the flat tensor)
        formula = zero_memory_formula(parameters, 2, 3, mixed_precision=False)
        ceiling = zero_memory_formula(parameters, 2, 3, mixed_precision=False,
                                      padded_num_params=2 * sum(
                                          -(-p.shape[0] // 2) * (p.numel() // p.shape[0])
                                          for p in gpt.parameters()))
        assert formula * 0.9 <= memory <= ceiling, (
            f"rank {rank}: FSDP2 holds {memory} bytes of model state, ZeRO-3's formula says "
            f"{formula} (at most {ceiling} with whole rows)")
    assert sum(memory for _, memory in results) == 16 * parameters, "a state held twice"
    assert padded_numel(gpt, 2) >= parameters


RESUME = [*TINY, "--optimizer", "adamw", "--warmup-steps", "2", "--decay-steps", "6"]


@pytest.mark.parametrize("first, then", [
    ("--dp 2 --dp-kind zero2", "--dp 4 --dp-kind fsdp2"),
    ("--dp 2 --tp 2 --dp-kind fsdp2", "--dp 1 --tp 2 --pp 2 --dp-kind zero3 --microbatches 2"),
    ("--dp 4 --dp-kind zero3", "--dp 2 --dp-kind zero1"),
])
def test_a_sharded_checkpoint_resumes_under_another_layout_as_if_never_stopped(tmp_path, first,
                                                                                then):
    expected, _ = train.train_one_device(train.parse_args(["--steps", "6", *RESUME]))
    directory = str(tmp_path / "ckpt")
    saved = train.main([*first.split(), "--steps", "3", *RESUME, "--checkpoint-dir", directory])
    assert_close(torch.tensor(saved["losses"]), torch.tensor(expected[:3]),
                 f"steps 1..3 under {first}", atol=ATOL)
    resumed = train.main([*then.split(), "--steps", "6", *RESUME, "--checkpoint-dir", directory,
                          "--resume"])
    assert resumed["start_step"] == 3
    assert_close(torch.tensor(resumed["losses"]), torch.tensor(expected[3:]),
                 f"steps 4..6 resumed under {then} from {first}", atol=ATOL,
                 likely_cause="a shard of the weights or of Adam's state read into the wrong "
                              "place, or Adam's step count lost")


def test_a_sharded_checkpoint_refuses_another_tp_with_the_rule(tmp_path):
    directory = str(tmp_path / "ckpt")
    train.main(["--dp", "2", "--dp-kind", "zero1", "--steps", "2", *RESUME,
                "--checkpoint-dir", directory])
    with pytest.raises(ValueError, match="written with tp = 1, this run has tp = 2"):
        train.main(["--tp", "2", "--steps", "3", *RESUME, "--checkpoint-dir", directory,
                    "--resume"])  # refused before any rank starts
