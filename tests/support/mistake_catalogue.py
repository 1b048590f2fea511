"""The mistakes students make, one entry each, and the graded test that must catch each one.

Every entry is a mutation of the reference solution (the text ``find``, which must occur exactly
once in the student file ``module``'s reference module, becomes ``replace``): handed in as a
submission, the graded tests selected by ``select`` (a ``pytest -k`` expression) in ``lab`` must
fail, and their output must contain ``message``, the words that name the mistake.
``tests/course/test_mistake_catalogue.py`` hands in every entry and checks both.

This file holds solution lines, so the student handout leaves it out.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Mistake:
    name: str  # what the student did, in a student's words
    lab: str  # "lab2"
    module: str  # the student file, without .py: "tp_layers"
    find: str  # exact text of the reference module (once)
    replace: str  # what the student wrote instead
    select: str  # pytest -k expression: the graded tests that must catch it
    message: str  # a substring of their failure output that names the mistake


# ---------------------------------------------------------------- lab 0 and lab 1
LAB0_LAB1: list[Mistake] = [
    Mistake("recursive doubling's exchange without its group", "lab0", "collectives",
            "        _swap(flat, received, partner, partner, group)\n",
            "        _swap(flat, received, partner, partner, None)\n", "recursive_doubling",
            "a peer given as a rank in the group where the call takes a global rank"),
    Mistake("a tie at the crossover given to recursive doubling", "lab0", "alpha_beta",
            "nbytes < crossover_bytes(n, alpha, bandwidth)",
            "nbytes <= crossover_bytes(n, alpha, bandwidth)", "faster_all_reduce",
            "a tie goes to the ring"),
    Mistake("the reduce-scatter overwrites the chunk it receives into instead of adding",
            "lab0", "collectives", "        chunks[receive_index] += received\n",
            "        chunks[receive_index].copy_(received)\n",
            "reduce_scatter_phase",
            "replaced this rank's copy instead of being added"),
    Mistake("the ring all-reduce's bandwidth term counts each byte once", "lab0", "alpha_beta",
            "2 * (n - 1) / n * nbytes / bandwidth", "(n - 1) / n * nbytes / bandwidth",
            "alpha_beta_formula", "a ring all-reduce sends it twice"),
    Mistake("alpha read off as the fitted line's intercept", "lab0", "alpha_beta",
            "return intercept / (2 * (n - 1)), ", "return intercept, ",
            "fit_alpha_beta", "the intercept of the fitted line is 2(n-1)*alpha"),
    Mistake("the ring's remainder given to the last chunks instead of the first", "lab0",
            "collectives", "base + 1 if index < extra else base",
            "base + 1 if index >= n - extra else base", "ring_chunks",
            "the longer chunks come first"),
    Mistake("recursive doubling overwrites its tensor with the partner's instead of adding",
            "lab0", "collectives", "        flat += received\n", "        flat.copy_(received)\n",
            "recursive_doubling", "received tensors replaced this rank's instead of being added"),
    Mistake("the crossover divides by the bandwidth terms' difference on 1 or 2 ranks", "lab0",
            "alpha_beta", "    if extra_per_byte <= 0:\n        return math.inf\n", "",
            "crossover", "the ring never catches up: math.inf"),
    Mistake("recursive doubling chosen on 1 rank, where both take no time", "lab0", "alpha_beta",
            "if n & (n - 1) or n == 1:", "if n & (n - 1):", "faster_all_reduce",
            "a tie goes to the ring"),
    Mistake("the order's first axis numbered slowest instead of fastest", "lab1", "groups",
            "strides = {axis: prod(sizes[a] for a in axes[:i])",
            "strides = {axis: prod(sizes[a] for a in axes[i + 1:])",
            "rank_positions or layout_groups", "the order's first axis must vary fastest"),
    Mistake("dp_rank as the position along the RDP axis, not the index in the DP group", "lab1",
            "groups", 'dp_rank=index_in(groups["DP"], rank)', 'dp_rank=positions[rank]["rdp"]',
            "layout_groups", "the rank's index in its DP_GROUP"),
    Mistake("every rank keeps the last group of each kind, not its own", "lab1",
            "process_groups", "            if rank in members:\n                mine",
            "            if True:\n                mine",
            "new_groups_gives", "each rank keeps the group of each kind that it belongs to"),
    Mistake("a group keyed by the axes it varies instead of the ones it fixes", "lab1", "groups",
            "if axis not in varying)\n        members.setdefault",
            "if axis in varying)\n        members.setdefault",
            "groups_along", "which the group does not vary"),
    Mistake("the grid's dimensions fastest axis first, as the layout lists them", "lab1",
            "groups", "names = tuple(reversed(layout.axes))", "names = tuple(layout.axes)",
            "rank_mesh", "its dimensions go slowest axis first"),
    Mistake("the group rank read with the digits' weights reversed", "lab1", "groups",
            "for name, size in zip(names, mesh.shape):",
            "for name, size in zip(reversed(names), reversed(mesh.shape)):",
            "mesh_position_and_group_rank", "the grid's later dimensions the less significant"),
    Mistake("the members' all-reduce over the world instead of the group", "lab1",
            "process_groups", "dist.all_reduce(mask, group=group)", "dist.all_reduce(mask)",
            "members_by_all_reduce", "(another group)"),
]

# ---------------------------------------------------------------- lab 2 and lab 3
LAYERNORM_COPIES = "self.ln1, self.ln2 = copy.deepcopy(block.ln1), copy.deepcopy(block.ln2)"
ATTENTION_CORE = "heads = attention_core(q, k, v, self.attention)"
TARGET_LOGIT = ("target_logit = logits.gather(-1, local_targets.unsqueeze(-1)).squeeze(-1) - "
                "maximum")
EMBEDDING_SUM = "return reduce_from_tp(local.masked_fill(elsewhere.unsqueeze(-1), 0.0), self.group)"
LAB2_LAB3: list[Mistake] = [
    Mistake("the heads merged back by a plain reshape", "lab3", "tp_attention",
            "        return self.proj(merge_heads(heads))",
            "        return self.proj(heads.reshape(x.shape[0], x.shape[1], -1))",
            "matches_single_device", "merged back by a plain reshape"),
    Mistake("copy_to_tp's backward averages instead of summing", "lab2", "tp_collectives",
            "        return _all_reduce(grad, ctx.group), None\n",
            "        return _all_reduce(grad, ctx.group) / dist.get_world_size(ctx.group), None\n",
            "sagemaker", "copy_to_tp's backward"),
    Mistake("ln2 copied from the block's ln1", "lab3", "tp_attention",
            "copy.deepcopy(block.ln1), copy.deepcopy(block.ln2)",
            "copy.deepcopy(block.ln1), copy.deepcopy(block.ln1)", "every_layout",
            "is not the block's ln2.weight"),
    Mistake("the padded LM head made in the default dtype", "lab3", "vocab_parallel",
            "device=linear.weight.device, dtype=linear.weight.dtype)",
            "device=linear.weight.device)", "embedding", "the padded layer takes the head's dtype"),
    Mistake("copy_to_tp's backward passes the gradient on, without the all-reduce", "lab2",
            "tp_collectives", "return _all_reduce(grad, ctx.group), None", "return grad, None",
            "copy_to_tp_is_identity", "copy_to_tp's backward does not all-reduce"),
    Mistake("reduce_from_tp all-reduces in the backward too", "lab2", "tp_collectives",
            "        return grad, None\n", "        return _all_reduce(grad, ctx.group), None\n",
            "reduce_from_tp_is_all_reduce", "reduce_from_tp's backward all-reduces too"),
    Mistake("the row-parallel bias added on every rank, before the all-reduce", "lab2",
            "tp_layers",
            "y = reduce_from_tp(F.linear(x, self.weight), self.group)\n"
            "        return y + self.bias if self.bias is not None else y",
            "return reduce_from_tp(F.linear(x, self.weight, self.bias), self.group)",
            "layers_honour_their_group", "bias was added on every rank before the all-reduce"),
    Mistake("the fused blocks split as one contiguous tensor", "lab2", "tp_layers",
            "pieces = [block.chunk(tp, dim=dim)[rank] for block in full.chunk(blocks, dim=dim)]",
            "pieces = [full.chunk(tp, dim=dim)[rank]]", "shard_keeps_piece",
            "fused blocks were split as one contiguous tensor"),
    # lab 2: groups that are not the world
    Mistake("reduce_from_tp sums over the world, not its group", "lab2", "tp_collectives",
            "return _all_reduce(x, group)", "return _all_reduce(x, None)",
            "reduce_from_tp_is_all_reduce", "not over the group it was given"),
    Mistake("copy_to_tp's backward sums over the world, not its group", "lab2",
            "tp_collectives", "return _all_reduce(grad, ctx.group), None",
            "return _all_reduce(grad, None), None", "copy_to_tp_is_identity",
            "not over the group it was given"),
    Mistake("a shard chosen by the rank in the world", "lab2", "tp_layers",
            "tp, rank = dist.get_world_size(group), dist.get_rank(group)",
            "tp, rank = dist.get_world_size(group), dist.get_rank()",
            "sharded_parameter_and_unshard", "chosen by the rank in the world, not in the group"),
    Mistake("a shard cut in as many pieces as the world has ranks", "lab2", "tp_layers",
            "tp, rank = dist.get_world_size(group), dist.get_rank(group)",
            "tp, rank = dist.get_world_size(), dist.get_rank(group)",
            "sharded_parameter_and_unshard", "tp was taken as the world's size"),
    Mistake("unshard gathers over the world", "lab2", "tp_layers",
            "pieces = all_gather_along(local, dim, group)",
            "pieces = all_gather_along(local, dim, None)", "sharded_parameter_and_unshard",
            "gathered over the world"),
    # lab 2: causes read from the values
    Mistake("unshard joins the gathered shards rank by rank", "lab2", "tp_layers",
            "return torch.cat([pieces[r * blocks + b] for b in range(blocks) for r in range(tp)], "
            "dim=dim)", "return torch.cat(pieces, dim=dim)", "sharded_parameter_and_unshard",
            "joined rank by rank"),
    Mistake("unshard gathers a replicated parameter too", "lab2", "tp_layers",
            "    if dim is None:\n        return local\n",
            "    if dim is None:\n        return all_gather_along(local, 0, group)\n",
            "sharded_parameter_and_unshard", "a parameter without tp_dim was gathered"),
    Mistake("sharded_parameter drops the blocks", "lab2", "tp_layers",
            "nn.Parameter(shard(full.detach(), dim, rank, tp, blocks))",
            "nn.Parameter(shard(full.detach(), dim, rank, tp))",
            "sharded_parameter_and_unshard", "the blocks were not passed on"),
    Mistake("the distributed linear's bias gradient left unsummed", "lab2", "sagemaker_linear",
            "return y + copy_to_tp(self.bias, self.group) if self.bias is not None else y",
            "return y + self.bias if self.bias is not None else y",
            "data_parallel_linear and tp2", "this rank's own samples' part only"),
    Mistake("the distributed linear's samples gathered with gather_from_tp", "lab2",
            "sagemaker_linear", "samples = gather_from_sp(x, BATCH_DIM, self.group)",
            "from reference_impl.tp.tp_collectives import gather_from_tp\n"
            "        samples = gather_from_tp(x, BATCH_DIM, self.group)",
            "data_parallel_linear and tp2", "kept this rank's slice"),
    Mistake("the distributed linear's bias added before the reduce-scatter", "lab2",
            "sagemaker_linear",
            "y = reduce_scatter_to_sp(F.linear(samples, self.weight), BATCH_DIM, self.group)\n"
            "        return y + copy_to_tp(self.bias, self.group) if self.bias is not None else y",
            "return reduce_scatter_to_sp(F.linear(samples, self.weight, self.bias), BATCH_DIM, "
            "self.group)", "data_parallel_linear and tp2",
            "added to every rank's partial outputs"),
    # lab 2: an oracle the submission could share
    Mistake("the row-parallel bias shared with the nn.Linear", "lab2", "tp_layers",
            "self.bias = nn.Parameter(linear.bias.detach().clone()) if linear.bias is not None "
            "else None", "self.bias = linear.bias", "layers_honour_their_group",
            "shares this parameter with the single-device module"),
    Mistake("the distributed linear's bias shared with the nn.Linear", "lab2",
            "sagemaker_linear",
            "self.bias = nn.Parameter(linear.bias.detach().clone()) if linear.bias is not None "
            "else None", "self.bias = linear.bias", "data_parallel_linear and tp2",
            "shares this parameter with the nn.Linear it was built"),
    Mistake("the fused QKV split without blocks (contiguously)", "lab3", "tp_attention",
            "ColumnParallelLinear(attention.qkv, group, blocks=3)",
            "ColumnParallelLinear(attention.qkv, group)", "each_rank_computes_its_heads",
            "fused QKV weight was split contiguously"),
    Mistake("every head on every rank", "lab3", "tp_attention",
            "self.heads = attention.heads // tp", "self.heads = attention.heads",
            "each_rank_computes_its_heads", "every head on every rank"),
    Mistake("the projection's bias added on every rank, before the all-reduce", "lab3",
            "tp_attention",
            "return self.proj(merge_heads(heads))",
            "import torch.nn.functional as F\n"
            "        from reference_impl.tp.tp_collectives import reduce_from_tp\n"
            "        partial = F.linear(merge_heads(heads), self.proj.weight, self.proj.bias)\n"
            "        return reduce_from_tp(partial, self.proj.group)",
            "each_rank_computes_its_heads", "projection's bias was added on every rank"),
    Mistake("each rank subtracts its local maximum, not the group's", "lab3", "vocab_parallel",
            "        dist.all_reduce(maximum, op=dist.ReduceOp.MAX, group=group)\n", "",
            "vocab_parallel_losses", "each rank subtracted its own (local) maximum"),
    Mistake("the target's logit taken on every rank, not only where it lives", "lab3",
            "vocab_parallel", "        target_logit = target_logit.masked_fill(~mine, 0.0)\n", "",
            "vocab_parallel_losses", "the target's logit was counted on every rank"),
    Mistake("the backward subtracts the one_hot on every rank", "lab3", "vocab_parallel",
            "F.one_hot(local_targets, softmax.shape[-1]) * mine.unsqueeze(-1)",
            "F.one_hot(local_targets, softmax.shape[-1])", "vocab_parallel_gradient",
            "the one_hot of the target was subtracted on every rank"),
    # an oracle the submission could share: the module it was built from is checked too
    Mistake("the block's first layernorm shared with the single-device block", "lab3",
            "tp_attention", LAYERNORM_COPIES,
            "self.ln1, self.ln2 = block.ln1, copy.deepcopy(block.ln2)",
            "block_matches and h16", "shares this parameter with the single-device module"),
    Mistake("both layernorms shared with the single-device block", "lab3", "tp_attention",
            LAYERNORM_COPIES, "self.ln1, self.ln2 = block.ln1, block.ln2", "two_groups",
            "shares this parameter with the single-device module"),
    # the exercise itself: its forward is not inherited
    Mistake("ParallelSelfAttention's forward left out, the single-device one inherited", "lab3",
            "tp_attention", "    def forward(self, x):\n        q, k, v = split_heads",
            "    def _forward(self, x):\n        q, k, v = split_heads",
            "tp_attention_matches and h16", "has no forward of its own"),
    # causes read from the failing values
    Mistake("the attention scale taken from the rank's width, 1/sqrt(h/tp)", "lab3",
            "tp_attention", ATTENTION_CORE,
            "heads = attention_core(q / self.heads ** 0.5, k, v, self.attention)",
            "tp_attention_matches and h16", "the attention scale is 1/sqrt(h/tp)"),
    Mistake("the attention scores left unscaled", "lab3", "tp_attention", ATTENTION_CORE,
            "heads = attention_core(q * q.shape[-1] ** 0.5, k, v, self.attention)",
            "tp_attention_matches and h16", "the attention scores are not scaled"),
    Mistake("the maximum not taken off the target's logit", "lab3", "vocab_parallel",
            TARGET_LOGIT, TARGET_LOGIT.replace(" - maximum", ""),
            "vocab_parallel_losses", "off by exactly the global maximum logit"),
    Mistake("the target's logit all-reduced with MAX", "lab3", "vocab_parallel",
            "        dist.all_reduce(target_logit, group=group)\n",
            "        dist.all_reduce(target_logit, op=dist.ReduceOp.MAX, group=group)\n",
            "vocab_parallel_losses", "all-reduced with MAX"),
    Mistake("a target on the first logit of a slice claimed by no rank", "lab3",
            "vocab_parallel", "mine = (targets >= start) & (targets < end)",
            "mine = (targets > start) & (targets < end)", "vocab_parallel_losses",
            "no rank claimed them"),
    # groups that are not the world
    Mistake("the target's logit summed over the world, not the TP group", "lab3",
            "vocab_parallel", "        dist.all_reduce(target_logit, group=group)\n",
            "        dist.all_reduce(target_logit)\n", "vocab_parallel_losses",
            "reduced over `group` only"),
    Mistake("the embedding's rows summed over the world, not the TP group", "lab3",
            "vocab_parallel", EMBEDDING_SUM, EMBEDDING_SUM.replace("self.group)", "None)"),
            "vocab_parallel_embedding", "one all-reduce over `group`"),
    # sizes that do not divide: the padded vocabulary
    Mistake("the padded logits counted in the sum of exp", "lab3", "vocab_parallel",
            "exp = (logits - maximum.unsqueeze(-1)).exp()",
            "exp = (local_logits.float() - maximum.unsqueeze(-1)).exp()",
            "vocab_parallel_losses", "the padded logits (past vocab_size) were counted"),
    Mistake("the embedding reads row 0 of its slice for tokens another rank holds", "lab3",
            "vocab_parallel", EMBEDDING_SUM, "return reduce_from_tp(local, self.group)",
            "vocab_parallel_embedding", "the tokens held by another rank were not zeroed"),
    Mistake("the padded logits not masked", "lab3", "vocab_parallel",
            'logits = local_logits.float().masked_fill(padding, float("-inf"))',
            "logits = local_logits.float()", "vocab_parallel_losses",
            "the padded logits (past vocab_size) were counted"),
    Mistake("a rank's range of the vocabulary numbered in the world, not in its group", "lab3",
            "vocab_parallel", "start = dist.get_rank(group) * local_size",
            "start = dist.get_rank() * local_size", "vocab_parallel_embedding",
            "its rank in the world, not its rank in `group`"),
    # lab 3: the sweeps' layouts
    Mistake("the attention's heads divided by the world's size", "lab3", "tp_attention",
            "self.heads = attention.heads // tp",
            "self.heads = attention.heads // dist.get_world_size()", "every_layout and tp2",
            "divided by the world's size, not the TP group's"),
    Mistake("a rank's range of the vocabulary from its world rank modulo tp", "lab3",
            "vocab_parallel", "start = dist.get_rank(group) * local_size",
            "start = dist.get_rank() % dist.get_world_size(group) * local_size",
            "vocab_parallel_embedding", "world rank modulo tp"),
    # lab 2: a gradient tensor shared by an add; fused variants with a bias
    Mistake("copy_to_tp's backward all-reduces the incoming gradient in place", "lab2",
            "tp_collectives", "return _all_reduce(grad, ctx.group), None",
            "dist.all_reduce(grad, group=ctx.group)\n        return grad, None",
            "copy_to_tp_is_identity", "all-reduced the incoming gradient in place"),
    Mistake("the fused bias split as one contiguous tensor", "lab2", "tp_layers",
            "self.bias = (sharded_parameter(linear.bias, 0, group, blocks)",
            "self.bias = (sharded_parameter(linear.bias, 0, group)",
            "layers_honour_their_group", "the fused bias was split as one contiguous tensor"),
    # lab 2: the sweeps' layouts and dtypes
    Mistake("a shard's piece chosen by the world rank modulo tp", "lab2", "tp_layers",
            "tp, rank = dist.get_world_size(group), dist.get_rank(group)",
            "tp = dist.get_world_size(group)\n    rank = dist.get_rank() % tp",
            "sharded_parameter_and_unshard", "chosen by the world rank modulo tp"),
    Mistake("a shard made fp32 whatever its tensor's dtype", "lab2", "tp_layers",
            "nn.Parameter(shard(full.detach(), dim, rank, tp, blocks))",
            "nn.Parameter(shard(full.detach(), dim, rank, tp, blocks).float())",
            "sharded_parameter_and_unshard", "a shard keeps its tensor's dtype"),
    Mistake("the distributed linear's columns chosen by the world rank modulo tp", "lab2",
            "sagemaker_linear", "first = dist.get_rank(self.group) * self.columns",
            "first = dist.get_rank() % dist.get_world_size(self.group) * self.columns",
            "data_parallel_linear and tp2", "tp 2, layout strided"),
]

# ---------------------------------------------------------------- lab 4
PIPELINES = "pipelined_step and strided"  # two pipelines, one request per batch (NCCL)
TAGGED = ("(outgoing.contiguous(), message.dst, message.tag) for message in planned.sends]\n"
          "        for message in planned.receives:\n"
          "            arrived[message] = torch.empty(tuple(boundary_shape), dtype=boundary_dtype,\n"
          "                                           device=device)\n"
          "        send_works, receive_works = post_exchange(\n"
          "            sends, [(arrived[message], message.src, message.tag)")
GLOBAL_PEER = "global_peer = peer if group is None else dist.get_global_rank(group, peer)"
ONE_REQUEST_EACH = ("    if len(works) == len(operations):  # one request per operation (gloo)\n"
                    "        return works[:len(sends)], works[len(sends):]\n")
LAB4: list[Mistake] = [
    Mistake("one receive buffer for every message of an exchange", "lab4", "pipeline_executor",
            "        for message in planned.receives:\n"
            "            arrived[message] = torch.empty(tuple(boundary_shape), dtype=boundary_dtype,\n"
            "                                           device=device)\n",
            "        buffer = torch.empty(tuple(boundary_shape), dtype=boundary_dtype, device=device)\n"
            "        for message in planned.receives:\n"
            "            arrived[message] = buffer\n",
            "pipelined_step and interleaved", "two receives into one buffer"),
    Mistake("one receive buffer kept across the step's exchanges", "lab4", "pipeline_executor",
            "            arrived[message] = torch.empty(tuple(boundary_shape), dtype=boundary_dtype,\n"
            "                                           device=device)\n",
            "            arrived[message] = exchange.__dict__.setdefault(\"buffer\", torch.empty(\n"
            "                tuple(boundary_shape), dtype=boundary_dtype, device=device))\n",
            "pipelined_step", "changed after the forward used it"),
    Mistake("the last stage's forward keeps its output, the loss only recorded", "lab4",
            "pipeline_executor",
            "            y = context.loss_fn(y, context.targets[action.microbatch]) / context.microbatches\n"
            "            context.losses[action.microbatch] = y.detach()\n",
            "            context.losses[action.microbatch] = (\n"
            "                context.loss_fn(y, context.targets[action.microbatch])\n"
            "                / context.microbatches).detach()\n",
            "run_action_returns or pipelined_step", "run_action(B of stage 1) raised"),
    Mistake("the recorded loss left attached to its graph", "lab4", "pipeline_executor",
            "            context.losses[action.microbatch] = y.detach()\n",
            "            context.losses[action.microbatch] = y\n",
            "run_action_returns", "recorded its loss still attached"),
    Mistake("the clock offsets taken to rank 0, which one node's traces lack", "lab6",
            "trace_analysis", "    first = min(ends)\n", "    first = 0\n",
            "lowest_rank_given", "clock_offsets raised KeyError"),
    Mistake("the receive buffer made in the default dtype (float32)", "lab4", "pipeline_executor",
            "arrived[message] = torch.empty(tuple(boundary_shape), dtype=boundary_dtype,",
            "arrived[message] = torch.empty(tuple(boundary_shape),",
            "pipelined_step and fp64", "posted a receive into a buffer of dtype torch.float32"),
    Mistake("the output sent cast to fp32", "lab4", "pipeline_executor",
            "sends = [(outgoing.contiguous(), message.dst",
            "sends = [(outgoing.float().contiguous(), message.dst",
            "pipelined_step and fp64", "posted a send of dtype torch.float32"),
    Mistake("W leaves its entry in saved", "lab4", "pipeline_executor",
            "    saved.pop(key)\n    context.deferred.pop(key).flush()\n",
            "    context.deferred.pop(key).flush()\n",
            "splits_the_backward or (pipelined_step and zb)", "activation never freed"),
    Mistake("W flushes its store but leaves it in context.deferred", "lab4", "pipeline_executor",
            "    context.deferred.pop(key).flush()\n", "    context.deferred[key].flush()\n",
            "splits_the_backward", "context.deferred still holds"),
    Mistake("1F1B's warm-up one forward too many", "lab4", "pipeline_schedules",
            "warm_up = min(p - rank - 1, m)", "warm_up = min(p - rank, m)",
            "golden_order and one_f_one_b", "warm-up off by one"),
    Mistake("each send and each receive posted on its own", "lab4", "pipeline_executor",
            "    works = dist.batch_isend_irecv(operations)\n",
            "    works = [operation.op(operation.tensor, operation.peer, group, operation.tag)\n"
            "             for operation in operations]\n",
            "pipelined_step and 1f1b and not pipelines", "a send and a receive posted separately"),
    Mistake("the backward keeps its activations", "lab4", "pipeline_executor",
            "            del saved[key]\n", "",
            "run_action or pipelined_step", "activation never freed"),
    Mistake("the loss not divided by the number of microbatches", "lab4", "pipeline_executor",
            "y = context.loss_fn(y, context.targets[action.microbatch]) / context.microbatches",
            "y = context.loss_fn(y, context.targets[action.microbatch])",
            "run_action or pipelined_step", "the loss is not scaled by 1/m"),
    Mistake("the last stage sends its loss on", "lab4", "pipeline_executor",
            "return None if is_last else y.detach()", "return y.detach()",
            "run_action", "the last stage sends"),
    Mistake("one receive buffer kept for every step", "lab4", "pipeline_executor",
            "            arrived[message] = torch.empty(tuple(boundary_shape), dtype=boundary_dtype,\n"
            "                                           device=device)\n",
            "            arrived[message] = exchange.__dict__.setdefault('buffer', torch.empty(\n"
            "                tuple(boundary_shape), dtype=boundary_dtype, device=device))\n",
            "pipelined_step and gpipe", "changed after the forward used it"),
    Mistake("the last stage's forward keeps no loss", "lab4", "pipeline_executor",
            "            context.losses[action.microbatch] = y.detach()\n", "",
            "pipelined_step", "F on the last stage (microbatch 0): it must leave"),
    # what only NCCL does: one request for a coalesced batch
    Mistake("the batch's one request (NCCL) returned with the sends", "lab4",
            "pipeline_executor", "    return [], works  # one coalesced request (NCCL)\n",
            "    return works, []  # one coalesced request (NCCL)\n", PIPELINES,
            "before waiting for the request of the batch"),
    Mistake("the requests split as one per operation, as gloo returns them", "lab4",
            "pipeline_executor",
            ONE_REQUEST_EACH + "    return [], works  # one coalesced request (NCCL)\n",
            "    return works[:len(sends)], works[len(sends):]\n", PIPELINES,
            "before waiting for the request of the batch"),
    # a pipeline group that is not the world: torch raises first, the test names it
    Mistake("the peer left as the pipeline rank", "lab4", "pipeline_executor", GLOBAL_PEER,
            "global_peer = peer", PIPELINES, "a peer not translated to a global rank"),
    Mistake("the peer translated the wrong way (global to group)", "lab4",
            "pipeline_executor", GLOBAL_PEER,
            "global_peer = peer if group is None else dist.get_group_rank(group, peer)",
            PIPELINES, "a peer not translated to a global rank"),
    # the split backward (ZB-H1) is the student's too; sizes that do not divide the pipeline
    Mistake("the split backward frees its entry in B", "lab4", "pipeline_executor",
            "            saved[key] = (store,)  # the graph is freed; what W needs is kept\n",
            "            del saved[key]\n", "splits_the_backward",
            "keeps only its weight gradients' store"),
    Mistake("the whole and the split backward swapped", "lab4", "pipeline_executor",
            "        if context.split_backward:\n", "        if not context.split_backward:\n",
            "splits_the_backward", "keeps only its weight gradients' store"),
    Mistake("1F1B's warm-up not capped at m", "lab4", "pipeline_schedules",
            "warm_up = min(p - rank - 1, m)", "warm_up = p - rank - 1",
            "valid_for_every_size and one_f_one_b", "warm-up not capped at m"),
    # the sweeps' pipeline layouts and the messages' contract (peer, tag, bytes)
    Mistake("the peer taken as the pipeline's first global rank plus the pipeline rank", "lab4",
            "pipeline_executor", GLOBAL_PEER,
            "global_peer = peer if group is None else dist.get_global_rank(group, 0) + peer",
            PIPELINES, "a peer not translated to a global rank"),
    Mistake("every message posted with tag 0", "lab4", "pipeline_executor", TAGGED,
            TAGGED.replace("message.tag", "0"), "pipelined_step and consecutive",
            "post each message with its own tag"),
    Mistake("W frees its entry without adding the deferred weight gradients", "lab4",
            "pipeline_executor", "    context.deferred.pop(key).flush()\n",
            "    context.deferred.pop(key)\n", "splits_the_backward",
            "after W the stage's parameter 0 has no gradient"),
]

# ---------------------------------------------------------------- lab 5
ZERO1, ZERO2 = "zero_on_two_groups and zero1", "zero_on_two_groups and zero2"
DDP = "ddp_from_hooks"
LAB5: list[Mistake] = [
    Mistake("finish_gradient_sync leaves each bucket's handle behind", "lab5", "ddp_hooks",
            "bucket.handle, bucket.flat, bucket.ready = None, None, 0",
            "bucket.flat, bucket.ready = None, 0", "ddp_from_hooks", "holds its handle"),
    Mistake("ZeRO-1 reduces a parameter that got no gradient", "lab5", "zero",
            "            if param.grad is None:\n                continue\n"
            "            dist.all_reduce(param.grad, group=self.group)",
            "            dist.all_reduce(param.grad, group=self.group)",
            "no_gradient", "in ZeroOptimizer's reduce_gradients"),
    Mistake("ZeRO's gather buffer made in the default dtype", "lab5", "zero",
            "buffer = piece.new_empty(shard.padded)", "buffer = torch.empty(shard.padded)",
            "matches_unsharded", "in the default dtype (float32)"),
    Mistake("the bucket's sum written back without dividing by the group size", "lab5",
            "ddp_hooks", "            bucket.flat.div_(self.world_size)\n", "", DDP,
            "averaging forgotten"),
    Mistake("the async handles never waited before the step", "lab5", "ddp_hooks",
            "            bucket.handle.wait()\n", "", DDP,
            "waiting on handles missing before the step"),
    Mistake("a bucket launched at its first gradient instead of its last", "lab5",
            "ddp_hooks", "if bucket.ready == len(bucket.params):", "if bucket.ready == 1:", DDP,
            "flushed before all its gradients are ready"),
    Mistake("the hooks all-reduce inside no_sync too", "lab5", "ddp_hooks",
            "        if not self.require_sync:\n            return\n", "", DDP,
            "all-reducing during no_sync"),
    Mistake("the all-reduce over the world instead of the data-parallel group", "lab5",
            "ddp_hooks", "group=self.group, async_op=True", "async_op=True", DDP,
            "the wrong group"),
    # no_sync after an exception and when nested
    Mistake("no_sync puts the state back only when its block ends normally", "lab5",
            "ddp_hooks",
            "        try:\n            yield\n        finally:\n"
            "            self.require_sync = previous\n",
            "        yield\n        self.require_sync = previous\n", DDP,
            "synchronisation stayed off after the exception"),
    Mistake("no_sync switches synchronisation on when it ends", "lab5", "ddp_hooks",
            "            self.require_sync = previous\n", "            self.require_sync = True\n",
            DDP, "the nested no_sync switched synchronisation on"),
    # the ready count, named from the counts
    Mistake("the ready counts not reset after the step", "lab5", "ddp_hooks",
            "bucket.handle, bucket.flat, bucket.ready = None, None, 0",
            "bucket.handle, bucket.flat = None, None", DDP,
            "the count was not reset after the previous step"),
    Mistake("the hooks count under no_sync", "lab5", "ddp_hooks",
            "        if not self.require_sync:\n            return\n"
            "        bucket = self._bucket_of[param]\n        bucket.ready += 1\n",
            "        bucket = self._bucket_of[param]\n        bucket.ready += 1\n"
            "        if not self.require_sync:\n            return\n", DDP,
            "counted during no_sync"),
    # the sweep's group sizes tell the divisors apart; the contract counts the bytes
    Mistake("the bucket averaged by ReduceOp.AVG, then divided by the group size again", "lab5",
            "ddp_hooks", "dist.all_reduce(bucket.flat, group=self.group, async_op=True)",
            "dist.all_reduce(bucket.flat, op=dist.ReduceOp.AVG, group=self.group, "
            "async_op=True)", DDP, "averaged twice"),
    Mistake("the bucket's sum divided by the world size", "lab5", "ddp_hooks",
            "bucket.flat.div_(self.world_size)", "bucket.flat.div_(dist.get_world_size())", DDP,
            "divided by the world size 4, not the data-parallel group's size 2"),
    Mistake("the averaged bucket copied into a copy of .grad, .grad left the rank's own", "lab5",
            "ddp_hooks", "p.grad.copy_(bucket.flat[", "p.grad.clone().copy_(bucket.flat[", DDP,
            "it is this rank's own gradient"),
    Mistake("the bucket sent in fp32 whatever the gradients' dtype", "lab5", "ddp_hooks",
            "bucket.flat = torch.cat([p.grad.reshape(-1) for p in bucket.params])",
            "bucket.flat = torch.cat([p.grad.reshape(-1) for p in bucket.params]).float()", DDP,
            "(2 times the bytes)"),
    # data_parallel
    Mistake("SageMaker's rule applied to Megatron's layout", "lab5", "data_parallel",
            'if convention == "megatron" or is_tp_distributed(owner, parameter):',
            "if is_tp_distributed(owner, parameter):", "gradient_plan_follows",
            "megatron plan: nothing goes over DP_GROUP"),
    Mistake("the data shards counted as the world size", "lab5", "data_parallel",
            "return dist.get_world_size(groups.of_kind(kind))", "return dist.get_world_size()",
            "sync_gives and megatron", "not by the number of data shards"),
    # data_parallel, swept: shapes where the world, the DP and the RDP group differ in size
    Mistake("the data shards counted as the world size, under SageMaker's layout", "lab5",
            "data_parallel", "return dist.get_world_size(groups.of_kind(kind))",
            "return dist.get_world_size()", "sync_gives and sagemaker",
            "divided by the size of the world, 4, not by the number of data shards"),
    Mistake("the data shards counted as the RDP group under both conventions", "lab5",
            "data_parallel", 'kind = "DP" if convention == "sagemaker" else "RDP"',
            'kind = "RDP"', "sync_gives and sagemaker",
            "not by the number of data shards, the DP_GROUP size"),
    Mistake("the data shards counted as the DP group under both conventions", "lab5",
            "data_parallel", 'kind = "DP" if convention == "sagemaker" else "RDP"',
            'kind = "DP"', "sync_gives and megatron",
            "not by the number of data shards, the RDP_GROUP size"),
    Mistake("the data shards counted as every rank outside the TP group, stages included",
            "lab5", "data_parallel", "return dist.get_world_size(groups.of_kind(kind))",
            "return dist.get_world_size() // dist.get_world_size(groups.tp)",
            "sync_gives and megatron", "the groups of one stage are not the world"),
    # ZeRO: shards of sizes that do not divide
    Mistake("a shard taken as the rank's chunk, without padding", "lab5", "zero",
            "return self.padded_flat(tensor)[self.start:self.start + self.size]",
            "return tensor.detach().reshape(-1).chunk(self.padded // self.size)"
            "[self.start // self.size]", "shards_are_padded",
            "padded with zeros to N x"),
    Mistake("ZeRO-2 reduce-scatters the gradient cut without padding", "lab5", "zero",
            "list(shard.padded_flat(param.grad).chunk(self.world_size))",
            "list(param.grad.reshape(-1).chunk(self.world_size))", ZERO2,
            "a parameter cut without padding"),
    # ZeRO: the optimizer's group, not the world
    Mistake("ZeRO-1 updates every rank's shard with the first slice of the gradient", "lab5",
            "zero", "grad = shard.my_slice(param.grad)",
            "grad = param.grad.reshape(-1)[:shard.size]", ZERO1,
            "a shard updated with another slice"),
    Mistake("ZeRO-1 sums the gradients over the group without averaging them", "lab5",
            "zero", "            param.grad.div_(self.world_size)\n", "", ZERO1,
            "the gradient summed over the group but not averaged"),
    Mistake("ZeRO-1's all-reduce over the world", "lab5", "zero",
            "dist.all_reduce(param.grad, group=self.group)", "dist.all_reduce(param.grad)",
            ZERO1, "all-reduced over the world instead of the group"),
    Mistake("ZeRO-1 averages over the world size", "lab5", "zero",
            "param.grad.div_(self.world_size)", "param.grad.div_(dist.get_world_size())",
            ZERO1, "averaged over the world size"),
    Mistake("ZeRO-1 all-reduces with ReduceOp.AVG, then divides by the group size", "lab5",
            "zero", "dist.all_reduce(param.grad, group=self.group)",
            "dist.all_reduce(param.grad, op=dist.ReduceOp.AVG, group=self.group)", ZERO1,
            "averaged twice: the group's mean divided by the group's size"),
    Mistake("ZeRO-2 reduce-scatters over the world", "lab5", "zero",
            "                            group=self.group)\n", "                            )\n",
            ZERO2, "reduce-scattered over the world instead of the group"),
    # ZeRO-2
    Mistake("ZeRO-2 keeps the whole gradient after reduce-scattering it", "lab5", "zero",
            "        param.grad = None\n", "", ZERO2, "the full gradient kept"),
    Mistake("ZeRO-2 replaces the gradient shard at every backward", "lab5", "zero",
            "shard.grad = output if shard.grad is None else shard.grad.add_(output)",
            "shard.grad = output", ZERO2, "only the last micro-batch's gradient kept"),
    Mistake("ZeRO-2 all-reduces the whole gradient and keeps its slice", "lab5", "zero",
            "        output = torch.empty_like(shard.exp_avg)\n"
            "        dist.reduce_scatter(output, list(shard.padded_flat(param.grad)"
            ".chunk(self.world_size)),\n                            group=self.group)\n",
            "        dist.all_reduce(param.grad, group=self.group)\n"
            "        output = shard.my_slice(param.grad).clone()\n", ZERO2,
            "ZeRO-2 all-reduced a whole gradient in the backward"),
    # ZeRO: the state after a step, and stage 3
    Mistake("ZeRO-1 averages a copy of the gradient, param.grad left as it was", "lab5", "zero",
            "            dist.all_reduce(param.grad, group=self.group)\n"
            "            param.grad.div_(self.world_size)\n"
            "            shard.grad = shard.my_slice(param.grad)\n",
            "            grad = param.grad.clone()\n"
            "            dist.all_reduce(grad, group=self.group)\n"
            "            grad.div_(self.world_size)\n"
            "            shard.grad = shard.my_slice(grad)\n", ZERO1,
            "ZeRO-1 averaged a copy: param.grad is still this rank's own"),
    Mistake("the updated shards copied back into the parameter under stage 3 too", "lab5",
            "zero", "            if self.stage < 3:\n"
            "                param.copy_(self._gather_full(shard, weights))\n",
            "            param.copy_(self._gather_full(shard, weights))\n",
            "zero_on_two_groups and zero3",
            "stage 3 wrote into a parameter whose storage is freed"),
]

# ---------------------------------------------------------------- lab 6 and lab 7
LAB6_LAB7: list[Mistake] = [
    Mistake("a straggler tie broken by the waits' order", "lab6", "trace_analysis",
            "return min(sorted(waits), key=lambda rank: waits[rank])",
            "return min(waits, key=waits.get)", "clocks", "a tie goes to the lowest rank"),
    Mistake("idle time subtracting overlapped compute and communication twice", "lab6",
            "trace_analysis", "idle_s = span_s - union_length(compute + comm)",
            "idle_s = span_s - compute_s - comm_s", "compute_communication",
            "below zero. Likely mistake: a time counted twice"),
    Mistake("each thread's communication summed, not their union", "lab6", "trace_analysis",
            "compute_s, comm_s = union_length(compute), union_length(comm)",
            'compute_s, comm_s = union_length(compute), sum(union_length(r["comm"]) '
            'for r in threads.values())',
            "exposed_communication_of_lab5s_ddp",
            "communication is the union over every thread, counted once"),
    Mistake("a collective nested in a module's range counted as compute", "lab6",
            "trace_analysis", 'union(ranges["comm"]))])', '[])])',
            "compute_communication_and_exposure", "a thread blocked in a collective is waiting"),
    Mistake("all communication counted as exposed, the overlap ignored", "lab6",
            "trace_analysis", "comm_s - overlapped_s, idle_s, span_s)", "comm_s, idle_s, span_s)",
            "compute_communication_and_exposure",
            "exposed communication is communication minus the overlapped part"),
    Mistake("the step time averaged over ranks", "lab6", "trace_analysis",
            "return max(rank.span_s for rank in ranks) / steps",
            "return sum(rank.span_s for rank in ranks) / len(ranks) / steps",
            "step_time", "a step is as slow as its slowest rank"),
    Mistake("strong scaling efficiency without the N", "lab6", "trace_analysis",
            "t1 / (n * tn)", "t1 / tn", "step_time", "strong scaling: the same problem on N ranks"),
    Mistake("the clock offset's sign reversed", "lab6", "trace_analysis",
            "statistics.median(a - b for a, b", "statistics.median(b - a for a, b",
            "clocks_timeline_and_straggler", "the offset has the opposite sign"),
    Mistake("the clock offset as the mean of the differences, not the median", "lab6",
            "trace_analysis", "statistics.median(a - b for a, b", "statistics.mean(a - b for a, b",
            "clocks_timeline_and_straggler", "one late end among many must not move it"),
    Mistake("the offsets taken to the first rank given, not the lowest", "lab6",
            "trace_analysis", "    first = min(ends)\n", "    first = next(iter(ends))\n",
            "clocks_timeline_and_straggler", "not to the first rank given"),
    Mistake("the offset in seconds added to timestamps in microseconds", "lab6",
            "trace_analysis", "ts=float(event[\"ts\"]) + offset * 1e6",
            "ts=float(event[\"ts\"]) + offset", "clocks_timeline_and_straggler",
            "ts is in microseconds"),
    Mistake("the waits read from the collectives' ends, not their starts", "lab6",
            "trace_analysis", "sorted(start for start, _ in intervals)",
            "sorted(end for _, end in intervals)", "clocks_timeline_and_straggler",
            "a rank waits from its own arrival"),
    Mistake("the straggler taken as the rank that waits most", "lab6", "trace_analysis",
            "return min(sorted(waits), key=lambda rank: waits[rank])",
            "return max(sorted(waits), key=lambda rank: waits[rank])",
            "clocks_timeline_and_straggler", "which rank's waits show that"),
    Mistake("a rank without the collective not refused", "lab6", "trace_analysis",
            "        if not found or len(found) != len(ends[first]):\n",
            "        if found and len(found) != len(ends[first]):\n",
            "without_matching_collectives", "name the rank and the counts"),
    Mistake("K and V counted as h x h, grouped-query attention ignored", "lab7", "capacity",
            "2 * hidden * kv_heads * head_size", "2 * hidden * hidden", "parameters",
            "grouped-query attention"),
    Mistake("Megatron-LM's gradient counted in bf16", "lab7", "capacity",
            "weight, gradient, optimizer = 2, 4, 12", "weight, gradient, optimizer = 2, 2, 12",
            "model_state", "in what precision does Megatron-LM keep the gradient"),
    Mistake("sequence parallelism not splitting the layernorm inputs and masks", "lab7",
            "capacity", "replicated /= t", "replicated /= 1", "activation",
            "and which only with it"),
    Mistake("the interleaved bubble without v", "lab7", "capacity",
            "(pp - 1) / (v * microbatches + pp - 1)", "(pp - 1) / (microbatches + pp - 1)",
            "bubble", "how long is an idle slot with v chunks per rank"),
    Mistake("only the forward's 2 TP all-reduces per layer", "lab7", "capacity",
            "TP_ALL_REDUCES_PER_LAYER = 4", "TP_ALL_REDUCES_PER_LAYER = 2", "tp_all_reduce",
            "how many all-reduces does a layer make in its forward"),
    Mistake("the interleaved pipeline's warm-up and cool-down without v", "lab7", "capacity",
            "return stage_s * (microbatches + (pp - 1) / v)",
            "return stage_s * (microbatches + pp - 1)", "step_against_the_planner",
            "how does interleaving with v chunks shrink the extra ones"),
    Mistake("the sharded optimizer's reduce-scatter priced as a whole all-reduce", "lab7",
            "capacity", "share = 0.5 if sharded else 1.0", "share = 1.0", "dp_exposed",
            "what share of an all-reduce is a reduce-scatter or an all-gather"),
    Mistake("the DP parts clipped together, a hidden gather paying for an exposed reduction",
            "lab7", "capacity",
            "    return (max(0.0, reduce - BACKWARD_SHARE * stage_s)\n"
            "            + max(0.0, gather - (1 - BACKWARD_SHARE) * stage_s))\n",
            "    return max(0.0, reduce + gather - stage_s)\n", "dp_exposed",
            "is each part's exposed time clipped on its own"),
    Mistake("the LM head paid by every layer of the stage", "lab7", "capacity",
            "return layers // pp * (layer_s + tp_s) + head_s",
            "return layers // pp * (layer_s + tp_s + head_s)", "step_by_hand",
            "on which stage does the LM head run"),
    Mistake("an uneven split of the layers priced instead of refused", "lab7", "capacity",
            "    if layers % pp:\n", "    if False:\n", "do_not_divide",
            "so it must raise ValueError"),
    Mistake("the bubble taken as the pipeline less the layers' compute alone", "lab7",
            "capacity", '"bubble": pipeline - m * stage', '"bubble": pipeline - m * per_stage * layer_s',
            "step_by_hand", "the bubble is what the pipeline takes beyond m slots"),
]

# ---------------------------------------------------------------- lab 8
RING_TESTS = "ring_attention_on"
POST_NEXT = "                transfer = start_ring_exchange(kv, group, KV_TAG) if step < cp - 1 else None\n"
RING_MERGE = ("                    out[:, :, rows], lse[:, :, rows] = merge_partials(out[:, :, rows], "
              "lse[:, :, rows],\n                                                                      "
              "block_out, block_lse)\n")
RING_STEP = ("                rows, keys, masked = visible_part(cp, rank, (rank - step) % cp, q.shape[2])\n"
             "                block_out, block_lse = block_attention(q[:, :, rows], kv[0][:, :, keys], "
             "kv[1][:, :, keys],\n                                                       *((positions, "
             "positions) if masked else ()))\n                if step == 0:  # this rank's own block: "
             "every row\n                    out, lse = block_out, block_lse\n                else:\n"
             + RING_MERGE)
LAB8: list[Mistake] = [
    Mistake("backward_step's dq and dkv made in the inputs' dtype", "lab8", "ring_attention",
            "    grad_q = torch.zeros_like(q, dtype=torch.float32)\n    grad_q[:, :, rows] = grad_q_rows\n"
            "    grad_kv = torch.zeros_like(kv, dtype=torch.float32)\n",
            "    grad_q = torch.zeros_like(q)\n    grad_q[:, :, rows] = grad_q_rows\n"
            "    grad_kv = torch.zeros_like(kv)\n",
            "backward_step", "so they are made and returned in fp32"),
    Mistake("the ring's running out and lse started like q (its dtype) and merged at every step",
            "lab8", "ring_attention",
            "                if step == 0:  # this rank's own block: every row\n"
            "                    out, lse = block_out, block_lse\n"
            "                else:\n",
            "                if step == 0:  # running output and lse, like q\n"
            "                    out = torch.zeros_like(q)\n"
            "                    lse = torch.full_like(q[..., 0], float(\"-inf\"))\n"
            "                if True:\n",
            "ring_attention_on_4_ranks or hidden_ring", "running statistics kept in the inputs' dtype"),
    Mistake("the first block's out and lse cast to the inputs' dtype", "lab8", "ring_attention",
            "out, lse = block_out, block_lse\n",
            "out, lse = block_out.to(q.dtype), block_lse.to(q.dtype)\n",
            "ring_attention_on_4_ranks or hidden_ring", "running statistics kept in the inputs' dtype"),
    Mistake("the partial outputs summed as they are", "lab8", "online_softmax",
            "out = (lse1 - finite).exp()[..., None] * out1 + (lse2 - finite).exp()[..., None] * out2",
            "out = out1 + out2", "merge", "added without rescaling"),
    Mistake("the merge's weights exp(lse_i - lse) taken as they come, -inf rows included", "lab8",
            "online_softmax", "    finite = _finite(lse)\n    out =", "    finite = lse\n    out =",
            "merge", "became NaN"),
    Mistake("the merged lse as the larger of the two", "lab8", "online_softmax",
            "lse = torch.logaddexp(lse1, lse2)\n    finite", "lse = torch.maximum(lse1, lse2)\n    finite",
            "merge", "not the log of the summed exponentials"),
    Mistake("the mirror chunk counted among cp chunks, not 2cp", "lab8", "load_balance",
            "return rank, 2 * cp - 1 - rank", "return rank, cp - 1 - rank", "two_balanced_chunks",
            "the ranks' chunks are all among the first cp"),
    Mistake("the rank's positions counted from 0", "lab8", "load_balance",
            "    chunk = seq // (2 * cp)\n    return torch.cat(",
            "    return torch.arange(seq // cp, device=device)\n    chunk = seq // (2 * cp)\n"
            "    return torch.cat(",
            "token_positions", "positions are local to the rank, not the places of its tokens"),
    Mistake("the own block attended without the causal mask", "lab8", "load_balance",
            "return slice(0, seq_local), slice(0, seq_local), True",
            "return slice(0, seq_local), slice(0, seq_local), False",
            f"visible_part or {RING_TESTS}", "the diagonal block was not masked"),
    Mistake("an earlier rank's block attended whole", "lab8", "load_balance",
            "return slice(0, seq_local), slice(0, half), False",
            "return slice(0, seq_local), slice(0, seq_local), False",
            f"visible_part or {RING_TESTS}", "was treated as fully visible"),
    Mistake("the ring turned the other way: sent to r-1, received from r+1", "lab8", "ring_attention",
            "tensor, global_rank((rank + 1) % cp), group, tag),\n"
            "                  dist.P2POp(distributed_c10d.irecv, received, global_rank((rank - 1) % cp)",
            "tensor, global_rank((rank - 1) % cp), group, tag),\n"
            "                  dist.P2POp(distributed_c10d.irecv, received, global_rank((rank + 1) % cp)",
            RING_TESTS, "sent to the previous rank instead of the next"),
    Mistake("the block held at step t taken as rank r + t's", "lab8", "ring_attention",
            "(rank - step) % cp, q.shape[2])\n                block_out,",
            "(rank + step) % cp, q.shape[2])\n                block_out,",
            RING_TESTS, "holds the K/V block of rank r - t"),
    Mistake("the next block posted after this block's compute", "lab8", "ring_attention",
            POST_NEXT + RING_STEP, RING_STEP + POST_NEXT,
            RING_TESTS, "posted after this block's compute"),
    Mistake("only out merged, lse left at the first block's", "lab8", "ring_attention",
            RING_MERGE,
            RING_MERGE.replace("out[:, :, rows], lse[:, :, rows] = merge", "out[:, :, rows], _ = merge"),
            RING_TESTS, "the merged lse must be kept"),
    # lab 8, issue 31: CP groups that are not consecutive ranks
    Mistake("the ring's neighbours from the global rank modulo cp", "lab8", "ring_attention",
            "global_rank((rank + 1) % cp), group, tag),\n"
            "                  dist.P2POp(distributed_c10d.irecv, received, global_rank((rank - 1) % cp)",
            "global_rank((dist.get_rank() + 1) % cp), group, tag),\n"
            "                  dist.P2POp(distributed_c10d.irecv, received, "
            "global_rank((dist.get_rank() - 1) % cp)",
            RING_TESTS, "the neighbour computed from the global rank"),
    Mistake("P2POp given the neighbours' group ranks as global ranks", "lab8", "ring_attention",
            "tensor, global_rank((rank + 1) % cp), group, tag),\n"
            "                  dist.P2POp(distributed_c10d.irecv, received, global_rank((rank - 1) % cp)",
            "tensor, (rank + 1) % cp, group, tag),\n"
            "                  dist.P2POp(distributed_c10d.irecv, received, (rank - 1) % cp",
            RING_TESTS, "P2POp takes global ranks"),
    # communication that changes no value
    Mistake("an exchange posted at the last step too", "lab8", "ring_attention", POST_NEXT,
            POST_NEXT.replace(" if step < cp - 1 else None", ""), RING_TESTS,
            "none at its last step"),
    Mistake("the first step's exchange skipped", "lab8", "ring_attention", POST_NEXT,
            POST_NEXT.replace("if step < cp - 1", "if 0 < step < cp - 1"), RING_TESTS,
            "which the formula asks for"),
    # scores whose exponentials overflow fp32
    Mistake("the merged lse as log(exp(lse1) + exp(lse2)), as written", "lab8", "online_softmax",
            "lse = torch.logaddexp(lse1, lse2)\n    finite",
            "lse = torch.log(lse1.exp() + lse2.exp())\n    finite", "merge", "the merge overflows"),
    Mistake("the blocks' weights as exp(lse_i) / exp(lse)", "lab8", "online_softmax",
            "out = (lse1 - finite).exp()[..., None] * out1 + (lse2 - finite).exp()[..., None] * out2",
            "out = (lse1.exp() / finite.exp())[..., None] * out1 + "
            "(lse2.exp() / finite.exp())[..., None] * out2",
            "merge", "overflows or underflows"),
    # the unit that is wrong, blamed
    Mistake("a later rank's block attended by all my queries", "lab8", "load_balance",
            "return slice(half, seq_local), slice(0, seq_local), False",
            "return slice(0, seq_local), slice(0, seq_local), False",
            RING_TESTS, "the unit is wrong, not the ring"),
    Mistake("the merge rescales its caller's out1 in place", "lab8", "online_softmax",
            "out = (lse1 - finite).exp()[..., None] * out1 + (lse2 - finite).exp()[..., None] * out2",
            "out = out1.mul_((lse1 - finite).exp()[..., None]).add_("
            "(lse2 - finite).exp()[..., None] * out2)",
            "merge", "the merge overwrote its caller's input"),
    # what gloo dies on
    Mistake("the receive's source is the rank itself", "lab8", "ring_attention",
            "received, global_rank((rank - 1) % cp)", "received, global_rank(rank % cp)",
            RING_TESTS, "Pair is not connected"),
    Mistake("the block sent in fp32", "lab8", "ring_attention",
            "dist.P2POp(distributed_c10d.isend, tensor, ",
            "dist.P2POp(distributed_c10d.isend, tensor.float(), ",
            RING_TESTS, "Received data size doesn't match"),
    # the ring's backward
    Mistake("the other ranks' shares of the own block's dK/dV never added", "lab8", "ring_attention",
            "                own_grad_kv += arriving.wait()\n", "                arriving.wait()\n",
            RING_TESTS, "never came home"),
    Mistake("a block's dK/dV passed on without the shares that arrived", "lab8", "ring_attention",
            "                        grad_kv += arriving.wait()\n",
            "                        arriving.wait()\n",
            RING_TESTS, "sum the shares of every rank the block visits"),
    Mistake("dQ set to each step's share instead of summed", "lab8", "ring_attention",
            "                grad_q += step_grad_q\n", "                grad_q = step_grad_q\n",
            RING_TESTS, "through the last block held only"),
    Mistake("a block's probabilities normalised by its own lse, recomputed", "lab8", "ring_attention",
            "grad_out[:, :, rows], lse[:, :, rows],",
            "grad_out[:, :, rows], block_attention(q[:, :, rows], kv[0][:, :, keys], kv[1][:, :, keys], "
            "*((positions, positions) if masked else ()))[1],",
            "backward_step", "normalised over its own keys"),
]

# ---------------------------------------------------------------- lab 9
ROUTER_ALONE, SYNC_ALONE = "router_alone", "sync_moe_grads_alone"
DISPATCH_ALONE, COMBINE_ALONE = "dispatch_alone", "combine_alone"
DENSE_SYNC = "    all_reduce_mean(dense, groups.dp, groups.dp_size)\n"
EXPERT_SYNC = "    all_reduce_mean(expert, groups.edp, groups.dp_size)\n"
ROUTER_SOFTMAX = "probabilities = self.gate(tokens).float().softmax(dim=-1)"
EXCHANGE_ALONE = "all_to_all_alone"
BACKWARD_EXCHANGE = "grad_rows = _exchange(grad, ctx.recv_splits, ctx.send_splits, ctx.group,"
LAB9: list[Mistake] = [
    Mistake("the exchange's output buffer keeps only the rows' last dimension", "lab9",
            "token_exchange", "    received = rows.new_empty((sum(recv_splits), *rows.shape[1:]))\n",
            "    received = rows.new_empty((sum(recv_splits), rows.shape[-1]))\n",
            "all_to_all", "the output buffer made with another row shape or dtype"),
    Mistake("the rows exchanged as they come, not made contiguous", "lab9", "token_exchange",
            "    rows = rows.contiguous()\n", "",
            "all_to_all", "a tensor that is not contiguous was handed to all_to_all_single"),
    Mistake("the rows cloned instead of made contiguous (a clone keeps a view's strides)", "lab9",
            "token_exchange", "rows = rows.contiguous()", "rows = rows.clone()",
            "all_to_all", "a tensor that is not contiguous was handed to all_to_all_single"),
    Mistake("the softmax taken over the k largest logits only", "lab9", "router",
            "        top_probability, expert_index = probabilities.topk(self.top_k, dim=-1)\n",
            "        top_logit, expert_index = self.gate(tokens).float().topk(self.top_k, dim=-1)\n"
            "        top_probability = top_logit.softmax(dim=-1)\n",
            ROUTER_ALONE, "the softmax was taken over the top-k only"),
    Mistake("the weights not renormalised over the k experts", "lab9", "router",
            "        if self.renormalize:\n            weight = top_probability /",
            "        if False:\n            weight = top_probability /",
            ROUTER_ALONE, "not renormalised over the k chosen experts"),
    Mistake("an expert keeps capacity + 1 assignments", "lab9", "router",
            "return (position.sum(dim=1) < capacity).view_as(expert_index)",
            "return (position.sum(dim=1) <= capacity).view_as(expert_index)",
            ROUTER_ALONE, "tokens past capacity were kept"),
    Mistake("the capacity queue counted slot by slot, first choices first", "lab9", "router",
            "one_hot = F.one_hot(expert_index.flatten(), num_experts)     # (T*k, E), token-major\n"
            "    position = (one_hot.cumsum(dim=0) - 1) * one_hot              "
            "# place in its expert's queue\n"
            "    return (position.sum(dim=1) < capacity).view_as(expert_index)",
            "one_hot = F.one_hot(expert_index.t().flatten(), num_experts)\n"
            "    position = (one_hot.cumsum(dim=0) - 1) * one_hot\n"
            "    return (position.sum(dim=1) < capacity).view(expert_index.shape[1], -1).t()",
            ROUTER_ALONE, "counted slot by slot"),
    # dtypes and magnitudes
    Mistake("the router's softmax taken in the gate's dtype (bf16), then cast", "lab9", "router",
            ROUTER_SOFTMAX, "probabilities = self.gate(tokens).softmax(dim=-1).float()",
            ROUTER_ALONE, "taken in the gate's dtype (bf16)"),
    Mistake("the router's probabilities left in the gate's dtype", "lab9", "router",
            ROUTER_SOFTMAX, "probabilities = self.gate(tokens).softmax(dim=-1)",
            ROUTER_ALONE, "the router's probabilities are in torch.bfloat16"),
    Mistake("a hand-written softmax that does not subtract the largest logit", "lab9", "router",
            ROUTER_SOFTMAX, "probabilities = self.gate(tokens).float().exp()\n"
            "        probabilities = probabilities / probabilities.sum(dim=-1, keepdim=True)",
            ROUTER_ALONE, "exp of large logits overflowed"),
    # groups
    Mistake("EP groups taken with a stride, EDP groups consecutive", "lab9", "expert_groups",
            "        groups[\"EP\"] += [members[start:start + ep] for start in range(0, len(members), ep)]\n"
            "        groups[\"EDP\"] += [members[offset::ep] for offset in range(ep)]\n",
            "        step = len(members) // ep\n"
            "        groups[\"EP\"] += [members[offset::step] for offset in range(step)]\n"
            "        groups[\"EDP\"] += [members[start:start + step]\n"
            "                          for start in range(0, len(members), step)]\n",
            "ep_and_edp_groups", "EP groups strided instead of consecutive ranks"),
    # blame: the unit that is wrong, named in the test of a unit that relies on it
    Mistake("the router's softmax over the tokens instead of the experts", "lab9", "router",
            ROUTER_SOFTMAX, "probabilities = self.gate(tokens).float().softmax(dim=0)",
            DISPATCH_ALONE, "the router's softmax is over the wrong dimension"),
    Mistake("the dispatch does not sort the assignments by expert", "lab9", "expert_parallel",
            "        assignment = assignment[routing.expert_index.flatten()[assignment]"
            ".argsort(stable=True)]\n", "",
            DISPATCH_ALONE, "the dispatch did not sort tokens by expert"),
    Mistake("the dispatch's input and output split sizes swapped", "lab9", "expert_parallel",
            "all_to_all_rows(permuted, send_splits, recv_splits, group, \"dispatch\", log)",
            "all_to_all_rows(permuted, recv_splits, send_splits, group, \"dispatch\", log)",
            DISPATCH_ALONE, "input and output split sizes swapped"),
    Mistake("the combine sends back with the dispatch's split sizes", "lab9", "expert_parallel",
            "all_to_all_rows(computed, recv_splits, send_splits, group, \"combine\", log)",
            "all_to_all_rows(computed, send_splits, recv_splits, group, \"combine\", log)",
            COMBINE_ALONE, "the combine's split sizes are swapped"),
    Mistake("the combine adds the returned rows in token order, not at their tokens", "lab9",
            "expert_parallel", "index_add(0, token, returned * weight)",
            "index_add(0, token.sort().values, returned * weight)",
            COMBINE_ALONE, "the combine did not un-permute the tokens"),
    Mistake("the expert outputs summed without their weights", "lab9", "expert_parallel",
            "index_add(0, token, returned * weight)", "index_add(0, token, returned)",
            COMBINE_ALONE, "not weighted by the router's weights"),
    # the data-parallel structure of the sync
    Mistake("expert gradients averaged over the DP group", "lab9", "expert_parallel",
            EXPERT_SYNC, "    all_reduce_mean(expert, groups.dp, groups.dp_size)\n",
            SYNC_ALONE, "expert gradients averaged over the DP group instead of summed over the "
            "EDP group and divided by dp"),
    Mistake("expert gradients divided by the EDP size", "lab9", "expert_parallel",
            EXPERT_SYNC,
            "    all_reduce_mean(expert, groups.edp, groups.dp_size // groups.ep_size)\n",
            SYNC_ALONE, "divided by the EDP size instead of dp"),
    Mistake("the dense gradients averaged over the world", "lab9", "expert_parallel",
            DENSE_SYNC, "    all_reduce_mean(dense, None, dist.get_world_size())\n",
            SYNC_ALONE, "averaged over the world, not the DP group"),
    Mistake("ReduceOp.AVG over the DP group, then divided by dp", "lab9", "expert_parallel",
            DENSE_SYNC, "    for grad in dense:\n"
            "        dist.all_reduce(grad, op=dist.ReduceOp.AVG, group=groups.dp)\n"
            "        grad /= groups.dp_size\n",
            SYNC_ALONE, "ReduceOp.AVG then divided again"),
    Mistake("the dense gradients divided by the world size", "lab9", "expert_parallel",
            DENSE_SYNC, "    all_reduce_mean(dense, groups.dp, dist.get_world_size())\n",
            SYNC_ALONE, "divided by the world size, not the data-parallel group's size"),
    Mistake("the expert gradients left unsynced", "lab9", "expert_parallel", EXPERT_SYNC, "",
            "layer_matches_one_device", "the expert gradients were not synced over the EDP group"),
    # the communication contract
    Mistake("the dense gradients all-reduced one tensor at a time", "lab9", "expert_parallel",
            DENSE_SYNC, "    for grad in dense:\n"
            "        all_reduce_mean([grad], groups.dp, groups.dp_size)\n",
            SYNC_ALONE, "an extra all_reduce"),
    Mistake("the counts exchanged with an all-gather instead of an all-to-all", "lab9",
            "expert_parallel",
            "        dist.all_to_all_single(recv_counts, routing.tokens_per_expert, group=group)\n",
            "        gathered = [torch.empty_like(recv_counts) for _ in range(ep)]\n"
            "        dist.all_gather(gathered, routing.tokens_per_expert, group=group)\n"
            "        recv_counts = torch.stack(gathered).view(ep, ep, -1)"
            "[:, self.groups.ep_rank].flatten()\n",
            DISPATCH_ALONE, "communicates other than the formula says"),
    # the all-to-all's backward (token_exchange.py), alone and in the layer
    Mistake("the all-to-all's backward sends with the forward's split sizes", "lab9",
            "token_exchange", BACKWARD_EXCHANGE,
            BACKWARD_EXCHANGE.replace("ctx.recv_splits, ctx.send_splits", "ctx.send_splits, ctx.recv_splits"),
            EXCHANGE_ALONE, "the backward exchanged with the forward's split sizes"),
    Mistake("the all-to-all's backward returns the gradient it was given", "lab9",
            "token_exchange", "        return grad_rows, None, None, None, None, None\n",
            "        return grad, None, None, None, None, None\n",
            EXCHANGE_ALONE, "returned the gradient of the received rows without exchanging it"),
    Mistake("the all-to-all's output allocated with the send sizes", "lab9", "token_exchange",
            "received = rows.new_empty((sum(recv_splits), *rows.shape[1:]))",
            "received = rows.new_empty((sum(send_splits), *rows.shape[1:]))",
            EXCHANGE_ALONE, "the output holds the rows this rank receives"),
    Mistake("the layer's backward exchanges with the forward's split sizes", "lab9",
            "token_exchange", BACKWARD_EXCHANGE,
            BACKWARD_EXCHANGE.replace("ctx.recv_splits, ctx.send_splits", "ctx.send_splits, ctx.recv_splits"),
            "layer_matches_one_device", "the backward of all_to_all_rows (token_exchange.py"),
    Mistake("the dispatch sends the dropped assignments too", "lab9", "expert_parallel",
            "assignment = routing.kept.flatten().nonzero().squeeze(1)",
            "assignment = torch.arange(routing.kept.numel(), device=tokens.device)",
            DISPATCH_ALONE, "the dispatch sent the dropped assignments too"),
]

# ---------------------------------------------------------------- contracts (test_labN_contracts.py)
CONTRACT = "keeps_its_contract"
CONTRACTS: list[Mistake] = [
    Mistake("the capacity mask made without the index's device", "lab9", "router",
            "    return (position.sum(dim=1) < capacity).view_as(expert_index)\n",
            "    keep = torch.zeros(expert_index.numel(), dtype=torch.bool)\n"
            "    keep |= position.sum(dim=1) < capacity\n"
            "    return keep.view_as(expert_index)\n",
            CONTRACT, "keep_within_capacity breaks its contract that it gives results on its "
            "inputs' device"),
    Mistake("a rank's communication ranges sorted in the caller's lists", "lab6",
            "trace_analysis",
            '    comm = union([interval for ranges in threads.values() for interval in ranges["comm"]])\n',
            '    for ranges in threads.values():\n'
            '        ranges["comm"].sort()\n'
            '    comm = union([interval for ranges in threads.values() for interval in ranges["comm"]])\n',
            CONTRACT, "rank_time breaks its contract that it leaves its inputs as they were"),
    Mistake("the plan switches to the ring once, as if the sizes were sorted", "lab0",
            "alpha_beta",
            "    return [faster_all_reduce(size, n, alpha, bandwidth) for size in nbytes]\n",
            "    choices = [faster_all_reduce(size, n, alpha, bandwidth) for size in nbytes]\n"
            '    first = choices.index("ring") if "ring" in choices else len(choices)\n'
            '    return ["recursive doubling"] * first + ["ring"] * (len(choices) - first)\n',
            CONTRACT, "decides each size by the size, not by its place in the list"),
    Mistake("the grid's groups read as if its ranks were numbered row by row", "lab1", "groups",
            "    rows = mesh.permute(kept + spanned)",
            "    rows = torch.arange(mesh.numel()).reshape(mesh.shape).permute(kept + spanned)",
            CONTRACT, "mesh_groups breaks its contract that it renumbers its groups"),
    Mistake("the straggler's tie broken by the order of the waits", "lab6", "trace_analysis",
            "    return min(sorted(waits), key=lambda rank: waits[rank])\n",
            "    return min(waits, key=waits.get)\n",
            CONTRACT, "straggler breaks its contract that it does not depend on the order"),
    Mistake("the row-parallel bias copied whether or not the layer has one", "lab2", "tp_layers",
            "self.bias = nn.Parameter(linear.bias.detach().clone()) if linear.bias is not None "
            "else None", "self.bias = nn.Parameter(linear.bias.detach().clone())",
            "without_a_bias", "they take a linear layer without a bias"),
    Mistake("the merge's results cast to fp32", "lab8", "online_softmax",
            "    return out, lse\n", "    return out.float(), lse.float()\n",
            CONTRACT, "merge_partials breaks its contract that it gives results in its inputs' "
            "dtype (float64)"),
]

CATALOGUE = LAB0_LAB1 + LAB2_LAB3 + LAB4 + LAB5 + LAB6_LAB7 + LAB8 + LAB9 + CONTRACTS
