"""The llama canary in PyTorch (architecture "llama"), on any device.

It follows the llama contract of docs/canary.md ("The llama architecture") and the C++ model
(canaries/architectures/llama/llama.cpp, engines/kernels/llama_kernels.cpp) in names, shapes and op order, and
shares no code or kernels with them: the forward pass is PyTorch ops (F.embedding,
F.linear, softmax, F.silu, F.cross_entropy, an RMSNorm written out), the backward pass is
autograd, and the optimizer step is the same as gpt2's (canary_harness.runs.optim). A pre-norm
decoder with no biases:

    x = wte[tok]
    per layer:  h = x + o(attn(rope(q(rms(x))), rope(k(rms(x))), v(rms(x))))
                x = h + down(silu(gate(rms(h))) * up(rms(h)))
    loss = cross_entropy(lm_head(rms(x)), targets)        (lm_head untied from wte)

RMSNorm is `x * (mean(x^2) + eps)^(-1/2) * w` (eps = the canary JSON's `layernorm_eps`);
RoPE rotates the pair (i, i + hd/2) of each head at position t by `t * theta^(-2i/hd)`,
with the cos/sin tables computed in float64 as the C++ computes them (`exp(-(2i/hd) *
log(theta))`, then the angle, then cos and sin) and rounded once to float32; attention is
grouped-query (query head h reads kv head h // (NH/NKV)), causal, scale 1/sqrt(hd).

As in canary_harness.models.gpt2, the nn.Module `Llama` has named_parameters() equal to
the canary's tensor names in canonical order, and every forward op of the C++ model is a
module whose path is the op's name, so module hooks (fault injection, op traces in
canary_harness.tracing.trace) see the C++ ops under the C++ names. Nothing assumes a device: the
RoPE tables are buffers moved with the module, the causal mask is made on the scores'
device, and a step reads nothing back to the host.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import Any, Dict, List, Mapping, Optional, Tuple, Union

import torch
import torch.nn as nn
import torch.nn.functional as F

from .gpt2 import lr_at  # the schedule is gpt2's: docs/canary.md
from ..runs.architectures import Architecture, architecture_of
from .module import CanaryModule, Hook, random_parameters  # noqa: F401  (Hook: the type of forward's hook, re-exported)
from .config import canary_object, check_sizes, typed_fields
from .table import llama_tensor_specs, llama_tensor_table

ARCHITECTURE = "llama"


# ----------------------------------------------------------------------------------
# configuration (defaults = canaries/llama-tiny.toml)

@dataclass
class LlamaConfig:
    vocab_size: int = 256        # V
    context_length: int = 64     # T
    channels: int = 128          # C
    layers: int = 4              # L
    heads: int = 4               # NH (head size C/NH = 32)
    kv_heads: int = 2            # NKV (divides NH)
    mlp_hidden: int = 352        # H
    rope_theta: float = 10000.0
    batch_size: int = 8          # B
    steps: int = 100             # schedule length (cosine reaches min lr here)
    peak_lr: float = 3e-3
    min_lr_ratio: float = 0.1
    warmup_steps: int = 10
    beta1: float = 0.9
    beta2: float = 0.95
    adam_eps: float = 1e-8
    weight_decay: float = 0.1
    max_grad_norm: float = 1.0
    layernorm_eps: float = 1e-5  # the RMSNorm eps (the canary JSON's key for every architecture)
    preset: str = "llama-tiny"   # the canary's name: lane names use it
    init_std: float = 0.02
    data_seed: int = 20240611
    architecture: str = ARCHITECTURE

    @property
    def head_size(self) -> int:
        return self.channels // self.heads

    @property
    def group(self) -> int:
        """Query heads per kv head (NH / NKV)."""
        return self.heads // self.kv_heads

    def field_names(self) -> List[str]:
        return [f.name for f in fields(self)]

    @classmethod
    def from_json(cls, canary: Union[str, bytes, Mapping[str, Any]]) -> "LlamaConfig":
        """The config of a llama canary JSON as the C++ writes it (a receipt's or pack's `canary`).

        Every key is required (the gpt2 keys plus architecture, kv_heads, mlp_hidden and
        rope_theta); a missing or mistyped one, another architecture, or sizes that do not
        fit raise ValueError naming the key.
        """
        canary = canary_object(canary)
        architecture = architecture_of(canary)
        if architecture != cls.architecture:  # the class's own: "llama", or a subclass's
            raise ValueError(f"canary JSON key 'architecture' is {architecture!r}, not '{cls.architecture}'")
        cfg = cls(**typed_fields(cls, canary))
        check_sizes(canary, ("vocab_size", "context_length", "channels", "layers", "heads", "kv_heads", "mlp_hidden",
                             "batch_size", "steps"))
        if not cfg.rope_theta > 0.0:
            raise ValueError(f"canary JSON key 'rope_theta' must be > 0 (is {cfg.rope_theta})")
        if cfg.channels % cfg.heads != 0:
            raise ValueError(f"canary JSON key 'heads': {cfg.heads} does not divide channels {cfg.channels}")
        if cfg.heads % cfg.kv_heads != 0:
            raise ValueError(f"canary JSON key 'kv_heads': {cfg.kv_heads} does not divide heads {cfg.heads}")
        if cfg.head_size % 2 != 0:
            raise ValueError(f"canary JSON key 'heads': head size {cfg.head_size} (channels/heads) is odd; "
                             "RoPE needs it even")
        return cfg


# ----------------------------------------------------------------------------------
# the tensor table and the op names, as canaries/architectures/llama/llama.cpp lists them

def tensor_table(cfg: LlamaConfig) -> List[Tuple[str, Tuple[int, ...]]]:
    """[(name, shape)] in canonical order: wte, blocks.0.* .. blocks.L-1.*, norm.weight, lm_head.weight"""
    return llama_tensor_table(cfg.vocab_size, cfg.channels, cfg.layers, cfg.heads, cfg.kv_heads, cfg.mlp_hidden)


LAYER_OPS = ("attn_norm", "attn.q", "attn.k", "attn.v", "attn.rope_q", "attn.rope_k", "attn", "attn.o",
             "attn.residual", "mlp_norm", "mlp.gate", "mlp.up", "mlp.swiglu", "mlp.down", "mlp.residual")


def forward_op_names(cfg: LlamaConfig) -> List[str]:
    """The forward ops in execution order, named as the C++ model names them."""
    names = ["embedding"]
    for l in range(cfg.layers):
        names += [f"blocks.{l}.{op}" for op in LAYER_OPS]
    return names + ["norm", "lm_head", "loss"]


def random_init(cfg: LlamaConfig, seed: int = 0) -> Dict[str, torch.Tensor]:
    """Random parameters with the contract's init distribution (matrices and wte
    N(0, init_std), attn.o and mlp.down N(0, init_std/sqrt(2L)), norm weights 1), from
    torch's generator: not the C++ engine's values (the lane starts from a pack's init)."""
    specs = llama_tensor_specs(cfg.vocab_size, cfg.channels, cfg.layers, cfg.heads, cfg.kv_heads, cfg.mlp_hidden)
    return random_parameters(specs, cfg.init_std, cfg.layers, seed)


def rope_tables(context_length: int, head_size: int, theta: float) -> Tuple[torch.Tensor, torch.Tensor]:
    """(cos, sin), each float32 (T, hd/2), as engines/kernels/llama_kernels.cpp's rope_tables:
    inverse frequency exp(-(2i/hd) * log(theta)), angle t * that, all in float64, then cos
    and sin rounded once to float32. (The C++ uses its own deterministic exp/log/sin/cos;
    these are torch's float64 ones, which may differ in the last bit of a double and so
    almost never in the float32 result.)"""
    half = head_size // 2
    i = torch.arange(half, dtype=torch.float64)
    inverse_frequency = torch.exp(-(2.0 * i / head_size) * math.log(theta))           # (hd/2,)
    angle = torch.arange(context_length, dtype=torch.float64)[:, None] * inverse_frequency[None, :]  # (T, hd/2)
    return torch.cos(angle).to(torch.float32), torch.sin(angle).to(torch.float32)


# ----------------------------------------------------------------------------------
# the ops: every op of the C++ model is a module whose path is its name. Containers (the
# blocks, `mlp`, the model) only call op modules; an op module calls no other module
# (`attn` holds q, k, v, the rope ops, o and residual, which the block calls).

def rmsnorm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """x (..., C) -> x * (mean(x^2) + eps)^(-1/2) * weight, computed in float32 at least
    (a bf16 input under autocast is widened; float32 and float64 stay as they are).

    x is read twice (the mean of squares, the scaling), so its gradient here is a sum of two
    terms; taken through one view, that sum reaches x as one term, and the residual stream's
    gradient is the same two-term sum whether or not the op tracer (canary_harness.tracing.trace)
    hands this op a view of x: tracing changes no bit."""
    xf = x.to(torch.promote_types(x.dtype, torch.float32)).view_as(x)
    rstd = torch.rsqrt(xf.pow(2).mean(dim=-1, keepdim=True) + eps)
    return (xf * rstd) * weight


class RMSNorm(nn.Module):
    """Ops `blocks.l.attn_norm`, `blocks.l.mlp_norm`, `norm`: RMSNorm with its weight."""

    def __init__(self, C: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(C))

    def forward(self, x):
        return rmsnorm(x, self.weight, self.eps)


class Embedding(nn.Module):
    """Op `embedding`: wte[tokens] (no position embedding). wte is the model's, passed in,
    so that its gradient is traced under its canary name."""

    def forward(self, tokens, wte):
        return F.embedding(tokens, wte)                                         # (B,T,C)


class Rope(nn.Module):
    """Ops `blocks.l.attn.rope_q` / `rope_k`: rotate-half RoPE on every head of x (B,T,heads*hd)."""

    def __init__(self, head_size: int):
        super().__init__()
        self.head_size = head_size

    def forward(self, x, cos, sin):
        B, T, width = x.shape
        hd, half = self.head_size, self.head_size // 2
        x = x.view(B, T, width // hd, hd)                                       # (B,T,heads,hd)
        x1, x2 = x[..., :half], x[..., half:]
        c, s = cos[:T, None, :], sin[:T, None, :]                               # (T,1,hd/2)
        y = torch.cat([x1 * c - x2 * s, x2 * c + x1 * s], dim=-1)               # (B,T,heads,hd)
        return y.view(B, T, width)


class Residual(nn.Module):
    """Ops `blocks.l.attn.residual` / `blocks.l.mlp.residual`: the stream plus the branch."""

    def forward(self, x, branch):
        return x + branch


def gqa_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, heads: int, kv_heads: int) -> torch.Tensor:
    """q (B,T,NH*hd), k and v (B,T,NKV*hd) -> (B,T,NH*hd): causal softmax(q k^T / sqrt(hd)) v
    per query head h with kv head h // (NH/NKV), heads re-joined."""
    B, T, width = q.shape
    hd = width // heads
    q = q.view(B, T, heads, hd).transpose(1, 2)                                 # (B,NH,T,hd)
    k = k.view(B, T, kv_heads, hd).transpose(1, 2).repeat_interleave(heads // kv_heads, dim=1)  # (B,NH,T,hd)
    v = v.view(B, T, kv_heads, hd).transpose(1, 2).repeat_interleave(heads // kv_heads, dim=1)  # (B,NH,T,hd)
    att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hd))                     # (B,NH,T,T)
    causal = torch.ones(T, T, dtype=torch.bool, device=att.device).tril()
    att = torch.softmax(att.masked_fill(~causal, float("-inf")), dim=-1)
    y = att @ v                                                                 # (B,NH,T,hd)
    return y.transpose(1, 2).contiguous().view(B, T, width)


class Attention(nn.Module):
    """Op `blocks.l.attn`: grouped-query attention from the rotated q, k and v. It also holds
    the ops around it (`q`, `k`, `v`, `rope_q`, `rope_k`, `o`, `residual`), which the block calls."""

    def __init__(self, cfg: LlamaConfig):
        super().__init__()
        C, hd = cfg.channels, cfg.head_size
        self.heads, self.kv_heads = cfg.heads, cfg.kv_heads
        self.q = nn.Linear(C, cfg.heads * hd, bias=False)
        self.k = nn.Linear(C, cfg.kv_heads * hd, bias=False)
        self.v = nn.Linear(C, cfg.kv_heads * hd, bias=False)
        self.o = nn.Linear(cfg.heads * hd, C, bias=False)
        self.rope_q = Rope(hd)
        self.rope_k = Rope(hd)
        self.residual = Residual()

    def forward(self, q, k, v):
        return gqa_attention(q, k, v, self.heads, self.kv_heads)


class SwiGLU(nn.Module):
    """Op `blocks.l.mlp.swiglu`: silu(gate) * up."""

    def forward(self, gate, up):
        return F.silu(gate) * up


class _Mlp(nn.Module):
    """The MLP's ops `gate`, `up`, `swiglu`, `down` and `residual` (a container; the block calls them)."""

    def __init__(self, C: int, H: int):
        super().__init__()
        self.gate = nn.Linear(C, H, bias=False)
        self.up = nn.Linear(C, H, bias=False)
        self.down = nn.Linear(H, C, bias=False)
        self.swiglu = SwiGLU()
        self.residual = Residual()


class Block(nn.Module):
    def __init__(self, cfg: LlamaConfig):
        super().__init__()
        self.attn_norm = RMSNorm(cfg.channels, cfg.layernorm_eps)
        self.attn = Attention(cfg)
        self.mlp_norm = RMSNorm(cfg.channels, cfg.layernorm_eps)
        self.mlp = _Mlp(cfg.channels, cfg.mlp_hidden)

    def forward(self, x, cos, sin):
        # (B,T,C) -> (B,T,C): the ops of canaries/architectures/llama/llama.cpp's forward, in its order
        a, m = self.attn, self.mlp
        h = self.attn_norm(x)
        q, k, v = a.q(h), a.k(h), a.v(h)
        q, k = a.rope_q(q, cos, sin), a.rope_k(k, cos, sin)
        x = a.residual(x, a.o(a(q, k, v)))
        h = self.mlp_norm(x)
        gate, up = m.gate(h), m.up(h)
        return m.residual(x, m.down(m.swiglu(gate, up)))


class Loss(nn.Module):
    """Op `loss`: the mean cross-entropy over all B*T positions."""

    def forward(self, logits, targets):
        return F.cross_entropy(logits.view(-1, logits.shape[-1]), targets.reshape(-1))


class Llama(CanaryModule):
    """The llama canary as a module: `loss = model(tokens)` with tokens (B, T+1).

    `init` ({name: array or tensor}, e.g. a pack's init) sets every parameter; without it
    the parameters are random_init()'s. named_parameters() yields the canary's tensor names
    in canonical order; every forward op is the module of that name
    (`model.get_submodule("blocks.1.attn.rope_k")`), called once per forward in
    forward_op_names() order.
    """

    def __init__(self, cfg: LlamaConfig, init: Optional[Mapping[str, Any]] = None,
                 device: Optional[Union[str, torch.device]] = None):
        super().__init__()
        self.cfg = cfg
        self.wte = nn.Parameter(torch.empty(cfg.vocab_size, cfg.channels))
        self.embedding = Embedding()
        self.blocks = nn.ModuleList(self.block_class(cfg) for _ in range(cfg.layers))
        self.norm = RMSNorm(cfg.channels, cfg.layernorm_eps)
        self.lm_head = nn.Linear(cfg.channels, cfg.vocab_size, bias=False)     # untied
        self.loss = Loss()
        cos, sin = rope_tables(cfg.context_length, cfg.head_size, cfg.rope_theta)
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)
        names = [n for n, _ in self.named_parameters()]
        assert names == [n for n, _ in self.canonical_table()], "module parameters are not the canary's canonical order"
        modules = dict(self.named_modules())
        assert all(op in modules for op in self.op_names()), "an op of the canary is not a module"
        self.load_canary_tensors(init if init is not None else random_init(cfg))
        if device is not None:
            self.to(device)

    # An architecture on llama's blocks (canary_harness.models.moe) replaces these three.
    block_class = Block

    def op_names(self) -> List[str]:
        return forward_op_names(self.cfg)

    def canonical_table(self) -> List[Tuple[str, Tuple[int, ...]]]:
        return tensor_table(self.cfg)

    def _forward(self, tokens: torch.Tensor) -> torch.Tensor:
        T = self.cfg.context_length
        inputs = tokens[:, :T].long()                          # (B,T)
        targets = tokens[:, 1:].long()                         # (B,T)
        x = self.embedding(inputs, self.wte)                   # (B,T,C)
        for blk in self.blocks:
            x = blk(x, self.rope_cos, self.rope_sin)           # (B,T,C)
        logits = self.lm_head(self.norm(x))                    # (B,T,V), untied
        return self.loss(logits, targets)


