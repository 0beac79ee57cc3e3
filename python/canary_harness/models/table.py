"""The canary's tensor table (docs/design.md): names and shapes in canonical order, torch-free.

The one place the Python side spells the table out: canary_harness.pack checks packs
against it without torch, and canary_harness.models.gpt2 builds its module from it.
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
