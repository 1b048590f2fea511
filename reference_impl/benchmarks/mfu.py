"""Model FLOPs utilisation (MFU) of the course's GPT trained on one device.

    python -m reference_impl.benchmarks.mfu [--dtype fp32|bf16 --attention explicit|sdpa
        --layers L --hidden h --heads a --seq s --batch B --vocab V --steps N --warmup W
        --peak TFLOPS --device auto|cpu|cuda --compile --loss full|chunked
        --sdpa-backend auto|flash|efficient|cudnn|math --profile STEPS]

Prints tokens/s, model TFLOP/s and MFU (FLOPs counted as Narayanan et al. 2021, 6N + 12 L h s
per token), a matmul ceiling, one layer against the planner and memory against the formulas.
Derivation and options: docs/library.md, 'How the MFU benchmark counts'; measured figures:
docs/profiling.md, 'A step near the ceiling'.
"""
from __future__ import annotations

import argparse
import contextlib
import time

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

from reference_impl.model.linear_cross_entropy import linear_cross_entropy
from reference_impl.model.master_weights import MasterWeights
from reference_impl.memory.activation_memory import SavedActivations, gpt_activation_bytes
from reference_impl.memory.model_states import zero_memory_formula
from reference_impl.model import ATTENTION_KERNELS, GPT, Block, ModelConfig
from reference_impl.perf.planner import GPUS, ModelSpec
from reference_impl.perf.planner.autocast_cost import autocast_seconds
from reference_impl.perf.planner.hardware import peak_tflops
from reference_impl.perf.step_breakdown import breakdown, format_breakdown, profile_steps
from reference_impl.perf.step_timing import mean_seconds
from reference_impl.pipeline.gpt_stages import gpt_loss
from reference_impl.model.precision import PRECISIONS, autocast, weight_copy_bytes
from reference_impl.train import multi_tensor_options

NOMINAL_CPU_PEAK = 1.0  # TFLOP/s: a round number, not a measurement of any CPU
SDPA_BACKENDS = {"auto": None, "flash": SDPBackend.FLASH_ATTENTION,
                 "efficient": SDPBackend.EFFICIENT_ATTENTION,
                 "cudnn": SDPBackend.CUDNN_ATTENTION, "math": SDPBackend.MATH}
LOSSES = ("full", "chunked")
CEILING_SIZE = {"cuda": 8192, "cpu": 512}  # the square matrix product timed as the ceiling

GPU_DEFAULTS = {"layers": 24, "hidden": 2048, "heads": 16, "seq": 2048, "batch": 4,
                "vocab": 50304, "steps": 10, "warmup": 3, "dtype": "bf16"}
CPU_DEFAULTS = {"layers": 2, "hidden": 128, "heads": 4, "seq": 128, "batch": 4,
                "vocab": 1024, "steps": 10, "warmup": 2, "dtype": "fp32"}


# ---------------------------------------------------------------- the FLOP count

def flop_parameters(config: ModelConfig) -> int:
    """N: the parameters that multiply activations, i.e. all of ``GPT(config)``'s but the
    embedding tables. Per block the two layernorms (4h), qkv (3h^2 + 3h), proj (h^2 + h), fc1
    (f h + f) and fc2 (f h + h) with f = ffn_multiple * h; then the final layernorm (2h) and
    the LM head (V h, no bias)."""
    h, f = config.hidden, config.ffn_multiple * config.hidden
    block = 4 * h + (3 * h * h + 3 * h) + (h * h + h) + (f * h + f) + (f * h + h)
    return config.layers * block + 2 * h + config.vocab_size * h


def flops_per_token(config: ModelConfig, seq: int | None = None) -> int:
    """Training FLOPs per token, forward + backward, no recomputation: 6 N + 12 L h s."""
    seq = config.seq_len if seq is None else seq
    return 6 * flop_parameters(config) + 12 * config.layers * config.hidden * seq


def narayanan_flops_per_iteration(batch: int, config: ModelConfig,
                                  recompute: bool = False) -> float:
    """Narayanan et al. 2021's closed form for one iteration of B sequences:
    72 B s L h^2 (1 + s/(6h) + V/(12 L h)), or with full recomputation
    96 B s L h^2 (1 + s/(6h) + V/(16 L h)). (Matmuls only, ffn_multiple 4.)"""
    b, s, L, h, V = batch, config.seq_len, config.layers, config.hidden, config.vocab_size
    if recompute:
        return 96 * b * s * L * h * h * (1 + s / (6 * h) + V / (16 * L * h))
    return 72 * b * s * L * h * h * (1 + s / (6 * h) + V / (12 * L * h))


