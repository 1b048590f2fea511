"""What tensor parallelism can split, the one home of its rules: a size tp divides, the heads
(Megatron-LM's split of the heads over tp), and with grouped-query attention the KV heads,
split or replicated (as Megatron-core and vLLM's ``QKVParallelLinear`` do). Used by the TP
layers, the trainer's plan, the planner and the figures; derivation: lab 3's notebook and
docs/library.md, "Beyond the three dimensions".
"""


def check_divisible(size: int, tp: int, what: str) -> None:
    """Each of the ``tp`` ranks holds an equal piece of ``size``."""
    if size % tp:
        raise ValueError(f"{what} {size} is not divisible by the tensor-parallel size tp = {tp}")


def check_head_split(heads: int, tp: int) -> None:
    """Each of the ``tp`` ranks computes ``heads / tp`` whole query heads."""
    check_divisible(heads, tp, "heads")


def kv_head_layout(heads: int, kv_heads: int, tp: int) -> str:
    """``"split"`` (tp divides ``kv_heads``: rank r holds kv_heads / tp KV heads) or
    ``"replicated"`` (``kv_heads`` divides tp: each rank holds the one KV head its query heads
    use); a ValueError with the rule and the numbers when neither."""
    check_head_split(heads, tp)
    if kv_heads % tp == 0:
        return "split"
    if tp % kv_heads == 0:
        return "replicated"
    raise ValueError(f"kv_heads {kv_heads} and tp = {tp}: the KV heads are split over the "
                     f"tensor-parallel ranks when tp divides kv_heads, or replicated when "
                     f"kv_heads divides tp; {tp} does not divide {kv_heads}, nor does {kv_heads} "
                     f"divide {tp}")


def check_block_split(heads: int, kv_heads: int, hidden: int, ffn: int, tp: int) -> str:
    """A transformer block over ``tp`` ranks: the heads (and KV heads) as
    :func:`kv_head_layout` says, the hidden size and the MLP's inner size in equal pieces;
    returns the KV heads' layout."""
    layout = kv_head_layout(heads, kv_heads, tp)
    check_divisible(hidden, tp, "the hidden size")
    check_divisible(ffn, tp, "the MLP's inner size")
    return layout

