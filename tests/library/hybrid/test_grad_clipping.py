"""The trainer's optimisation under every layout: the global gradient norm
(``hybrid/grad_norm.py``), clipping by it, AdamW (ZeRO's included) with its weight-decay
groups, and the learning-rate schedule (``hybrid/lr_schedule.py``), against one device.

One launch of 4 CPU ranks trains a GPT and a Llama-style GPT 3 steps in several layouts: TP
with and without sp, PP, dp sync and ddp_hooks, ZeRO 1, 2 and 3, replicated and
vocabulary-parallel embedding and head (with padding rows: vocab 30 over tp 4), replicated KV
heads (kv_heads 2 over tp 4), CP with TP and with ZeRO over RDP x CP, and dp 2 x tp 2 with sp and
ZeRO-1. Every step runs AdamW (weight decay 0.1 on the matrices and embeddings) at the
schedule's rate, clipped to a norm the gradients always exceed. Checked on every rank: (a) the
global norm of every step equals the single-device gradient's norm (``clip_grad_norm_``'s), and
(b) the weights after one step and after three equal single-device training's (clipped by
``torch.nn.utils.clip_grad_norm_``, ``torch.optim.AdamW``). Then the same rule with the
parameters replicated over TP counted on every TP rank must give another norm (so (a) can
fail), and (c) the schedule's rates, the decay groups, and the trainer's refusals.

Tolerances (fp32; the layouts only reorder additions): norms rtol 1e-5; weights atol 1e-5, as
``support/training.py``'s (Adam's eps 1e-4 for the reason given there). Observed on CPU
(torch 2.13), largest over ranks and layouts (printed with ``-s``): norms 1.7e-7 relative,
weights 2.4e-7; the replicated parameters counted on every TP rank move the norm by 3.6e-2
(dp 2 x tp 2) and 7.5e-2 (tp 4), and a weight after one step by 8.8e-5, so tests (a) and (b)
fail on that mistake (tried: so does leaving ZeRO's group out of the sum). One launch, about
10 s here.
"""
import copy
import math
from unittest import mock

import pytest
import torch

from reference_impl import train
from reference_impl.checks import assert_close
from reference_impl.comm.launcher import launch
from reference_impl.hybrid import grad_norm
from reference_impl.hybrid import parallel_gpt as hybrid
from reference_impl.hybrid.lr_schedule import WarmupCosine, set_lr
from reference_impl.hybrid.training_plan import TrainingPlan
from reference_impl.hybrid.parallelize import build_optimizer, parallelize_gpt
from reference_impl.model import ModelConfig, llama_config
from reference_impl.pipeline.gpt_stages import gpt_loss
from support.training import gpt_with_uneven_norms

NORM_RTOL, ATOL = 1e-5, 1e-5
STEPS, BATCH = 3, 8
MAX_NORM = 0.05  # below every step's norm: every step clips
OPTIMISATION = ["--lr", "1e-2", "--adam-eps", "1e-4", "--weight-decay", "0.1"]
SCHEDULE = WarmupCosine(lr=1e-2, min_lr=1e-3, warmup_steps=1, decay_steps=STEPS)
GPT_CONFIG = ModelConfig(vocab_size=32, seq_len=8, hidden=16, heads=2, layers=2)
LLAMA_CONFIG = llama_config(vocab_size=30, seq_len=16, hidden=16, heads=4, kv_heads=2, layers=2)
# model -> (config, [(name, TrainingPlan fields)]), all on 4 ranks
MATRIX = {
    "gpt": (GPT_CONFIG, [
        ("dp2-tp2-sync", dict(dp=2, tp=2)),
        ("dp2-tp2-sp-zero1", dict(dp=2, tp=2, sp=True, dp_kind="zero1")),
        ("dp2-pp2-ddp_hooks", dict(dp=2, pp=2, dp_kind="ddp_hooks", microbatches=2)),
        ("dp4-zero2", dict(dp=4, dp_kind="zero2")),
        ("dp2-tp2-zero3-replicated-vocab", dict(dp=2, tp=2, dp_kind="zero3",
                                                vocab_parallel=False)),
        ("tp2-pp2-sp", dict(tp=2, pp=2, sp=True, microbatches=2)),
    ]),
    "llama": (LLAMA_CONFIG, [
        ("tp2-cp2", dict(tp=2, cp=2)),
        ("tp4-sp-replicated-kv", dict(tp=4, sp=True)),
        ("dp2-cp2-zero2", dict(dp=2, cp=2, dp_kind="zero2")),
    ]),
}
COUNTED_TWICE = ("dp2-tp2-sp-zero1", "tp4-sp-replicated-kv")
OBSERVED = {}


def make_adamw(parameters):
    return train.make_optimizer(train.parse_args(OPTIMISATION), parameters)


