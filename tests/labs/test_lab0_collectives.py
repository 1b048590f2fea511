"""Lab 0, graded: all-reduce from send/recv (``collectives.py``: the ring, recursive doubling)
and the alpha-beta model that chooses between them (``alpha_beta.py``).

Units first, then their composition:

1. **The ring's chunks** (one helper process): ``ring_chunks`` for lengths that divide, that do
   not, fewer elements than ranks and none, against the reference's lengths (snapshot).
2. **The ring's two phases** on 4 and on 3 ranks, each alone, on lengths that do not divide:
   the chunk each rank completes in the reduce-scatter, every chunk after the all-gather.
3. **Both all-reduces, swept** (``reference_impl.course.sweeps``; ``--sweep-seed N`` draws
   other cases, and a failure prints its seed and case): on 4 ranks cut into groups of 1, of 2
   (consecutive {0, 1} {2, 3}, strided {0, 2} {1, 3}, permuted) and of 4 (the world, passed as
   ``group=None``), every group of a layout at once on tensors of its own, and the ring on 3
   ranks. Cases are drawn so that each value appears: lengths a multiple of the group size, with
   a remainder, or fewer elements than ranks; fp64, fp32 and bf16; a contiguous tensor or a
   strided view (every other element of a larger one, which must stay untouched). Each case
   calls the all-reduce twice on the same tensor and reads the state after each: the returned
   tensor must be the one passed in, summed in place. Checked, in this order, each failure
   naming the function, the rank and the case:

   * **the communication contract** (``comm_contract.check_contract``) of the first call: the
     ring, 2(n-1) sends (``isend``) of S/n bytes to the next rank of the group and 2(n-1)
     receives of S/n bytes from the previous one (where n divides the length; otherwise their
     number, peers and group); recursive doubling, log2(n) sends and log2(n) receives of the
     whole S bytes, each step with another partner of the group; nothing on one rank;
   * **the values** after each call against the group's sum, computed here in float64 from
     every member's input (atol = rtol: fp64 1e-12, fp32 1e-5, bf16 0.05 absolute and 0.02
     relative; only the order of the additions differs).
4. **The alpha-beta models and the choice** (one helper process): the ring's and recursive
   doubling's times, the crossover size, the faster algorithm per size, the least-squares line
   and fit of exact and of noisy synthetic measurements, and the plan from measurements, against
   the reference's values (snapshot; rel 1e-9, fits 1e-6).
"""
import math
import zlib

import pytest
import torch
import torch.distributed as dist

from reference_impl.checks import assert_close, assert_close_naming
from reference_impl.comm.comm_contract import check_contract, expected
from reference_impl.comm.comm_trace import CommTracer
from reference_impl.comm.device import current_device
from reference_impl.course.snapshots import snapshot
from reference_impl.course.sweeps import draw, group_layouts, group_of, label

pytestmark = pytest.mark.lab0

TIMEOUT = 90
NUMBERS = {"fp64": (torch.float64, dict(atol=1e-12, rtol=1e-12)),
           "fp32": (torch.float32, dict(atol=1e-5, rtol=1e-5)),
           "bf16": (torch.bfloat16, dict(atol=5e-2, rtol=2e-2))}
LENGTHS = ("a multiple of n", "with a remainder", "fewer than n")
CASE_SPACE = {"length": list(LENGTHS), "numbers": list(NUMBERS), "tensor": ["contiguous", "strided"]}
RING, DOUBLING = "ring_all_reduce", "recursive_doubling_all_reduce"
GROUP_SIZES = {4: (1, 2, 4), 3: (3,)}  # world -> the group sizes swept there
UNTOUCHED = -7.0  # the elements of a strided case's base tensor between the view's
FORMULAS = {RING: "2(n-1) sends of S/n bytes to the next rank of the group and 2(n-1) receives "
                  "of S/n bytes from the previous one",
            DOUBLING: "log2(n) sends and log2(n) receives of the whole S bytes, each step with "
                      "another partner"}
RELATIVE = 1e-9  # the models: the same formula, another order of operations at most
FIT_RELATIVE = 1e-6  # fits: lstsq or the normal equations, in float64


def random_tensor(shape, seed):
    """Rank ``seed``'s tensor, built on the CPU (here or on a rank)."""
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(shape, generator=generator, dtype=torch.float64)


def power_of_two(n: int) -> bool:
    return n & (n - 1) == 0


