"""Grouped-query attention that reads each key/value head once, as a transformers attention implementation.

Why: transformers' "sdpa" attention expands K and V from the key/value heads to all query heads
(`repeat_kv`) whenever it is given a mask, and with a static cache (the compiled decode) there is always
one. At Qwen2.5-7B's shapes (28 query heads, 4 key/value heads) that copy writes the whole cache seven
times over in every layer of every step. Here the G query heads that share one key/value head become
G x L query rows of that head instead ([B, H, L, D] -> [B, Hkv, G*L, D]), so SDPA reads the unexpanded
cache once per key/value head. Each query row still sees the same keys, values and mask row: the same
math as the stock path, no approximation.

    from utils.attention import use_grouped_attention
    use_grouped_attention(model)          # model.config._attn_implementation == "sdpa_grouped"

Where the rows trick does not apply, the call goes to transformers' own `sdpa_attention_forward`
unchanged (`delegate_reason` says when, and why).
"""
from __future__ import annotations

import torch

NAME = "sdpa_grouped"


def delegate_reason(module, query: torch.Tensor, key: torch.Tensor, attention_mask: torch.Tensor | None,
                    dropout: float = 0.0, is_causal: bool | None = None, **kwargs) -> str | None:
    """Why this call goes to transformers' stock sdpa attention, or None when the grouped rows compute it.
    The rule is explicit so that a test can pin every case (tests/test_attention.py)."""
    groups = getattr(module, "num_key_value_groups", 1)
    if groups <= 1:
        return "no grouping (one query head per key/value head)"
    if query.shape[1] != key.shape[1] * groups:
        return "head counts do not match num_key_value_groups"
    causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
    if attention_mask is None and query.shape[2] > 1 and causal:
        return "causal without a mask over several query tokens (the grouped rows would break is_causal)"
    if attention_mask is not None and (attention_mask.dim() != 4 or attention_mask.shape[1] != 1):
        return "a mask that is not one [B, 1, L, S] mask shared by all heads"
    if kwargs.get("sliding_window"):
        return "sliding window"
    if dropout:
        return "dropout (training)"
    if kwargs.get("output_attentions"):
        return "output_attentions"
    if kwargs.get("position_bias") is not None:
        return "position bias"
    if kwargs.get("softcap") is not None:
        return "softcap"
    if kwargs.get("cache") is not None:
        return "paged cache"
    return None


def _stock(module, query, key, value, attention_mask, **kwargs):
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)


def grouped_rows(query: torch.Tensor, mask: torch.Tensor | None, groups: int):
    """Query [B, H, L, D] as [B, Hkv, G*L, D] (row g*L + l of key/value head k is query head k*G + g at token
    l, repeat_kv's order), and the mask [B, 1, L, S] (or [B, 1, 1, S]) broadcast to those rows: for one
    query row per head a stride-0 expand, no copy."""
    b, h, length, d = query.shape
    rows = query.reshape(b, h // groups, groups * length, d)
    if mask is None:
        return rows, None
    mb, _, ml, s = mask.shape
    if ml == 1:
        return rows, mask.expand(mb, 1, groups * length, s)
    return rows, mask.unsqueeze(2).expand(mb, 1, groups, length, s).reshape(mb, 1, groups * length, s)


def sdpa_grouped_attention_forward(module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                                   attention_mask: torch.Tensor | None, dropout: float = 0.0,
                                   scaling: float | None = None, is_causal: bool | None = None,
                                   **kwargs) -> tuple[torch.Tensor, None]:
    """transformers' attention-implementation signature; returns what `sdpa_attention_forward` does: the
    output as [B, L, H, D], contiguous, and no weights."""
    if delegate_reason(module, query, key, attention_mask, dropout, is_causal, **kwargs) is not None:
        return _stock(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                      is_causal=is_causal, **kwargs)
    b, h, length, _ = query.shape
    rows, mask = grouped_rows(query, attention_mask, module.num_key_value_groups)
    out = torch.nn.functional.scaled_dot_product_attention(rows, key, value, attn_mask=mask, scale=scaling,
                                                           is_causal=False)
    out = out.reshape(out.shape[0], h, length, value.shape[-1])
    return out.transpose(1, 2).contiguous(), None


def register(name: str = NAME) -> str:
    """Register the function under `name` with transformers, with sdpa's mask (a model whose attention
    implementation has no mask function gets no mask at all, padding included)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface

    AttentionInterface.register(name, sdpa_grouped_attention_forward)
    AttentionMaskInterface.register(name, ALL_MASK_ATTENTION_FUNCTIONS["sdpa"])
    return name


def use_grouped_attention(model, name: str = NAME) -> str:
    """Switch a loaded transformers model to the grouped attention; returns the implementation it now runs.
    A model that does not take it (one that does not dispatch through the attention interface) is an error,
    never a quiet stock run under the new name."""
    register(name)
    if not hasattr(model, "set_attn_implementation"):
        raise ValueError(f"attention: {type(model).__name__} has no set_attn_implementation; "
                         f"{name!r} needs a transformers model")
    model.set_attn_implementation(name)
    now = getattr(model.config, "_attn_implementation", None)
    if now != name:
        raise ValueError(f"attention: {type(model).__name__} kept attention {now!r} when asked for {name!r} "
                         f"(it does not dispatch through transformers' AttentionInterface)")
    return now