def clipped_run(gpt, dataset, fields):
    """On every rank: the layout's global norm of every step and its weights (gathered to the
    single-device names) after step 1 and after the last step."""
    plan = TrainingPlan(**fields)
    model = parallelize_gpt(gpt, plan, plan.dims.build())
    optimizer = build_optimizer(model, make_adamw(model.parameters()))
    norms, states = [], []
    for number, (tokens, targets) in enumerate(dataset, start=1):
        set_lr(optimizer, SCHEDULE.lr_at(number))
        result = hybrid.train_step(model, tokens, targets, optimizer, return_report=True,
                                   max_norm=MAX_NORM)
        norms.append(result.grad_norm.item())
        if number in (1, len(dataset)):
            states.append(hybrid.gather_full_state(model))
    return norms, states


def norm_counting_replicas_twice(gpt, dataset, fields):
    """The first step's norm by the same rule, but with every TP rank counting the parameters
    replicated over TP (the mistake the rule avoids)."""
    with mock.patch.object(grad_norm, "owns", lambda parameter, tp_rank: True):
        norms, _ = clipped_run(gpt, dataset[:1], fields)
    return norms[0]


def every_layout(models):
    results = {}
    for label, (gpt, dataset, combinations) in models.items():
        for name, fields in combinations:
            results[name] = clipped_run(gpt, dataset, fields)
            if name in COUNTED_TWICE:
                results[name + " counted twice"] = norm_counting_replicas_twice(gpt, dataset,
                                                                                fields)
    return results


def single_device(gpt, dataset):
    """The oracle: one device, gradients clipped by ``torch.nn.utils.clip_grad_norm_``,
    ``torch.optim.AdamW`` at the schedule's rate; norms, weights after step 1 and the last."""
    model = copy.deepcopy(gpt)
    optimizer = make_adamw(model.parameters())
    norms, states = [], []
    for number, (tokens, targets) in enumerate(dataset, start=1):
        optimizer.zero_grad(set_to_none=True)
        gpt_loss(model(tokens), targets).backward()
        norms.append(torch.nn.utils.clip_grad_norm_(model.parameters(), MAX_NORM).item())
        set_lr(optimizer, SCHEDULE.lr_at(number))
        optimizer.step()
        if number in (1, len(dataset)):
            states.append({name: p.detach().clone() for name, p in model.named_parameters()})
    return norms, states


@pytest.fixture(scope="module")
def models():
    built = {}
    for label, (config, combinations) in MATRIX.items():
        gpt = gpt_with_uneven_norms(config)
        dataset = hybrid.make_dataset(0, STEPS, BATCH, config.seq_len, config.vocab_size)
        built[label] = (gpt, dataset, combinations)
    return built


@pytest.fixture(scope="module")
def oracles(models):
    return {label: single_device(gpt, dataset) for label, (gpt, dataset, _) in models.items()}


@pytest.fixture(scope="module")
def results(request, models):
    """Every layout's run on every rank: one launch for the module's tests."""
    return launch(every_layout, 4, models, backend=request.config.getoption("--backend"),
                  timeout=300)


@pytest.mark.slow  # nine layouts launched on two cores
def test_global_norm_and_clipped_adamw_match_one_device(models, oracles, results):
    for label, (gpt, dataset, combinations) in models.items():
        norms, states = oracles[label]
        assert min(norms) > 2 * MAX_NORM, f"{label}: norms {norms}: a step would not clip"
        initial = dict(gpt.named_parameters())
        for name, _ in combinations:
            worst_norm = worst_weight = 0.0
            for rank, by_name in enumerate(results):
                rank_norms, rank_states = by_name[name]
                assert_close(torch.tensor(rank_norms), torch.tensor(norms),
                             f"{name}: the global gradient norm of steps 1..{STEPS}", rank=rank,
                             atol=0, rtol=NORM_RTOL, likely_cause="a piece of the gradient "
                             "counted on several ranks, or not summed over the right group")
                worst_norm = max(worst_norm, max(abs(a / b - 1) for a, b in zip(rank_norms, norms)))
                for after, state, expected in zip((1, STEPS), rank_states, states):
                    for parameter, value in expected.items():
                        moved = (value - initial[parameter].detach()).abs().max().item()
                        assert moved > 100 * ATOL, f"{parameter} moved {moved:.2g}: a weak test"
                        assert_close(state[parameter], value, f"{name}: {parameter} after "
                                     f"{after} clipped AdamW step(s)", rank=rank, atol=ATOL,
                                     rtol=0, likely_cause="clipped by another norm, or another "
                                     "weight decay or learning rate")
                        worst_weight = max(worst_weight, (state[parameter] - value).abs().max().item())
            OBSERVED[name] = (worst_norm, worst_weight)
    print("\nlargest difference (norm relative, weights):",
          {name: f"{a:.1e}, {b:.1e}" for name, (a, b) in OBSERVED.items()})