def reference_loss(params: Mapping[str, torch.Tensor], tokens: torch.Tensor, cfg: LlamaConfig) -> torch.Tensor:
    """The same loss written out plainly, loop over heads and positions, for tests at tiny
    sizes: RoPE as a rotation of each pair (i, i+hd/2) by t*theta^(-2i/hd) computed with
    math.pow (not the tables), attention head by head with kv head h // (NH/NKV). Any
    dtype (float64 for finite differences)."""
    T, NH, NKV, hd = cfg.context_length, cfg.heads, cfg.kv_heads, cfg.head_size
    half = hd // 2
    dtype = params["wte"].dtype
    inputs, targets = tokens[:, :T].long(), tokens[:, 1:].long()

    def rms(x, w):
        return x / torch.sqrt((x * x).mean(-1, keepdim=True) + cfg.layernorm_eps) * w

    angles = torch.tensor([[t * math.pow(cfg.rope_theta, -2.0 * i / hd) for i in range(half)] for t in range(T)],
                          dtype=dtype)

    def rope(x, heads):  # (B,T,heads*hd)
        out = torch.empty_like(x)
        for h in range(heads):
            a, b = x[..., h * hd:h * hd + half], x[..., h * hd + half:(h + 1) * hd]
            out[..., h * hd:h * hd + half] = a * torch.cos(angles) - b * torch.sin(angles)
            out[..., h * hd + half:(h + 1) * hd] = b * torch.cos(angles) + a * torch.sin(angles)
        return out

    x = params["wte"][inputs]
    mask = torch.ones(T, T, dtype=torch.bool).tril()
    for l in range(cfg.layers):
        p = f"blocks.{l}."
        h = rms(x, params[p + "attn_norm.weight"])
        q = rope(h @ params[p + "attn.q.weight"].T, NH)
        k = rope(h @ params[p + "attn.k.weight"].T, NKV)
        v = h @ params[p + "attn.v.weight"].T
        heads = []
        for hq in range(NH):
            g = hq // (NH // NKV)
            qh, kh, vh = q[..., hq * hd:(hq + 1) * hd], k[..., g * hd:(g + 1) * hd], v[..., g * hd:(g + 1) * hd]
            s = (qh @ kh.transpose(-2, -1)) / math.sqrt(hd)
            heads.append(torch.softmax(s.masked_fill(~mask, float("-inf")), dim=-1) @ vh)
        x = x + torch.cat(heads, dim=-1) @ params[p + "attn.o.weight"].T
        h = rms(x, params[p + "mlp_norm.weight"])
        gate, up = h @ params[p + "mlp.gate.weight"].T, h @ params[p + "mlp.up.weight"].T
        x = x + (gate * torch.sigmoid(gate) * up) @ params[p + "mlp.down.weight"].T
    logits = rms(x, params["norm.weight"]) @ params["lm_head.weight"].T
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


# What the lane reads of this architecture (canary_harness.runs.architectures, ARCHITECTURES["llama"]).
MODEL = Architecture("llama", LlamaConfig, Llama, forward_op_names, tensor_table, lr_at)
