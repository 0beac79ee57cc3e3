"""The canaries' tensor tables (docs/design.md): names and shapes in canonical order, torch-free.

The one place the Python side spells the tables out: canary_harness.pack checks packs
against them without torch, and canary_harness.models.gpt2 and .llama build their
modules from them.
"""

from __future__ import annotations

from typing import List, Tuple


def gpt2_tensor_table(vocab_size: int, context_length: int, channels: int,
                      layers: int) -> List[Tuple[str, Tuple[int, ...]]]:
    """[(name, shape)] in canonical order: wte, wpe, blocks.0.* .. blocks.L-1.*, lnf.*"""
    V, T, C = vocab_size, context_length, channels
    table = [("wte", (V, C)), ("wpe", (T, C))]
    for l in range(layers):
        p = f"blocks.{l}."
        table += [
            (p + "ln1.weight", (C,)),
            (p + "ln1.bias", (C,)),
            (p + "attn.qkv.weight", (3 * C, C)),
            (p + "attn.qkv.bias", (3 * C,)),
            (p + "attn.proj.weight", (C, C)),
            (p + "attn.proj.bias", (C,)),
            (p + "ln2.weight", (C,)),
            (p + "ln2.bias", (C,)),
            (p + "mlp.fc.weight", (4 * C, C)),
            (p + "mlp.fc.bias", (4 * C,)),
            (p + "mlp.proj.weight", (C, 4 * C)),
            (p + "mlp.proj.bias", (C,)),
        ]
    table += [("lnf.weight", (C,)), ("lnf.bias", (C,))]
    return table


def llama_tensor_table(vocab_size: int, channels: int, layers: int, heads: int, kv_heads: int,
                       mlp_hidden: int) -> List[Tuple[str, Tuple[int, ...]]]:
    """[(name, shape)] in canonical order: wte, blocks.0.* .. blocks.L-1.*, norm.weight, lm_head.weight"""
    V, C, H = vocab_size, channels, mlp_hidden
    head_size = C // heads
    q_rows, kv_rows = heads * head_size, kv_heads * head_size
    table: List[Tuple[str, Tuple[int, ...]]] = [("wte", (V, C))]
    for l in range(layers):
        p = f"blocks.{l}."
        table += [
            (p + "attn_norm.weight", (C,)),
            (p + "attn.q.weight", (q_rows, C)),
            (p + "attn.k.weight", (kv_rows, C)),
            (p + "attn.v.weight", (kv_rows, C)),
            (p + "attn.o.weight", (C, q_rows)),
            (p + "mlp_norm.weight", (C,)),
            (p + "mlp.gate.weight", (H, C)),
            (p + "mlp.up.weight", (H, C)),
            (p + "mlp.down.weight", (C, H)),
        ]
    return table + [("norm.weight", (C,)), ("lm_head.weight", (V, C))]