# ---------------------------------------------------------------- the run

WEIGHTS = ("fp32", "bf16")  # the parameters' dtype in a bf16 step


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m reference_impl.benchmarks.mfu",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto",
                        help="auto: the GPU if there is one, else the CPU")
    parser.add_argument("--dtype", choices=PRECISIONS, default=None,
                        help="bf16: autocast (weights, gradients and AdamW stay fp32); "
                             "default bf16 on a GPU, fp32 on the CPU")
    parser.add_argument("--weights", choices=WEIGHTS, default="fp32",
                        help="with --dtype bf16: fp32 (fp32 parameters under autocast) or bf16 "
                             "(bf16 parameters, fp32 masters and gradients: master_weights.py)")
    parser.add_argument("--attention", choices=ATTENTION_KERNELS, default="sdpa")
    for name in ("layers", "hidden", "heads", "seq", "batch", "vocab", "steps", "warmup"):
        parser.add_argument(f"--{name}", type=int, default=None,
                            help=f"default {GPU_DEFAULTS[name]} on a GPU, "
                                 f"{CPU_DEFAULTS[name]} on the CPU")
    parser.add_argument("--peak", type=float, default=None,
                        help="the device's peak TFLOP/s (needed on a GPU not in the table; "
                             f"on the CPU default {NOMINAL_CPU_PEAK:g}, nominal)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--compile", action="store_true",
                        help="train torch.compile(model) (the warm-up steps compile it)")
    parser.add_argument("--sdpa-backend", choices=tuple(SDPA_BACKENDS), default="auto",
                        help="the kernel behind scaled_dot_product_attention (auto: "
                             "PyTorch's choice)")
    parser.add_argument("--loss", choices=LOSSES, default="full",
                        help="full: the LM head's logits, then the cross-entropy; chunked: "
                             "both at once a chunk of tokens at a time "
                             "(linear_cross_entropy.py)")
    parser.add_argument("--profile", type=int, default=0, metavar="STEPS",
                        help="profile this many more steps and print where the time goes")
    args = parser.parse_args(argv)
    if args.device == "auto":
        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda, but torch sees no GPU")
    defaults = GPU_DEFAULTS if args.device == "cuda" else CPU_DEFAULTS
    for name, value in defaults.items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    for name in ("layers", "hidden", "heads", "seq", "batch", "vocab", "steps"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be at least 1")
    if args.warmup < 0:
        parser.error("--warmup must be at least 0")
    if args.weights == "bf16" and args.dtype != "bf16":
        parser.error(f"--weights bf16 needs --dtype bf16, got --dtype {args.dtype}")
    if args.compile and args.warmup < 1:
        parser.error("--compile needs --warmup of at least 1: the first step compiles")
    if args.hidden % args.heads:
        parser.error(f"--hidden {args.hidden} is not divisible by --heads {args.heads}")
    if args.peak is not None and args.peak <= 0:
        parser.error("--peak must be positive")
    if args.profile < 0:
        parser.error("--profile must be at least 0")
    return args


def loss_function(model: GPT, loss: str, compile_model: bool):
    """``f(tokens, targets)``: the model's mean loss, by ``gpt_loss`` of the whole logits
    (``full``) or by :func:`linear_cross_entropy` (``chunked``), the model compiled or not."""
    if loss == "chunked":
        hidden_states = torch.compile(model.hidden_states) if compile_model else model.hidden_states
        return lambda tokens, targets: linear_cross_entropy(hidden_states(tokens),
                                                            model.lm_head.weight, targets)
    forward = torch.compile(model) if compile_model else model  # same parameters
    return lambda tokens, targets: gpt_loss(forward(tokens).float(), targets)


def attention_backend(name: str):
    """The context that makes ``scaled_dot_product_attention`` use the kernel ``name``."""
    backend = SDPA_BACKENDS[name]
    return contextlib.nullcontext() if backend is None else sdpa_kernel([backend])


def train_steps(loss_of, optimizer, tokens, targets, steps: int, precision: str) -> torch.Tensor:
    """``steps`` training steps on one batch; the last loss, left on the device."""
    loss = None
    for _ in range(steps):
        optimizer.zero_grad(set_to_none=True)
        with autocast(precision, tokens.device):
            loss = loss_of(tokens, targets)
        loss.backward()
        optimizer.step()
    return loss.detach() if loss is not None else None


def matmul_ceiling_tflops(device: torch.device, precision: str, repeats: int = 10) -> float:
    """TFLOP/s of one large square matrix product (``CEILING_SIZE``) in the compute dtype:
    what a step made of matrix products could at best reach on this device."""
    n = CEILING_SIZE[device.type]
    dtype = torch.bfloat16 if precision == "bf16" else torch.float32
    a, b = (torch.randn(n, n, device=device, dtype=dtype) for _ in range(2))
    seconds = mean_seconds(lambda: a @ b, device, warmups=2, steps=repeats)
    return 2 * n ** 3 / seconds / 1e12


def measure(args) -> dict:
    """Build, warm up, time; the numbers the script prints."""
    device = torch.device(args.device)
    config = ModelConfig(vocab_size=args.vocab, seq_len=args.seq, hidden=args.hidden,
                         heads=args.heads, layers=args.layers, attention=args.attention)
    torch.manual_seed(args.seed)
    with device:  # parameters made on the device (1.5B of them take a while on a CPU)
        model = GPT(config)
    if args.weights == "bf16":
        optimizer = MasterWeights(model, lambda masters: torch.optim.AdamW(
            masters, lr=1e-4, **multi_tensor_options(masters)))
    else:
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4,
                                      **multi_tensor_options(model.parameters()))
    cast = autocast_precision(args)
    generator = torch.Generator().manual_seed(args.seed)
    data = torch.randint(args.vocab, (args.batch, args.seq + 1), generator=generator)
    # separate tensors (gpt_activation_bytes counts tokens and targets once each)
    tokens, targets = data[:, :-1].clone().to(device), data[:, 1:].clone().to(device)

    cuda = device.type == "cuda"
    loss_of = loss_function(model, args.loss, args.compile)

    def steps(count: int) -> tuple[torch.Tensor, float]:
        with attention_backend(args.sdpa_backend):
            return timed(lambda: train_steps(loss_of, optimizer, tokens, targets, count, cast),
                         device)

    steps(args.warmup)
    if cuda:
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
    loss, seconds = steps(args.steps)
    profile = None
    if args.profile:
        with profile_steps(device) as prof:
            _, profiled_seconds = steps(args.profile)
        profile = breakdown(prof, profiled_seconds, args.profile, vocab=head_width(config))
    tokens_timed = args.steps * args.batch * args.seq
    per_token = flops_per_token(config)
    tflops = tokens_timed * per_token / seconds / 1e12
    return {
        "config": config,
        "device_name": torch.cuda.get_device_name(device) if cuda else "CPU",
        "parameters": sum(p.numel() for p in model.parameters()),
        "flop_parameters": flop_parameters(config),
        "flops_per_token": per_token,
        "seconds": seconds,
        "tokens_per_second": tokens_timed / seconds,
        "tflops": tflops,
        "loss": float(loss),  # read after the clock stopped
        "peak_memory": torch.cuda.max_memory_allocated(device) if cuda else None,
        "saved_bytes": saved_bytes(model, loss_function(model, args.loss, False), tokens,
                                   targets, cast),
        "memory_formula": memory_formula(model, config, args.batch, args.dtype),
        "layer_seconds": layer_seconds(config, args.batch, args.dtype, device, args.warmup,
                                       args.steps, args.weights),
        "ceiling_tflops": matmul_ceiling_tflops(device, args.dtype),
        "profile": profile,
    }


