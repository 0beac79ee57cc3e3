"""The canaries' tensor tables (docs/design.md): names, shapes and init roles in canonical
order, torch-free.

The one place the Python side spells the tables out: canary_harness.pack checks packs
against them without torch, and canary_harness.models.gpt2 and .llama build their
modules (and, for benchmarks, a random init) from them. The init role is the C++
canaries' ParameterInit (canaries/canary.h), set where the tensor is described, so that
nothing picks an init by reading a tensor's name.
"""

from __future__ import annotations

from typing import List, NamedTuple, Tuple

# How a parameter starts (the canary contract's init): N(0, init_std); N(0, init_std /
# sqrt(2 L)) for the projections into the residual stream; ones (norm weights); zeros (biases).
NORMAL, RESIDUAL_NORMAL, ONES, ZEROS = "normal", "residual_normal", "ones", "zeros"


# A linear's parallel role under a Megatron split (tpu-mesh's tp, canary_harness.jax):
# column-parallel weights split their output dimension (0), their biases follow it;
# row-parallel weights split their input dimension (1); "" for everything else.
COLUMN, COLUMN_BIAS, ROW = "column", "column-bias", "row"


def is_decayed(shape: Tuple[int, ...]) -> bool:
    """The canaries' AdamW weight-decay rule (docs/design.md), as canaries/canary.cpp's
    update(): matrices and stacks of them decay (embeddings, every weight matrix, moe's
    experts), vectors (norm weights, biases) do not."""
    return len(shape) >= 2


class TensorSpec(NamedTuple):
    name: str
    shape: Tuple[int, ...]
    init: str
    parallel: str = ""


def names_and_shapes(specs: List[TensorSpec]) -> List[Tuple[str, Tuple[int, ...]]]:
    return [(s.name, s.shape) for s in specs]


def gpt2_tensor_specs(vocab_size: int, context_length: int, channels: int, layers: int) -> List[TensorSpec]:
    """Every gpt2 parameter in canonical order: wte, wpe, blocks.0.* .. blocks.L-1.*, lnf.*"""
    V, T, C = vocab_size, context_length, channels
    specs = [TensorSpec("wte", (V, C), NORMAL), TensorSpec("wpe", (T, C), NORMAL)]
    for l in range(layers):
        p = f"blocks.{l}."
        specs += [
            TensorSpec(p + "ln1.weight", (C,), ONES),
            TensorSpec(p + "ln1.bias", (C,), ZEROS),
            TensorSpec(p + "attn.qkv.weight", (3 * C, C), NORMAL, COLUMN),
            TensorSpec(p + "attn.qkv.bias", (3 * C,), ZEROS, COLUMN_BIAS),
            TensorSpec(p + "attn.proj.weight", (C, C), RESIDUAL_NORMAL, ROW),
            TensorSpec(p + "attn.proj.bias", (C,), ZEROS),
            TensorSpec(p + "ln2.weight", (C,), ONES),
            TensorSpec(p + "ln2.bias", (C,), ZEROS),
            TensorSpec(p + "mlp.fc.weight", (4 * C, C), NORMAL, COLUMN),
            TensorSpec(p + "mlp.fc.bias", (4 * C,), ZEROS, COLUMN_BIAS),
            TensorSpec(p + "mlp.proj.weight", (C, 4 * C), RESIDUAL_NORMAL, ROW),
            TensorSpec(p + "mlp.proj.bias", (C,), ZEROS),
        ]
    return specs + [TensorSpec("lnf.weight", (C,), ONES), TensorSpec("lnf.bias", (C,), ZEROS)]


def gpt2_tensor_table(vocab_size: int, context_length: int, channels: int,
                      layers: int) -> List[Tuple[str, Tuple[int, ...]]]:
    """[(name, shape)] in canonical order: wte, wpe, blocks.0.* .. blocks.L-1.*, lnf.*"""
    return names_and_shapes(gpt2_tensor_specs(vocab_size, context_length, channels, layers))


def llama_tensor_specs(vocab_size: int, channels: int, layers: int, heads: int, kv_heads: int,
                       mlp_hidden: int) -> List[TensorSpec]:
    """Every llama parameter in canonical order: wte, blocks.0.* .. blocks.L-1.*, norm.weight, lm_head.weight"""
    V, C, H = vocab_size, channels, mlp_hidden
    head_size = C // heads
    q_rows, kv_rows = heads * head_size, kv_heads * head_size
    specs = [TensorSpec("wte", (V, C), NORMAL)]
    for l in range(layers):
        p = f"blocks.{l}."
        specs += [
            TensorSpec(p + "attn_norm.weight", (C,), ONES),
            TensorSpec(p + "attn.q.weight", (q_rows, C), NORMAL, COLUMN),
            TensorSpec(p + "attn.k.weight", (kv_rows, C), NORMAL, COLUMN),
            TensorSpec(p + "attn.v.weight", (kv_rows, C), NORMAL, COLUMN),
            TensorSpec(p + "attn.o.weight", (C, q_rows), RESIDUAL_NORMAL, ROW),
            TensorSpec(p + "mlp_norm.weight", (C,), ONES),
            TensorSpec(p + "mlp.gate.weight", (H, C), NORMAL, COLUMN),
            TensorSpec(p + "mlp.up.weight", (H, C), NORMAL, COLUMN),
            TensorSpec(p + "mlp.down.weight", (C, H), RESIDUAL_NORMAL, ROW),
        ]
    return specs + [TensorSpec("norm.weight", (C,), ONES), TensorSpec("lm_head.weight", (V, C), NORMAL)]


def llama_tensor_table(vocab_size: int, channels: int, layers: int, heads: int, kv_heads: int,
                       mlp_hidden: int) -> List[Tuple[str, Tuple[int, ...]]]:
    """[(name, shape)] in canonical order: wte, blocks.0.* .. blocks.L-1.*, norm.weight, lm_head.weight"""
    return names_and_shapes(llama_tensor_specs(vocab_size, channels, layers, heads, kv_heads, mlp_hidden))


def moe_tensor_specs(vocab_size: int, channels: int, layers: int, heads: int, kv_heads: int, mlp_hidden: int,
                     experts: int) -> List[TensorSpec]:
    """Every moe parameter in canonical order: llama's, each block's mlp.* replaced by its
    router (E, C) and its experts' gate and up (E, H, C) and down (E, C, H)."""
    C, H, E = channels, mlp_hidden, experts
    specs: List[TensorSpec] = []
    for spec in llama_tensor_specs(vocab_size, channels, layers, heads, kv_heads, mlp_hidden):
        if ".mlp." not in spec.name:
            specs.append(spec)
        elif spec.name.endswith(".mlp.gate.weight"):  # the block's MLP, replaced where it began
            p = spec.name[:-len("mlp.gate.weight")]
            specs += [
                TensorSpec(p + "moe.router.weight", (E, C), NORMAL),
                TensorSpec(p + "moe.experts.gate.weight", (E, H, C), NORMAL),
                TensorSpec(p + "moe.experts.up.weight", (E, H, C), NORMAL),
                TensorSpec(p + "moe.experts.down.weight", (E, C, H), RESIDUAL_NORMAL),
            ]
    return specs


def moe_tensor_table(vocab_size: int, channels: int, layers: int, heads: int, kv_heads: int, mlp_hidden: int,
                     experts: int) -> List[Tuple[str, Tuple[int, ...]]]:
    """[(name, shape)] in canonical order (moe_tensor_specs)"""
    return names_and_shapes(moe_tensor_specs(vocab_size, channels, layers, heads, kv_heads, mlp_hidden, experts))