# ----------------------------------------------------------------- units: the ring's chunks

def chunk_lengths(impl, cases):
    """{"numel/n": (lengths, whether every chunk is a view into the tensor)} of ring_chunks."""
    collectives = impl.module("collectives")
    found = {}
    for key in cases:
        numel, n = map(int, key.split("/"))
        flat = torch.arange(float(numel))
        chunks = collectives.ring_chunks(flat, n)
        views = all(c.numel() == 0 or c.untyped_storage().data_ptr() == flat.untyped_storage().data_ptr()
                    for c in chunks)
        found[key] = ([int(c.numel()) for c in chunks], views)
    return found


def check_chunk_lengths(impl, run_alone, wanted: dict) -> None:
    """ring_chunks against ``wanted`` ({"numel/n": lengths}), naming the broken invariant."""
    for key, (lengths, views) in run_alone(chunk_lengths, impl, list(wanted)).items():
        numel, n = map(int, key.split("/"))
        what = f"ring_chunks(a tensor of {numel} elements, n={n}) gave chunks of lengths {lengths}"
        assert len(lengths) == n, f"{what}: {len(lengths)} chunks, one per rank is {n}"
        assert sum(lengths) == numel, f"{what}: they sum to {sum(lengths)}, not to the {numel} elements"
        assert max(lengths) - min(lengths) <= 1, (
            f"{what}: two chunks differ by more than one element; the ring's time is set by its "
            "longest chunk, so the remainder is spread one element per chunk")
        assert lengths == wanted[key], (
            f"{what}, expected {wanted[key]}: the longer chunks come first (as torch.tensor_split "
            "cuts), the order every rank and the tests agree on")
        assert views, (f"{what}: a chunk is a copy, not a view into the tensor; the ring writes "
                       "its sums into the chunks, in place")


def test_ring_chunks_cut_any_length_in_n(impl, run_alone):
    check_chunk_lengths(impl, run_alone, snapshot("lab0", "chunk_lengths"))


# ----------------------------------------------------------------- units: the two ring phases

def after_reduce_scatter(impl, numel, lengths):
    collectives = impl.module("collectives")
    n, rank = dist.get_world_size(), dist.get_rank()
    tensor = random_tensor((numel,), seed=rank).to(current_device())
    chunks = list(tensor.split(lengths))  # the reference's cut: only the phase is graded here
    collectives.ring_reduce_scatter(chunks)
    owned = (rank + 1) % n
    return owned, chunks[owned].cpu()


def check_reduce_scatter(impl, run_on_ranks, n: int, numel: int, lengths: list[int]) -> None:
    total_chunks = [sum(random_tensor((numel,), r).split(lengths)[k] for r in range(n))
                    for k in range(n)]
    for rank, (owned, chunk) in enumerate(run_on_ranks(after_reduce_scatter, n, impl, numel,
                                                       lengths, timeout=TIMEOUT)):
        # overwritten at every hop, a chunk ends as its first sender's: rank `owned`'s own
        overwritten = random_tensor((numel,), seed=owned).split(lengths)[owned]
        assert_close_naming(
            chunk, total_chunks[owned],
            f"chunk {owned} after ring_reduce_scatter on {n} ranks ({numel} elements, chunks of "
            f"{lengths})", rank=rank,
            mistakes={"the received chunk replaced this rank's copy instead of being added to "
                      "it: each hop must add its own contribution": overwritten},
            otherwise="the chunk sent and the chunk received at each step: after n-1 steps "
                      "rank r must hold the complete sum of chunk (r + 1) mod n, so each step "
                      "passes on the chunk that has just grown (the notebook, part 3)",
            **NUMBERS["fp64"][1])


@pytest.mark.parametrize("n, numel", [(4, 10), (3, 7)], ids=["4-ranks", "3-ranks"])
def test_reduce_scatter_phase_leaves_each_rank_one_summed_chunk(impl, run_on_ranks, n, numel):
    check_reduce_scatter(impl, run_on_ranks, n, numel, snapshot("lab0", "chunk_lengths")[f"{numel}/{n}"])


def after_all_gather(impl, numel, lengths):
    collectives = impl.module("collectives")
    n, rank = dist.get_world_size(), dist.get_rank()
    tensor = torch.full((numel,), -1.0, dtype=torch.float64, device=current_device())
    chunks = list(tensor.split(lengths))
    owned = (rank + 1) % n
    chunks[owned].fill_(owned + 1.0)  # the one complete chunk this rank holds
    collectives.ring_all_gather(chunks)
    return tensor.cpu()


