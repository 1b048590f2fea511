"""The reference trainer: the course's GPT (or Llama-style model, with ``--experts`` a mixture
of experts) under any layout the kit composes, from the command line.

    torchrun --nproc-per-node 8 -m reference_impl.train --dp 2 --tp 2 --pp 2 --steps 20
    python -m reference_impl.train --dp 2 --tp 2 --steps 5     # laptop: dp*tp*cp*pp CPU ranks
    python -m reference_impl.train --data stdlib --steps 200 --out runs/x --sample 200

The flags become a ``TrainingPlan`` (``hybrid/training_plan.py``), checked once before any rank
starts (:func:`check_composition`); every rank then runs :func:`train_on_rank` with it: the
plan's layout, ``parallelize.parallelize_gpt``, ``parallel_gpt.train_step_on_share`` on its
share of each global batch of a corpus on disk (``--data``: ``data/sharded_batches.py``) or of
the in-memory ``parallel_gpt.make_dataset``, so the losses are the single-device model's on
the same batches (:func:`train_one_device`, the tests' oracle). ``--eval-every``, ``--out``
and ``--sample`` show the run: the validation loss, a log and a loss curve, text from the
model. Sharded checkpoints (``hybrid/checkpoint.py``) resume under another dp, pp, cp or
data-parallel kind, the data stream where it stopped. What each
flag does, the optimisation's defaults and the cluster commands: ``docs/library.md``, "Running
on a GPU cluster".
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import threading
import time
from datetime import timedelta

import torch
import torch.distributed as dist
from tqdm import tqdm

from reference_impl.comm.device import current_device, resolve_backend, wait_for_device
from reference_impl.comm.launcher import launch, under_torchrun
from reference_impl.data.byte_tokenizer import decode, encode
from reference_impl.data.corpus import STDLIB, Corpus, load_corpus, unigram_entropy
from reference_impl.data.sharded_batches import ShardedBatches
from reference_impl.figures.loss_curve import plot_loss_curve
from reference_impl.hybrid import checkpoint, parallel_gpt, parallelize
from reference_impl.hybrid.evaluation import evaluate
from reference_impl.hybrid.lr_schedule import WarmupCosine, set_lr
from reference_impl.hybrid.dp_kinds.registry import DP_KINDS
from reference_impl.hybrid.training_plan import RECOMPUTE_MODES, TrainingPlan
from reference_impl.model import ATTENTION_KERNELS, GPT, ModelConfig, llama_config
from reference_impl.model.precision import PRECISIONS
from reference_impl.model.sampling import generate
from reference_impl.moe.moe_blocks import with_experts
from reference_impl.moe.router import check_router
from reference_impl.perf.run_log import RunLog

tqdm.set_lock(threading.RLock())  # a rank's bar needs no lock across processes (nor its semaphore)

DEFAULT_LR = {"adamw": 3e-4, "sgd": 0.1}


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m reference_impl.train",
        description="Train the course's GPT with dp x tp x pp parallelism (torchrun, or "
                    "dp*tp*cp*pp local ranks without it).")
    layout = parser.add_argument_group("layout")
    layout.add_argument("--dp", type=int, default=1, help="model replicas (RDP_GROUP size)")
    layout.add_argument("--tp", type=int, default=1, help="tensor-parallel degree")
    layout.add_argument("--pp", type=int, default=1, help="pipeline stages (ranks)")
    layout.add_argument("--cp", type=int, default=1,
                        help="context parallelism: ranks sharing each sequence, ring attention "
                             "over them (needs --model llama and --seq divisible by 2 x --cp)")
    layout.add_argument("--ep", type=int, default=1,
                        help="expert parallelism: ranks of each replica group sharing a MoE "
                             "block's experts (needs --experts divisible by it, --dp divisible "
                             "by it, --dp-kind sync)")
    layout.add_argument("--order", default="megatron", choices=("megatron", "sagemaker"),
                        help="rank order of the layout (default: megatron, tp fastest)")
    layout.add_argument("--schedule", default="1f1b",
                        help="pipeline schedule: gpipe, 1f1b, interleaved, zb-h1 (default 1f1b)")
    layout.add_argument("--microbatches", type=int, default=None,
                        help="micro-batches per replica and step (default: max(pp, 1))")
    layout.add_argument("--chunks", type=int, default=1,
                        help="model chunks per rank (interleaved schedule)")
    layout.add_argument("--no-vocab-parallel", dest="vocab_parallel", action="store_false",
                        help="replicate embedding and head instead of splitting the vocabulary")
    layout.add_argument("--sp", action="store_true",
                        help="sequence parallelism: layernorms, residuals and the activations "
                             "between pipeline stages split along the sequence over the TP "
                             "group (needs --tp > 1 and --seq divisible by --tp)")
    layout.add_argument("--recompute", choices=RECOMPUTE_MODES, default="none",
                        help="activation recomputation per block: none (the default), "
                             "selective (the attention core) or full (the whole block)")
    layout.add_argument("--dp-kind", choices=DP_KINDS, default="sync",
                        help="how replicas reduce gradients: sync (bucketed all-reduce after "
                             "the backward, the default), ddp_hooks (all-reduces from hooks "
                             "during the backward), zero1/zero2/zero3 (ZeRO: Adam's state, + "
                             "gradients, + parameters sharded over the replicas; --optimizer "
                             "adamw), fsdp2 (PyTorch's fully_shard over the replicas)")
    model = parser.add_argument_group("model and data")
    model.add_argument("--model", choices=("gpt", "llama"), default="gpt",
                       help="gpt (layernorm, GeLU MLP, learned positions: the default) or llama "
                            "(model.llama_config: RMSNorm, SwiGLU, rotary positions, grouped-"
                            "query attention, no biases)")
    model.add_argument("--kv-heads", type=int, default=None,
                       help="KV heads of grouped-query attention, a divisor of --heads (default: "
                            "--heads for gpt, --heads // 2 for llama)")
    model.add_argument("--experts", type=int, default=0,
                       help="a mixture of this many expert MLPs in every block (default 0: "
                            "dense); --ep splits them over ranks")
    model.add_argument("--top-k", type=int, default=2,
                       help="experts each token is routed to (with --experts; default 2)")
    model.add_argument("--layers", type=int, default=4)
    model.add_argument("--hidden", type=int, default=64)
    model.add_argument("--heads", type=int, default=4)
    model.add_argument("--seq", type=int, default=32)
    model.add_argument("--vocab", type=int, default=None,
                       help="vocabulary size (default: the corpus's, 256 for text; 128 without "
                            "--data)")
    model.add_argument("--batch", type=int, default=16, help="global batch (samples per step)")
    model.add_argument("--seed", type=int, default=0,
                       help="seeds the weights and the data's order")
    model.add_argument("--data", default=None,
                       help=f"the corpus: a text file or folder (byte-level tokens), a folder "
                            f"of train.bin and val.bin (python -m reference_impl.data.prepare, "
                            f"or nanoGPT's), or {STDLIB!r} (the Python standard library's "
                            f"source, offline); default: in-memory noisy counting sequences")
    model.add_argument("--attention", choices=ATTENTION_KERNELS, default="explicit",
                       help="attention kernel: explicit (s x s scores, the default) or sdpa "
                            "(torch's scaled_dot_product_attention: flash/memory-efficient "
                            "kernels on GPU)")
    model.add_argument("--dtype", choices=PRECISIONS, default="fp32",
                       help="compute precision: fp32 (the default) or bf16 (autocast: bf16 "
                            "matmuls, fp32 weights, gradients and optimizer state)")
    optim = parser.add_argument_group("optimisation")
    optim.add_argument("--steps", type=int, default=20, help="total optimizer steps")
    optim.add_argument("--optimizer", choices=("adamw", "sgd"), default="adamw",
                       type=lambda name: "adamw" if name == "adam" else name,
                       help="adamw (the default: Adam with decoupled weight decay; 'adam', as "
                            "earlier versions called it, is the same) or sgd (momentum; weight "
                            "decay added to the gradient)")
    optim.add_argument("--lr", type=float, default=None,
                       help=f"peak learning rate (default: {DEFAULT_LR['adamw']} for adamw, "
                            f"{DEFAULT_LR['sgd']} for sgd)")
    optim.add_argument("--min-lr", type=float, default=None,
                       help="the cosine's floor, reached at --decay-steps (default: 0.1 x --lr)")
    optim.add_argument("--warmup-steps", type=int, default=None,
                       help="linear warm-up steps (default: a tenth of --decay-steps)")
    optim.add_argument("--decay-steps", type=int, default=None,
                       help="the step where the cosine reaches --min-lr (default: --steps)")
    optim.add_argument("--weight-decay", type=float, default=0.1,
                       help="weight decay of the matrices and embeddings; none on 1-D "
                            "parameters (norms, biases) (default 0.1)")
    optim.add_argument("--clip-grad", type=float, default=1.0,
                       help="clip the gradients to this global norm (default 1.0; 0 disables)")
    optim.add_argument("--betas", type=float, nargs=2, default=(0.9, 0.95),
                       metavar=("BETA1", "BETA2"), help="adamw's betas (default 0.9 0.95)")
    optim.add_argument("--momentum", type=float, default=0.9, help="sgd momentum")
    optim.add_argument("--adam-eps", type=float, default=1e-8)
    run = parser.add_argument_group("run")
    run.add_argument("--log-every", type=int, default=1,
                     help="print a line every N steps (default 1)")
    run.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                     help="a progress bar on standard error (default: when it is a terminal)")
    run.add_argument("--eval-every", type=int, default=0,
                     help="the validation loss every N steps, averaged over the replicas (0: "
                          "at the end only, with --data)")
    run.add_argument("--eval-batches", type=int, default=8,
                     help="global batches of the validation split per evaluation (default 8)")
    run.add_argument("--out", default=None,
                     help="write DIR/log.jsonl (every step and evaluation) and DIR/loss.png "
                          "(the curves) as the run goes")
    run.add_argument("--sample", type=int, default=0,
                     help="at the end, print N tokens generated by the trained model")
    run.add_argument("--prompt", default=None,
                     help="the text the sample continues (default: the validation split's "
                          "first tokens)")
    run.add_argument("--temperature", type=float, default=0.8,
                     help="sampling temperature (0: greedy; default 0.8)")
    run.add_argument("--checkpoint-dir", default=None)
    run.add_argument("--checkpoint-every", type=int, default=0,
                     help="also save every N steps (0: only at the end)")
    run.add_argument("--resume", action="store_true",
                     help="continue from --checkpoint-dir's checkpoint if there is one")
    run.add_argument("--backend", default="auto", choices=("auto", "gloo", "nccl"))
    run.add_argument("--timeout", type=float, default=1800.0,
                     help="seconds before a stuck collective ends the run")
    args = parser.parse_args(argv)
    for name in ("dp", "tp", "pp", "cp", "ep", "top_k", "steps", "batch", "layers", "hidden", "heads", "seq",
                 "log_every", "chunks", "eval_batches"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1")
    for name in ("eval_every", "sample", "temperature"):
        if getattr(args, name) < 0:
            parser.error(f"--{name.replace('_', '-')} must be at least 0")
    try:
        complete_data(args)
    except ValueError as error:
        parser.error(str(error))
    if args.kv_heads is not None and args.kv_heads < 1:
        parser.error("--kv-heads must be at least 1")
    if args.resume and not args.checkpoint_dir:
        parser.error("--resume needs --checkpoint-dir")
    if args.microbatches is None:
        args.microbatches = max(args.pp, 1)
    if args.lr is None:
        args.lr = DEFAULT_LR[args.optimizer]
    complete_optimisation(args)
    return args


def complete_data(args) -> None:
    """``--vocab`` from the corpus when not given (128 without ``--data``), refused when the
    corpus has larger token ids."""
    if args.data is None:
        args.vocab = 128 if args.vocab is None else args.vocab
    else:
        needed = corpus_of(args).vocab_size
        if args.vocab is not None and args.vocab < needed:
            raise ValueError(f"--vocab {args.vocab} is smaller than the corpus's vocabulary "
                             f"({needed})")
        args.vocab = needed if args.vocab is None else args.vocab
    if args.vocab < 1:
        raise ValueError(f"--vocab must be at least 1, got {args.vocab}")


_corpora: dict[str, Corpus] = {}


def corpus_of(args) -> Corpus:
    """``--data``'s corpus, read once per process (its splits are memmaps when prepared)."""
    if args.data not in _corpora:
        _corpora[args.data] = load_corpus(args.data)
    return _corpora[args.data]