@pytest.mark.slow  # nine layouts launched on two cores
def test_replicated_parameters_counted_twice_give_another_norm(models, oracles, results):
    """Without the rule's "TP rank 0 only", the tp > 1 layouts' norm is measurably wrong: the
    norm test above can fail."""
    off = {}
    for label, (gpt, dataset, combinations) in models.items():
        norm = oracles[label][0][0]
        for name, _ in combinations:
            if name in COUNTED_TWICE:
                for rank, by_name in enumerate(results):
                    wrong = by_name[name + " counted twice"]
                    assert abs(wrong / norm - 1) > 1e-2, (
                        f"{name}, rank {rank}: counting the replicated parameters on every TP "
                        f"rank gives {wrong}, the norm is {norm}: too close to tell")
                    off[name] = min(off.get(name, 1.0), abs(wrong / norm - 1))
    print("\ncounted twice, relative error of the norm:", {n: f"{e:.1e}" for n, e in off.items()})


def test_the_schedule_warms_up_then_follows_a_cosine_to_its_floor():
    schedule = WarmupCosine(lr=1.0, min_lr=0.1, warmup_steps=4, decay_steps=12)
    rates = [schedule.lr_at(n) for n in range(1, 15)]
    assert rates[:4] == [0.25, 0.5, 0.75, 1.0], "linear warm-up to the peak at its last step"
    middle = 0.1 + 0.45 * (1 + math.cos(math.pi * 4 / 8))  # step 8: half-way through the decay
    assert rates[7] == pytest.approx(middle) == pytest.approx(0.55)
    assert all(a > b for a, b in zip(rates[3:11], rates[4:12])), "the cosine decreases"
    assert rates[11:] == [0.1, 0.1, 0.1], "the floor from decay_steps on"
    assert WarmupCosine(1.0, 0.0, 0, 1).lr_at(1) == 0.0, "no warm-up: a one-step decay"


@pytest.mark.parametrize("fields, message", [
    (dict(lr=1.0, min_lr=2.0, warmup_steps=0, decay_steps=5), "min_lr must be between 0 and lr"),
    (dict(lr=1.0, min_lr=0.1, warmup_steps=6, decay_steps=5),
     "warmup_steps must be between 0 and decay_steps = 5, got 6"),
    (dict(lr=0.0, min_lr=0.0, warmup_steps=0, decay_steps=5), "learning rate must be > 0"),
])
def test_a_schedule_that_cannot_work_is_refused(fields, message):
    with pytest.raises(ValueError, match=message):
        WarmupCosine(**fields)


@pytest.mark.parametrize("argv, message", [
    (["--clip-grad", "-1"], "--clip-grad must be >= 0 \\(0 disables it\\), got -1.0"),
    (["--steps", "5", "--warmup-steps", "6"], "--warmup-steps 6 is more than --steps 5"),
    (["--weight-decay", "-0.1"], "--weight-decay must be >= 0"),
    (["--betas", "0.9", "1.0"], "--betas must lie in \\[0, 1\\), got 0.9 1.0"),
    (["--lr", "1e-3", "--min-lr", "1e-2"], "min_lr must be between 0 and lr = 0.001"),
])
def test_the_trainer_refuses_optimisation_flags_that_cannot_work(argv, message):
    with pytest.raises(ValueError, match=message):
        train.parse_args(argv)


def test_defaults_and_decay_groups():
    args = train.parse_args(["--steps", "50"])
    assert (args.optimizer, args.lr, args.min_lr, args.warmup_steps, args.decay_steps,
            args.weight_decay, args.clip_grad, tuple(args.betas)) == (
        "adamw", 3e-4, pytest.approx(3e-5), 5, 50, 0.1, 1.0, (0.9, 0.95))
    gpt = gpt_with_uneven_norms(GPT_CONFIG)
    optimizer = train.make_optimizer(args, gpt.parameters())
    assert isinstance(optimizer, torch.optim.AdamW)
    names = {id(p): name for name, p in gpt.named_parameters()}
    decayed, plain = ({names[id(p)] for p in group["params"]} for group in optimizer.param_groups)
    assert [group["weight_decay"] for group in optimizer.param_groups] == [0.1, 0.0]
    assert {"token_embedding.weight", "position_embedding.weight", "lm_head.weight",
            "blocks.0.attn.qkv.weight"} <= decayed
    assert all(name.endswith("bias") or ".ln" in name or name.startswith("ln_f")
               for name in plain) and "blocks.1.ln2.weight" in plain


def test_the_checkpoint_records_the_schedule_and_a_resume_must_keep_it():
    argv = ["--steps", "6", "--warmup-steps", "2"]
    args = train.parse_args(argv)
    info = train.optimizer_info(args)
    assert info["schedule"] == {"lr": 3e-4, "min_lr": pytest.approx(3e-5), "warmup_steps": 2,
                                "decay_steps": 6}
    saved = {"config": vars(train.model_config(args)), "data": train.data_info(args),
             "experts": [0, 0],
             "optimizer": info, "step": 3}
    train._check_resumable(saved, train.parse_args(argv))  # no error
    with pytest.raises(ValueError, match="the checkpoint's learning-rate schedule"):
        train._check_resumable(saved, train.parse_args(["--steps", "8", "--warmup-steps", "2"]))