def check_all_gather(impl, run_on_ranks, n: int, numel: int, lengths: list[int]) -> None:
    expected_tensor = torch.cat([torch.full((length,), k + 1.0, dtype=torch.float64)
                                 for k, length in enumerate(lengths)])
    for rank, tensor in enumerate(run_on_ranks(after_all_gather, n, impl, numel, lengths,
                                               timeout=TIMEOUT)):
        assert_close(tensor, expected_tensor,
                     f"the tensor after ring_all_gather on {n} ranks (chunks of {lengths}; "
                     "chunk k filled with k + 1)", rank=rank,
                     likely_cause="the chunk passed on at each step: it must be the complete "
                                  "chunk this rank holds most recently (at the first step the one "
                                  "the reduce-scatter completed), stored by the receiver in the "
                                  "same place", **NUMBERS["fp64"][1])


@pytest.mark.parametrize("n, numel", [(4, 10), (3, 7)], ids=["4-ranks", "3-ranks"])
def test_all_gather_phase_completes_every_chunk(impl, run_on_ranks, n, numel):
    check_all_gather(impl, run_on_ranks, n, numel, snapshot("lab0", "chunk_lengths")[f"{numel}/{n}"])


# ----------------------------------------------------------------- the all-reduces, swept

def sweep_plan(world: int, seed: int, algorithm: str, group_sizes=None) -> list[dict]:
    """Every case of a launch on ``world`` ranks (the same in the ranks and in the test)."""
    plan = []
    for size in group_sizes or GROUP_SIZES[world]:
        if algorithm == DOUBLING and not power_of_two(size):
            continue
        for layout, groups in group_layouts(world, size, seed).items():
            draw_seed = zlib.crc32(f"{seed}/{world}/{size}/{layout}/{algorithm}".encode())
            for case in draw(CASE_SPACE, draw_seed):
                config = {"n": size, "layout": layout, **case}
                plan.append({"config": config, "groups": groups, "key": label(config, seed)})
    return plan


