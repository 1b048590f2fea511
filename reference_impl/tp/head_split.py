"""How tp ranks share the attention heads, the one home of the rule (Megatron-LM's split of the
heads; with grouped-query attention the KV heads split or are replicated, as Megatron-core
and vLLM's ``QKVParallelLinear`` do). Derivation: ``tp/llama_tp.py`` and lab 3's notebook.
"""


def check_head_split(heads: int, tp: int) -> None:
    """Each of the ``tp`` ranks computes ``heads / tp`` whole query heads."""
    if heads % tp:
        raise ValueError(f"heads {heads} is not divisible by the tensor-parallel size tp = {tp}")


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


def kv_heads_per_rank(heads: int, kv_heads: int, tp: int) -> int:
    """The KV heads one rank holds: kv_heads / tp when split, one when replicated."""
    return kv_heads // tp if kv_head_layout(heads, kv_heads, tp) == "split" else 1