def autocast_precision(args) -> str:
    """The precision the step's autocast runs in: none ("fp32") where the weights are bf16."""
    return "fp32" if args.weights == "bf16" else args.dtype


def head_width(config: ModelConfig) -> int | None:
    """The vocabulary, by which the profile tells the LM head's matrix products from the
    layers'; None where a layer's width equals it (the head's time is then the layers')."""
    widths = {config.hidden, 3 * config.hidden, config.ffn_size}
    return None if config.vocab_size in widths else config.vocab_size


def timed(run, device: torch.device):
    """(what ``run()`` returns, the seconds it took): on a GPU between two CUDA events read
    after a synchronisation, on the CPU by ``time.perf_counter``."""
    if device.type != "cuda":
        began = time.perf_counter()
        result = run()
        return result, time.perf_counter() - began
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    result = run()
    end.record()
    torch.cuda.synchronize(device)
    return result, start.elapsed_time(end) / 1000.0


def saved_bytes(model, loss_of, tokens, targets, precision: str) -> int:
    """Bytes autograd saves in one forward and loss (saved-tensor hooks; parameters excluded,
    autocast's weight copies included); no backward is run."""
    with SavedActivations(model.parameters()) as saved, autocast(precision, tokens.device):
        loss_of(tokens, targets)
    return saved.total