def case_length(config: dict, scale: int) -> int:
    n = config["n"]
    return {"a multiple of n": scale * n, "with a remainder": scale * n + max(1, n // 2),
            "fewer than n": max(1, n - 1)}[config["length"]]


def case_input(config: dict, rank: int, seed: int, scale: int) -> torch.Tensor:
    """Rank ``rank``'s input of a case, in the case's dtype, on the CPU."""
    generator = torch.Generator().manual_seed(zlib.crc32(f"{label(config, seed)}/{rank}".encode()))
    values = torch.randn(case_length(config, scale), generator=generator, dtype=torch.float64)
    return values.to(NUMBERS[config["numbers"]][0])


def run_sweep(impl, algorithm: str, seed: int, scale: int, group_sizes):
    """On each rank: {case: the calls of the first all-reduce, the tensor after each of two,
    whether the first returned its argument, and what a strided case's base holds between}."""
    function = getattr(impl.module("collectives"), algorithm)
    world, rank = dist.get_world_size(), dist.get_rank()
    handles, results = {}, {}
    for entry in sweep_plan(world, seed, algorithm, group_sizes):
        config = entry["config"]
        layout_key = (config["n"], config["layout"])
        if layout_key not in handles:  # new_group is collective: every rank makes every group
            handles[layout_key] = [dist.new_group(members) for members in entry["groups"]]
            dist.barrier()  # every rank connected in them: one failing at once breaks no peer's
        members = group_of(rank, entry["groups"])
        group = (None if config["layout"] == "world"
                 else handles[layout_key][entry["groups"].index(members)])
        values = case_input(config, rank, seed, scale).to(current_device())
        base = None
        if config["tensor"] == "strided":
            base = torch.full((2 * values.numel(),), UNTOUCHED, dtype=values.dtype,
                              device=values.device)
            tensor = base[::2]
            tensor.copy_(values)
        else:
            tensor = values
        with CommTracer(peers=members) as trace:  # a peer outside the group: refused at once
            returned = function(tensor, group)
        first = tensor.cpu().clone()
        function(tensor, group)
        results[entry["key"]] = {
            "calls": [call.as_data() for call in trace.calls], "first": first,
            "second": tensor.cpu().clone(), "returned its argument": returned is tensor,
            "between": None if base is None else base[1::2].cpu()}
    return results


def check_sweep(impl, run_on_ranks, world: int, algorithm: str, seed: int, scale: int = 3,
                group_sizes=None) -> None:
    """Every case of a sweep: the contract on every rank, then the values on every rank."""
    results = run_on_ranks(run_sweep, world, impl, algorithm, seed, scale, group_sizes,
                           timeout=TIMEOUT)
    plan = sweep_plan(world, seed, algorithm, group_sizes)
    for entry in plan:
        for rank in range(world):
            check_calls(entry, rank, results[rank][entry["key"]], algorithm, scale)
    for entry in plan:
        for rank in range(world):
            check_values(entry, rank, results, algorithm, seed, scale)


def _without_peer(calls):
    return [{**call, "peer": None} for call in calls]


def _without_size(calls):
    return [{**call, "nbytes": 0} for call in calls]


def check_calls(entry, rank: int, found: dict, algorithm: str, scale: int) -> None:
    """The first call's sends and receives against the lab's formula (module docstring)."""
    config = entry["config"]
    members = sorted(group_of(rank, entry["groups"]))
    n, index = len(members), members.index(rank)
    numel = case_length(config, scale)
    nbytes = numel * torch.tensor([], dtype=NUMBERS[config["numbers"]][0]).element_size()
    what = f"{algorithm} ({entry['key']})"
    calls = found["calls"]
    if algorithm == RING:
        right, left = members[(index + 1) % n], members[(index - 1) % n]
        steps = 2 * (n - 1) if n > 1 else 0
        wanted = ([expected("isend", members, nbytes // n, right)] * steps
                  + [expected("recv", members, nbytes // n, left)] * steps)
        if numel % n:  # chunks of two lengths: their number, peers and group are checked
            calls, wanted = _without_size(calls), _without_size(wanted)
    else:
        steps = round(math.log2(n))
        wanted = ([expected("isend", members, nbytes)] * steps
                  + [expected("recv", members, nbytes)] * steps)
        partners = [call["peer"] for call in calls if call["op"] == "isend"]
        assert len(set(partners)) == len(partners) and rank not in partners, (
            f"{what} on rank {rank} sent to the ranks {partners} of its group {members}: each of "
            "the log2(n) steps has another partner, never the rank itself")
        calls = _without_peer(calls)
    check_contract(calls, wanted, what, rank=rank, formula=FORMULAS[algorithm])


def check_values(entry, rank: int, results, algorithm: str, seed: int, scale: int) -> None:
    """The tensor after each of the two calls against the group's sum (float64, here)."""
    config, key = entry["config"], entry["key"]
    found = results[rank][key]
    members = group_of(rank, entry["groups"])
    what = f"{algorithm} ({label(config, seed)})"
    tolerance = NUMBERS[config["numbers"]][1]
    inputs = {r: case_input(config, r, seed, scale).double() for r in range(len(results))}
    total = sum(inputs[r] for r in members)
    mistakes = {"the tensor is this rank's input: nothing was summed into it in place":
                inputs[rank]} if len(members) > 1 else {}
    mistakes.update({f"the tensor is rank {r}'s input: received tensors replaced this rank's "
                     "instead of being added": inputs[r] for r in members if r != rank})
    if len(members) < len(results):
        mistakes["the sum is over every rank of the world, not over the group"] = sum(inputs.values())
    assert_close_naming(found["first"], total, f"{what}'s result", rank=rank, mistakes=mistakes,
                        otherwise="the steps: the notebook, part 3, says what every rank holds "
                                  "after each one", against="the group's sum", **tolerance)
    assert found["returned its argument"], (
        f"{what} on rank {rank} returned another tensor than the one it was given: it sums in "
        "place and returns its argument")
    if found["between"] is not None:
        assert_close(found["between"], torch.full_like(found["between"], UNTOUCHED),
                     f"the elements between those of the strided view passed to {algorithm} "
                     f"({label(config, seed)})", rank=rank, against="their values before",
                     likely_cause="the all-reduce wrote outside the view it was given", atol=0, rtol=0)
    again = sum(results[r][key]["first"].double() for r in members)
    assert_close(found["second"], again, f"{what}'s result when called again on its own result",
                 rank=rank, against="the group's sum of the first call's results",
                 likely_cause="state kept between calls (a buffer reused, a chunk list cached)",
                 **tolerance)


def test_ring_all_reduce_swept_on_4_ranks(impl, run_on_ranks, sweep_seed):
    check_sweep(impl, run_on_ranks, 4, RING, sweep_seed)


def test_ring_all_reduce_on_3_ranks(impl, run_on_ranks, sweep_seed):
    check_sweep(impl, run_on_ranks, 3, RING, sweep_seed)


def test_recursive_doubling_all_reduce_swept_on_4_ranks(impl, run_on_ranks, sweep_seed):
    check_sweep(impl, run_on_ranks, 4, DOUBLING, sweep_seed)


# ----------------------------------------------------------------- the alpha-beta models

def alpha_beta_calls(impl, calls):
    """[alpha_beta.<function>(*args)] for (function, args) in ``calls``, as plain data; an
    exception other than the stub's is returned as its text, for the test to explain."""
    module = impl.module("alpha_beta")
    found = []
    for function, args in calls:
        try:
            result = getattr(module, function)(*args)
        except NotImplementedError:
            raise
        except Exception as error:  # noqa: BLE001 - the test names the case it came from
            found.append({"error": f"{type(error).__name__}: {error}"})
            continue
        if isinstance(result, (tuple, list)):
            found.append([r if isinstance(r, str) else float(r) for r in result])
        else:
            found.append(result if isinstance(result, str) else float(result))
    return found


def called(function: str, args) -> str:
    shown = ", ".join(f"{a:g}" if isinstance(a, float) else str(a) for a in args)
    return f"{function}({shown})"


def raised(got, call: str, hint: str = "") -> None:
    if isinstance(got, dict):
        raise AssertionError(f"{call} raised {got['error']}" + (f": {hint}" if hint else ""))


def check_models(impl, run_alone, cases: list[dict]) -> None:
    """ring_all_reduce_seconds and recursive_doubling_seconds against the reference's times."""
    calls = [(function, case["args"]) for case in cases
             for function in ("ring_all_reduce_seconds", "recursive_doubling_seconds")]
    got = iter(run_alone(alpha_beta_calls, impl, calls))
    for case in cases:
        nbytes, n, alpha, bandwidth = case["args"]
        for function, want, formula in (
                ("ring_all_reduce_seconds", case["ring"], "2(n-1)*alpha + 2(n-1)/n * S/B"),
                ("recursive_doubling_seconds", case["doubling"], "log2(n) * (alpha + S/B)")):
            value, call = next(got), called(function, case["args"])
            raised(value, call)
            cause = ""
            if function == "ring_all_reduce_seconds" and n > 1 and value == pytest.approx(
                    want - (n - 1) / n * nbytes / bandwidth, rel=RELATIVE):
                cause = (": the bandwidth term counts each byte once, but a ring all-reduce "
                         "sends it twice (the reduce-scatter, then the all-gather)")
            if function == "recursive_doubling_seconds" and n > 2 and value == pytest.approx(
                    want - (math.log2(n) - 1) * nbytes / bandwidth, rel=RELATIVE):
                cause = (": the whole tensor is counted once, but every one of the log2(n) steps "
                         "sends all of it")
            assert value == pytest.approx(want, rel=RELATIVE), (
                f"{call} = {value}, expected {formula} = {want}{cause}")


def test_all_reduce_times_are_the_alpha_beta_formulas(impl, run_alone):
    check_models(impl, run_alone, snapshot("lab0", "models"))


def check_crossovers(impl, run_alone, cases: list[dict]) -> None:
    got = run_alone(alpha_beta_calls, impl, [("crossover_bytes", case["args"]) for case in cases])
    for case, value in zip(cases, got):
        n = case["args"][0]
        call = called("crossover_bytes", case["args"])
        raised(value, call, "on 1 or 2 ranks the ring's bandwidth term is no smaller than "
                            "recursive doubling's, so the ring never catches up: math.inf"
               if n <= 2 else "")
        if math.isinf(case["bytes"]):
            assert value == math.inf, (
                f"{call} = {value}, expected math.inf: on {n} rank(s) the ring is never the "
                "faster (its latency term is no smaller and its bandwidth term no smaller)")
            continue
        assert value == pytest.approx(case["bytes"], rel=RELATIVE), (
            f"{call} = {value:.6g} bytes, expected {case['bytes']:.6g}: the size S at which "
            "2(n-1)*alpha + 2(n-1)/n * S/B equals log2(n) * (alpha + S/B)")


def test_crossover_is_where_ring_and_doubling_take_the_same_time(impl, run_alone):
    check_crossovers(impl, run_alone, snapshot("lab0", "crossovers"))


def check_choices(impl, run_alone, cases: list[dict]) -> None:
    got = run_alone(alpha_beta_calls, impl, [("faster_all_reduce", case["args"]) for case in cases])
    for case, value in zip(cases, got):
        nbytes, n, alpha, bandwidth = case["args"]
        call = called("faster_all_reduce", case["args"])
        raised(value, call, f"recursive doubling cannot run on {n} ranks: the ring is the only "
                            "choice there" if not power_of_two(n) else "")
        if n == 1:
            cause = "on 1 rank both take no time, and a tie goes to the ring"
        elif case.get("tie"):
            cause = ("at the crossover size both take the same time (to the bit), and a tie "
                     "goes to the ring: recursive doubling only where it is strictly faster")
        elif not power_of_two(n):
            cause = f"recursive doubling cannot run on {n} ranks (not a power of two)"
        else:
            cause = ("below the crossover size recursive doubling is faster (fewer latencies), "
                     "above it the ring (fewer bytes)")
        assert value == case["choice"], f"{call} = {value!r}, expected {case['choice']!r}: {cause}"


def test_faster_all_reduce_picks_by_the_model(impl, run_alone):
    check_choices(impl, run_alone, snapshot("lab0", "choices"))


def check_fits(impl, run_alone, cases: list[dict]) -> None:
    """The line and the fit of exact data (the parameters back) and of noisy data (the
    reference's fit)."""
    calls = []
    for case in cases:
        calls += [("fit_line", (case["nbytes"], case["noisy"])),
                  ("fit_alpha_beta", (case["nbytes"], case["exact"], case["n"])),
                  ("fit_alpha_beta", (case["nbytes"], case["noisy"], case["n"]))]
    got = iter(run_alone(alpha_beta_calls, impl, calls))
    for case in cases:
        n, line, exact, noisy = case["n"], next(got), next(got), next(got)
        for value, call in ((line, "fit_line"), (exact, "fit_alpha_beta"), (noisy, "fit_alpha_beta")):
            raised(value, f"{call} on {len(case['nbytes'])} points of {n} ranks")
        assert line == pytest.approx(case["line"], rel=FIT_RELATIVE), (
            f"fit_line on {len(case['nbytes'])} noisy points = (intercept, slope) {tuple(line)}, "
            f"the least-squares line is {tuple(case['line'])}")
        for (alpha, bandwidth), (want_alpha, want_bandwidth), data in (
                (exact, (case["alpha"], case["bandwidth"]), "exact times made with them"),
                (noisy, case["fitted"], "noisy times (the reference's fit)")):
            assert alpha == pytest.approx(want_alpha, rel=FIT_RELATIVE), (
                f"fit_alpha_beta on {n} ranks, {data}: alpha {alpha:g} s, expected "
                f"{want_alpha:g} s: the intercept of the fitted line is 2(n-1)*alpha")
            assert bandwidth == pytest.approx(want_bandwidth, rel=FIT_RELATIVE), (
                f"fit_alpha_beta on {n} ranks, {data}: bandwidth {bandwidth:g} B/s, expected "
                f"{want_bandwidth:g}: the slope of the fitted line is 2(n-1)/(n*B)")


def test_fit_alpha_beta_recovers_the_model(impl, run_alone):
    check_fits(impl, run_alone, snapshot("lab0", "fits"))


def check_plans(impl, run_alone, cases: list[dict]) -> None:
    got = run_alone(alpha_beta_calls, impl,
                    [("all_reduce_plan", (c["nbytes"], c["seconds"], c["n"])) for c in cases])
    for case, plan in zip(cases, got):
        call = f"all_reduce_plan on {len(case['nbytes'])} measured sizes of {case['n']} ranks"
        raised(plan, call)
        wrong = [f"{size:g} bytes: {mine!r}, expected {want!r}"
                 for size, mine, want in zip(case["nbytes"], plan, case["plan"]) if mine != want]
        counted = f"{len(plan)} choices for {len(case['plan'])} sizes"
        assert not wrong and len(plan) == len(case["plan"]), (
            f"{call}: {'; '.join(wrong[:3]) or counted}: fit alpha and B to the measurements, "
            "then choose at each size with them")


def test_all_reduce_plan_from_measurements(impl, run_alone):
    check_plans(impl, run_alone, snapshot("lab0", "plans"))