def training_data(args):
    """The global batches of the run: ``--data``'s, each rank reading its share, or the
    in-memory counting sequences. Both have ``rank_batch(step, context)`` and
    ``global_batch(step)``."""
    if args.data is None:
        return parallel_gpt.BatchList(parallel_gpt.make_dataset(
            args.seed, args.steps, args.batch, args.seq, args.vocab))
    return ShardedBatches(corpus_of(args).train, args.seq, args.batch, args.seed)


def validation_data(args):
    """The batches every evaluation reads: the validation split's first ``--eval-batches``
    global batches in corpus order (fewer when the split is shorter), or in-memory sequences
    of another seed."""
    if args.data is None:
        return parallel_gpt.BatchList(parallel_gpt.make_dataset(
            args.seed + 1, args.eval_batches, args.batch, args.seq, args.vocab))
    return ShardedBatches(corpus_of(args).val, args.seq, args.batch, shuffle=False,
                          name="validation")


def evaluation_batches(args, batches) -> int:
    return (args.eval_batches if isinstance(batches, parallel_gpt.BatchList)
            else min(args.eval_batches, batches.windows // args.batch))


def complete_optimisation(args) -> None:
    """Fill in the schedule's defaults (``--decay-steps`` = ``--steps``, a tenth of it as
    warm-up, ``--min-lr`` = lr / 10) and refuse, with a ValueError naming the rule and the
    numbers, an optimisation setting that cannot work."""
    if args.decay_steps is None:
        args.decay_steps = args.steps
    if args.warmup_steps is None:
        args.warmup_steps = args.decay_steps // 10
    if args.min_lr is None:
        args.min_lr = 0.1 * args.lr
    if args.warmup_steps > args.steps:
        raise ValueError(f"--warmup-steps {args.warmup_steps} is more than --steps {args.steps}: "
                         f"the run would end before the warm-up does")
    schedule(args)  # WarmupCosine checks lr, min_lr, warm-up and decay steps
    for flag, value in (("clip-grad", args.clip_grad), ("weight-decay", args.weight_decay)):
        if value < 0:
            raise ValueError(f"--{flag} must be >= 0 (0 disables it), got {value}")
    if not all(0 <= beta < 1 for beta in args.betas):
        raise ValueError(f"--betas must lie in [0, 1), got {args.betas[0]} {args.betas[1]}")


def schedule(args) -> WarmupCosine:
    """The learning rate of every step (``lr_schedule.py``)."""
    return WarmupCosine(args.lr, args.min_lr, args.warmup_steps, args.decay_steps)


def world_size_of(args) -> int:
    return args.dp * args.tp * args.cp * args.pp


def check_world_size(args, world: int) -> None:
    if world_size_of(args) != world:
        cp = f" x --cp {args.cp}" if args.cp > 1 else ""
        raise ValueError(
            f"--dp {args.dp} x --tp {args.tp}{cp} x --pp {args.pp} = {world_size_of(args)} "
            f"ranks, but WORLD_SIZE is {world} (torchrun's --nnodes x --nproc-per-node): make "
            f"the product of the degrees equal the number of processes")


def training_plan(args) -> TrainingPlan:
    """The plan the flags ask for (a ValueError names a combination that cannot work)."""
    return TrainingPlan(
        dp=args.dp, tp=args.tp, pp=args.pp, cp=args.cp, ep=args.ep, order=args.order,
        sp=args.sp, recompute=args.recompute, dp_kind=args.dp_kind, schedule=args.schedule,
        microbatches=args.microbatches, chunks=args.chunks, vocab_parallel=args.vocab_parallel,
        precision=args.dtype)


def check_composition(args) -> TrainingPlan:
    """The plan, checked once, in the process that starts the run (before any rank starts):
    the layout, the model, the batch, the optimizer and a checkpoint to resume; the ranks
    trust it."""
    plan = training_plan(args)
    if args.experts:
        check_router(args.hidden, args.experts, args.top_k, None)
    plan.check(model_config(args), args.batch, args.experts,
               optimizer=make_optimizer(args, [torch.zeros(1)]))
    if args.data is not None:  # enough tokens for a batch of each split
        training_data(args)
        if args.eval_every or args.steps:
            validation_data(args)
    saved = checkpoint.read_run(args.checkpoint_dir) if args.resume else None
    if saved is not None:
        _check_resumable(saved, args)
        checkpoint.check_layout(saved, args.tp, args.vocab_parallel)
    return plan


def model_config(args) -> ModelConfig:
    """The GPT's configuration, or with ``--model llama`` ``llama_config``'s; ``--kv-heads``
    when given (a ValueError names a count that does not divide ``--heads``)."""
    fields = dict(vocab_size=args.vocab, seq_len=args.seq, hidden=args.hidden, heads=args.heads,
                  layers=args.layers, attention=args.attention)
    if args.kv_heads is not None:
        fields["kv_heads"] = args.kv_heads
    return llama_config(**fields) if args.model == "llama" else ModelConfig(**fields)


def build_gpt(args) -> GPT:
    """The model of the flags, from the current RNG state: ``model_config``'s, with
    ``--experts`` every block's MLP a mixture of experts (``moe/moe_blocks.py``)."""
    gpt = GPT(model_config(args))
    return with_experts(gpt, args.experts, args.top_k) if args.experts else gpt


def optimizer_info(args) -> dict:
    """What a checkpoint records of the optimisation (the schedule is checked on resume)."""
    hyper = ({"eps": args.adam_eps, "betas": list(args.betas)} if args.optimizer == "adamw"
             else {"momentum": args.momentum})
    hyper.update(weight_decay=args.weight_decay, clip_grad=args.clip_grad)
    return {"kind": args.optimizer, "hyper": hyper,
            "schedule": dataclasses.asdict(schedule(args))}


def multi_tensor_options(parameters) -> dict:
    """How an optimizer updates every parameter at once: ``fused=True`` (one kernel) when the
    parameters are on CUDA, else ``foreach=True`` (one multi-tensor op per step of the update)."""
    parameters = list(parameters)
    on_cuda = bool(parameters) and all(p.is_cuda for p in parameters)
    return {"fused": True} if on_cuda else {"foreach": True}


def weight_decay_groups(parameters, weight_decay: float) -> list[dict]:
    """The parameter groups of weight decay: the matrices and embeddings decay, the 1-D
    parameters (norm weights, biases) do not, as nanoGPT and Megatron-LM do (Megatron-LM
    decays its embeddings too; so does this). By ``p.ndim``, which every layout keeps: a TP or
    ZeRO-3 parameter has its single-device parameter's number of dimensions."""
    parameters = list(parameters)
    return [{"params": [p for p in parameters if p.ndim >= 2], "weight_decay": weight_decay},
            {"params": [p for p in parameters if p.ndim < 2], "weight_decay": 0.0}]


def make_optimizer(args, parameters) -> torch.optim.Optimizer:
    """AdamW (Loshchilov & Hutter 2019, "Decoupled Weight Decay Regularization") or SGD with
    momentum, over :func:`weight_decay_groups`, with :func:`multi_tensor_options`; the learning
    rate of each step is set by :func:`schedule`."""
    parameters = list(parameters)
    groups = weight_decay_groups(parameters, args.weight_decay)
    multi_tensor = multi_tensor_options(parameters)
    if args.optimizer == "adamw":
        return torch.optim.AdamW(groups, lr=args.lr, betas=tuple(args.betas), eps=args.adam_eps,
                                 **multi_tensor)
    return torch.optim.SGD(groups, lr=args.lr, momentum=args.momentum, **multi_tensor)


def train_one_device(args) -> tuple[list[float], dict]:
    """This command line's run on one device (``parallel_gpt.train_single_device``): the same
    GPT, batches, optimizer, schedule and clipping, so the same losses as the trainer's, in any
    layout (the tests' oracle). Returns the losses and the final parameters by name."""
    torch.manual_seed(args.seed)
    gpt = build_gpt(args)
    data = training_data(args)
    dataset = [data.global_batch(step) for step in range(args.steps)]
    return parallel_gpt.train_single_device(gpt, dataset, lambda p: make_optimizer(args, p),
                                           args.dtype, max_norm=args.clip_grad,
                                           lr_at=schedule(args).lr_at)


def data_info(args) -> dict:
    """The data stream a checkpoint continues: its corpus, seed and batch shape."""
    corpus = None if args.data is None else {"name": corpus_of(args).name,
                                             "fingerprint": corpus_of(args).fingerprint()}
    return {"seed": args.seed, "batch": args.batch, "seq": args.seq, "vocab": args.vocab,
            "corpus": corpus}


def stream_position(args, step: int) -> dict:
    """Where the data stream stands after ``step`` steps: the samples consumed (each global
    batch the next ``--batch`` of the seeded order) and the epochs of the corpus they span."""
    position = {"samples": step * args.batch}
    if args.data is not None:
        position["epochs"] = training_data(args).epoch_of(step)
    return position


def _check_resumable(saved: dict, args) -> None:
    """A resume must continue the same run: same model, data stream and optimizer. The
    attention kernel may change (both compute the same function)."""
    def shape(config: dict) -> dict:
        return {key: value for key, value in config.items() if key != "attention"}

    wanted = {"config": shape(dataclasses.asdict(model_config(args))), "data": data_info(args),
              "experts": [args.experts, args.top_k] if args.experts else [0, 0],
              "optimizer kind": args.optimizer,
              "learning-rate schedule": dataclasses.asdict(schedule(args))}
    found = {"config": shape(saved["config"]),
             "data": {key: saved["data"].get(key) for key in data_info(args)},
             "experts": saved["experts"],
             "optimizer kind": saved["optimizer"]["kind"],
             "learning-rate schedule": saved["optimizer"].get("schedule")}
    for what, value in wanted.items():
        if value != found[what]:
            raise ValueError(f"cannot resume: the checkpoint's {what} is {found[what]}, this "
                             f"run's is {value}")
    position = saved["data"].get("position", stream_position(args, saved["step"]))
    if position["samples"] != saved["step"] * args.batch:
        raise ValueError(f"cannot resume: the checkpoint's data stream is at sample "
                         f"{position['samples']}, not step {saved['step']} x --batch {args.batch}")
    if saved["step"] > args.steps:
        raise ValueError(f"cannot resume: the checkpoint is at step {saved['step']}, after "
                         f"--steps {args.steps}")


def _say(*parts) -> None:
    if dist.get_rank() == 0:
        tqdm.write(" ".join(str(part) for part in parts))  # above the progress bar, if any


def progress_bar(args, start: int) -> tqdm | None:
    """Rank 0's progress bar on standard error (step, loss, tokens/s, time left), with
    ``--progress`` or, by default, when standard error is a terminal."""
    shown = args.progress if args.progress is not None else sys.stderr.isatty()
    if dist.get_rank() != 0 or not shown:
        return None
    return tqdm(total=args.steps, initial=start, unit="step", dynamic_ncols=True, file=sys.stderr)


def describe_run(args, start: int) -> str:
    cp = f" x cp {args.cp}" if args.cp > 1 else ""
    data = (corpus_of(args).describe() if args.data else "in-memory counting sequences")
    return (f"training dp {args.dp} x tp {args.tp}{cp} x pp {args.pp} = {world_size_of(args)} "
            f"ranks ({dist.get_backend()}), {args.model}, {args.schedule} with "
            f"{args.microbatches} micro-batches, {args.dtype}, " + ("sp, " if args.sp else "")
            + (f"{args.experts} experts (top {args.top_k}) over ep {args.ep}, " if args.experts
               else "")
            + f"dp-kind {args.dp_kind}, recompute {args.recompute}, "
            + (f"steps {start + 1}..{args.steps}" if start < args.steps else "no steps left")
            + (f" (resumed at step {start})" if start else "") + f"; data: {data}")


def validation_loss(args, model, context) -> float:
    """The mean loss of the validation batches (each rank its share), the same on every rank."""
    batches = validation_data(args)
    count = evaluation_batches(args, batches)
    losses = [evaluate(model, *batches.rank_batch(index, context)) for index in range(count)]
    return torch.stack(losses).mean().item()


def sample_text(args, model) -> str | None:
    """``--sample`` tokens from the trained model, on rank 0 (None elsewhere): the model's
    whole state gathered (collective: every rank calls this) into the single-device GPT,
    which continues ``--prompt`` (or the validation split's first tokens)."""
    state = parallel_gpt.gather_full_state(model)
    if dist.get_rank() != 0:
        return None
    torch.manual_seed(args.seed)
    gpt = build_gpt(args)
    gpt.load_state_dict(state)
    gpt.to(current_device())
    text_corpus = args.data is not None and corpus_of(args).tokenizer == "bytes"
    if args.prompt is not None:
        prompt = torch.from_numpy(encode(args.prompt).astype("int64"))
    else:
        prompt = validation_data(args).global_batch(0)[0][0, :max(1, args.seq // 2)]
    ids = generate(gpt, prompt, args.sample, args.temperature, seed=args.seed)
    if not text_corpus:  # token ids of an unknown tokenizer
        return " ".join(map(str, ids[:len(prompt)].tolist())) + " \u2502 " + " ".join(
            map(str, ids[len(prompt):].tolist()))
    return decode(ids[:len(prompt)].tolist()) + "\u2502" + decode(ids[len(prompt):].tolist())


def save_curve(log: RunLog, args, entropy: float | None) -> None:
    reference = None if entropy is None else (entropy, "unigram entropy of the corpus")
    title = f"{args.model}, {corpus_of(args).name if args.data else 'counting sequences'}"
    plot_loss_curve(log.records, title, reference).savefig(
        os.path.join(args.out, "loss.png"), dpi=120)


def train_on_rank(args, plan: TrainingPlan) -> dict:
    """The training run, on one rank of an initialised default group of dp*tp*cp*pp ranks,
    under ``plan`` as :func:`check_composition` checked it (the ranks trust it). Returns
    {"start_step", "losses" and "grad_norms" (this run's steps, the global gradient norms
    before clipping), "val_losses" ([step, loss] of each evaluation), "sample" (rank 0's text,
    with ``--sample``), "seconds"} (the same on every rank but the sample)."""
    context = plan.dims.build()
    torch.manual_seed(args.seed)
    gpt = build_gpt(args)
    model = parallelize.parallelize_gpt(gpt, plan, context)
    optimizer = parallelize.build_optimizer(model, make_optimizer(args, model.parameters()))
    del gpt
    saved = checkpoint.read_run(args.checkpoint_dir) if args.resume else None
    start = 0
    if saved is not None:  # checked by check_composition
        checkpoint.load(args.checkpoint_dir, saved, model, optimizer)
        torch.set_rng_state(saved["rng"])
        start = saved["step"]
    data = training_data(args)
    leader = dist.get_rank() == 0
    _say(describe_run(args, start))
    entropy = unigram_entropy(corpus_of(args).train, args.vocab) if args.data else None
    log = RunLog(args.out, after=start) if args.out and leader else None
    bar = progress_bar(args, start)
    evaluate_at = {args.steps} if args.data else set()
    if args.eval_every:
        evaluate_at |= set(range(args.eval_every, args.steps + 1, args.eval_every))
    tokens_per_step, lr_at = args.batch * args.seq, schedule(args).lr_at
    wait_for_device()
    losses, norms, val_losses = [], [], []  # losses, norms: 0-d tensors, read when logged
    began = drawn = time.perf_counter()
    window_start, window_steps = began, 0
    for step in range(start, args.steps):
        done, window_steps = step + 1, window_steps + 1
        set_lr(optimizer, lr_at(done))  # a function of the step: the same after a resume
        tokens, targets = data.rank_batch(step, context)
        result = parallel_gpt.train_step_on_share(model, tokens, targets, optimizer,
                                                  return_report=True, max_norm=args.clip_grad)
        losses.append(result.loss)
        norms.append(result.grad_norm)
        if done % args.log_every == 0 or done == args.steps:
            # the host reads the window's losses only here (and waits for them), all at once
            window = torch.stack(losses[-window_steps:] + norms[-window_steps:]).tolist()
            wait_for_device()
            now = time.perf_counter()
            rate = window_steps * tokens_per_step / max(now - window_start, 1e-9)
            loss, norm = window[window_steps - 1], window[-1]
            _say(f"step {done}/{args.steps} loss {loss:.8f} grad_norm {norm:.4f} "
                 f"lr {lr_at(done):.3e} tokens/s {rate:.0f} elapsed {now - began:.2f}s")
            for back in range(window_steps if log is not None else 0):  # every step's record
                number = done - window_steps + 1 + back
                log.write(step=number, loss=window[back], grad_norm=window[window_steps + back],
                          lr=lr_at(number), tokens_per_s=rate, elapsed_s=now - began)
            if bar is not None:
                bar.set_postfix(loss=f"{loss:.4f}", tokens_per_s=f"{rate:.0f}", refresh=False)
            window_start, window_steps = now, 0
        if bar is not None:
            bar.update(1)
        paused = time.perf_counter()  # evaluating and drawing: not counted in the tokens/s
        if done in evaluate_at:
            val = validation_loss(args, model, context)
            val_losses.append([done, val])
            beside = "" if entropy is None else f" (unigram entropy of the corpus {entropy:.4f})"
            _say(f"step {done}/{args.steps} validation loss {val:.6f}{beside}")
            if log is not None:
                log.write(step=done, val_loss=val)
        if log is not None and (done in evaluate_at or time.perf_counter() - drawn > 30):
            save_curve(log, args, entropy)  # the picture, as the run goes (a few 0.1 s)
            drawn = time.perf_counter()
        window_start += time.perf_counter() - paused
        if args.checkpoint_dir and (done == args.steps or (
                args.checkpoint_every and done % args.checkpoint_every == 0)):
            path = checkpoint.save(args.checkpoint_dir, model, optimizer, done,
                                   optimizer_info(args),
                                   {**data_info(args), "position": stream_position(args, done)})
            if path:
                _say(f"saved checkpoint of step {done} to {path}")
    wait_for_device()
    seconds = time.perf_counter() - began
    if bar is not None:
        bar.close()
    if losses:  # one read of them all, after the clock stopped
        losses, norms = torch.stack(losses).tolist(), torch.stack(norms).tolist()
    tokens = len(losses) * tokens_per_step
    final = f"{losses[-1]:.8f}" if losses else "n/a"
    _say(f"done: {len(losses)} steps, final loss {final}, {tokens} tokens in {seconds:.2f}s "
         f"({tokens / max(seconds, 1e-9):.0f} tokens/s)")
    if log is not None:
        save_curve(log, args, entropy)
        log.close()
        _say(f"wrote {log.path} and {os.path.join(args.out, 'loss.png')}")
    text = sample_text(args, model) if args.sample else None
    if text is not None:
        _say(f"sample ({args.sample} tokens, temperature {args.temperature}; the prompt ends at "
             f"\u2502):\n{text}")
    return {"start_step": start, "losses": losses, "grad_norms": norms, "val_losses": val_losses,
            "sample": text, "seconds": seconds}


def _run_under_torchrun(args) -> dict:
    """One rank of a torchrun job: init from the environment, train, destroy the group. Not
    ``launch``'s torchrun path, which leaves the group to the exit for scripts that go on using
    it: there a gloo rank of a resumed ZeRO-3 run aborted at exit in about 1 run in 4."""
    world = int(os.environ["WORLD_SIZE"])
    check_world_size(args, world)  # before any rendezvous: every rank fails the same way
    plan = check_composition(args)
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    backend = resolve_backend(args.backend, int(os.environ.get("LOCAL_WORLD_SIZE", world)))
    if backend == "nccl":
        torch.cuda.set_device(local_rank)
    dist.init_process_group(backend, timeout=timedelta(seconds=args.timeout))
    try:
        return train_on_rank(args, plan)
    finally:
        dist.destroy_process_group()


def main(argv=None) -> dict:
    """Parse ``argv`` and train; returns rank 0's (under torchrun: this rank's) summary."""
    args = parse_args(argv)
    if under_torchrun():
        return _run_under_torchrun(args)
    plan = check_composition(args)
    results = launch(train_on_rank, world_size_of(args), args, plan, backend=args.backend,
                     timeout=args.timeout)
    return results[0]

if __name__ == "__main__":
    try:
        main(sys.argv[1:])
    except ValueError as error:  # a usage problem: say it, without a traceback per rank
        print(f"error: {error}", file=sys.stderr, flush=True)
        sys.exit(2)