def memory_formula(model, config: ModelConfig, batch: int, precision: str) -> dict:
    """The kit's formulas for one training step on one device, in bytes."""
    parameters = sum(p.numel() for p in model.parameters())
    formula = {"model states": zero_memory_formula(parameters, 1, 0, mixed_precision=False),
               "weight copies": weight_copy_bytes(model, precision),
               "activations": gpt_activation_bytes(config, batch, precision)}
    formula["total"] = sum(formula.values())
    return formula


def layer_seconds(config: ModelConfig, batch: int, precision: str, device: torch.device,
                  warmup: int, steps: int, weights: str = "fp32") -> float:
    """Mean seconds of one ``Block``'s forward + backward, in the training step's precision
    (autocast over fp32 weights, or bf16 weights)."""
    torch.manual_seed(0)
    dtype = torch.bfloat16 if weights == "bf16" else torch.float32
    block = Block(config).to(device, dtype)
    x = torch.randn(batch, config.seq_len, config.hidden, device=device, dtype=dtype,
                    requires_grad=True)
    cast = "fp32" if weights == "bf16" else precision

    def step():
        with autocast(cast, device):
            y = block(x)
        y.sum().backward()

    return mean_seconds(step, device, warmup, steps)


def planner_gpu(device_name: str):
    """The planner's GPU (``perf.planner.GPUS``) of this name, or None."""
    return next((gpu for key, gpu in GPUS.items() if key in device_name.lower()), None)


def planned_layer_seconds(config: ModelConfig, batch: int,
                          device_name: str) -> tuple[float, float] | None:
    """What the planner predicts for one block of ``config`` on this GPU: (its layer model,
    in bf16, the time autocast adds: ``perf.planner.autocast_cost``), or None."""
    gpu = planner_gpu(device_name)
    if gpu is None:
        return None
    spec = ModelSpec("trainer", config.layers, config.hidden, config.heads, config.vocab_size,
                     config.seq_len, ffn_hidden=config.ffn_multiple * config.hidden)
    kernel = "flash" if config.attention == "sdpa" else "explicit"
    return (gpu.layer.layer_seconds(spec, tp=1, micro_batch=batch, attention=kernel),
            autocast_seconds(spec, gpu.layer.memory_bandwidth, tp=1, micro_batch=batch))


def resolve_peak(args) -> tuple[float, str]:
    """(peak TFLOP/s, where it comes from)."""
    if args.peak is not None:
        return args.peak, "--peak"
    if args.device == "cpu":
        return NOMINAL_CPU_PEAK, ("nominal: no peak is known for a CPU, so MFU here is only "
                                  "achieved / 1 TFLOP/s; pass --peak")
    peak = peak_tflops(torch.cuda.get_device_name(), args.dtype)
    if peak is None:
        raise SystemExit(f"error: no peak known for {torch.cuda.get_device_name()!r} "
                         f"({args.dtype}); pass --peak TFLOPS (dense, for {args.dtype})")
    return peak, f"{torch.cuda.get_device_name()}, dense {args.dtype}, from the table"


def main(argv=None) -> dict:
    args = parse_args(argv)
    peak, peak_source = resolve_peak(args)  # before the run: an unknown GPU fails at once
    result = measure(args)
    config, n = result["config"], result["flop_parameters"]
    print(f"device: {result['device_name']} ({args.device}), torch {torch.__version__}")
    print(f"model: GPT {config.layers} layers, hidden {config.hidden}, {config.heads} heads, "
          f"seq {config.seq_len}, vocab {config.vocab_size}: {result['parameters']:,} "
          f"parameters, N = {n:,} without the embedding tables; batch {args.batch}, "
          f"{args.dtype} ({args.weights} weights), attention {args.attention} (backend "
          f"{args.sdpa_backend}), loss "
          f"{args.loss}, " + ("compiled, " if args.compile else "eager, ") + "AdamW "
          + ("fused" if args.device == "cuda" else "foreach"))
    print(f"FLOPs per token: 6N + 12*L*h*s = {6 * n:,} + "
          f"{12 * config.layers * config.hidden * config.seq_len:,} = "
          f"{result['flops_per_token']:,} (Narayanan et al. 2021, fwd+bwd, no recomputation)")
    print(f"timed {args.steps} steps after {args.warmup} warm-up: {result['seconds']:.3f} s "
          f"({1000 * result['seconds'] / args.steps:.1f} ms/step), last loss "
          f"{result['loss']:.4f}")
    print(f"tokens/s: {result['tokens_per_second']:.1f}")
    print(f"model TFLOP/s: {result['tflops']:.4g}")
    result["mfu"] = result["tflops"] / peak
    print(f"MFU: {100 * result['mfu']:.3g}% of {peak:g} TFLOP/s ({peak_source})")
    ceiling = result["ceiling_tflops"]
    size = CEILING_SIZE[args.device]
    print(f"matrix-product ceiling, measured in this run ({size}^3, {args.dtype}): "
          f"{ceiling:.4g} TFLOP/s = {ceiling / peak:.3g} of peak; the step reaches "
          f"{result['tflops'] / ceiling:.3g} of it")
    print_layer(result, args, peak)
    print_memory(result, args)
    if result["profile"] is not None:
        print(f"profile of {args.profile} more steps (torch.profiler; of peak: the category's "
              f"model FLOPs over its time):")
        print(format_breakdown(result["profile"], category_flops(config, args.batch),
                               peak * 1e12))
    return result


def category_flops(config: ModelConfig, batch: int) -> dict[str, float]:
    """Model FLOPs per step of the profile's categories (6 N split: the blocks' weights and the
    LM head; attention's 12 L h s per token)."""
    tokens = batch * config.seq_len
    head = config.vocab_size * config.hidden
    layers = flop_parameters(config) - head - 2 * config.hidden
    return {"matmuls (layers)": 6 * layers * tokens, "LM head": 6 * head * tokens,
            "attention": 12 * config.layers * config.hidden * config.seq_len * tokens}


def print_layer(result: dict, args, peak: float) -> None:
    """One block alone, and the planner's prediction for it."""
    config, seconds = result["config"], result["layer_seconds"]
    block_flops = args.batch * config.seq_len * (flops_per_token(config) - 6 * (
        2 * config.hidden + config.vocab_size * config.hidden)) / config.layers
    print(f"one layer alone (Block, fwd+bwd): {seconds * 1e3:.3f} ms, "
          f"{block_flops / seconds / 1e12 / peak:.3g} of peak")
    predicted = planned_layer_seconds(config, args.batch, result["device_name"])
    if args.dtype != "bf16":
        print("planner's layer model: bf16 only (its calibration table is bf16)")
    elif predicted is None:
        print("planner's layer model: no prediction for this device (it knows "
              f"{', '.join(gpu.name for gpu in GPUS.values())})")
    else:
        layer, cast = predicted
        if args.weights == "bf16":
            print(f"planner's layer model predicts {layer * 1e3:.3f} ms (bf16 weights: no "
                  f"autocast cost): measured / predicted = {seconds / layer:.2f}")
            return
        print(f"planner's layer model predicts {(layer + cast) * 1e3:.3f} ms ({layer * 1e3:.3f} "
              f"in bf16 + {cast * 1e3:.3f} for autocast's fp32 weights and residual stream): "
              f"measured / predicted = {seconds / (layer + cast):.2f}")


def print_memory(result: dict, args) -> None:
    """The formulas, the measurements beside them, and their ratios."""
    formula, mib = result["memory_formula"], 2 ** 20
    if args.weights == "bf16":
        print(f"saved for the backward, measured: {result['saved_bytes'] / mib:,.2f} MiB; "
              "peak memory allocated: " + (f"{result['peak_memory'] / 2 ** 30:.2f} GiB"
                                           if result["peak_memory"] else "not measured")
              + " (the formulas here are autocast's: compare with --weights fp32)")
        return
    print(f"memory formulas: model states {formula['model states'] / mib:,.1f} MiB (16 B/param: "
          f"fp32 weights, gradients, Adam m and v; zero_memory_formula), bf16 weight copies "
          f"{formula['weight copies'] / mib:,.1f} MiB (2 B per matmul weight in bf16, 0 in "
          f"fp32), activations {formula['activations'] / mib:,.1f} MiB "
          f"(gpt_activation_bytes, {args.attention}, {args.dtype}"
          + (": no s x s term" if args.attention == "sdpa" else ": with the s x s softmax")
          + f"); total {formula['total'] / mib:,.1f} MiB")
    expected = formula["activations"] + formula["weight copies"]
    print(f"saved for the backward, measured (saved-tensor hooks, one forward): "
          f"{result['saved_bytes'] / mib:,.2f} MiB = {result['saved_bytes'] / expected:.3f} x "
          f"the activations + weight copies formula")
    if result["peak_memory"] is None:
        print("peak memory allocated: not measured on the CPU (no allocator counter; "
              "torch.cuda.max_memory_allocated on a GPU)")
    else:
        print(f"peak memory allocated: {result['peak_memory'] / 2 ** 30:.2f} GiB "
              f"(torch.cuda.max_memory_allocated, timed steps) = "
              f"{result['peak_memory'] / formula['total']:.3f} x the formulas' total")


if __name__ == "__main__":
    main()
