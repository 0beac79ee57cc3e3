"""The moe canary in PyTorch (architecture "moe"), on any device.

It follows the moe contract of docs/design.md ("The `moe` architecture") and the C++ model
(canaries/architectures/moe/moe.cpp, engines/kernels/moe_kernels.cpp) in names, shapes,
decisions and op order, and shares no code or kernels with them: llama's blocks
(canary_harness.models.llama) whose MLP is a mixture of E SwiGLU experts, K per token:

    probs   = softmax(router(rms(h)))                                (N = B*T rows, E experts)
    expert  = each row's K most probable experts, most probable first (a tie: the lower expert)
    weights = their probabilities renormalised to sum to 1
    slot    = the choice's row in its expert's buffer of cap rows, filled rank by rank
              (every row's first choice, rows in order, before any row's second); a choice
              past its expert's capacity is dropped (slot -1) and adds nothing
    x       = h + sum over a row's placed choices of weight * down_e(silu(gate_e(u)) * up_e(u))

The router also trains on the Switch balance loss `balance_coef * E * sum_e f_e P_e` (f_e:
the share of the N*K choices that picked e, before capacity, held constant; P_e: e's mean
probability). The loss the model returns is the language-model loss plus
`balance - balance.detach()`: its value is the language-model loss bit for bit (what the
receipt records, as the C++ does) and its gradient carries the balance loss's.

The decisions are a function of the probabilities only; they are computed without a host
read (a stable sort, cumulative sums over one-hot choices), so a step stays on the device.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, List, Mapping, Optional, Tuple, Union

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
import xxhash

from ..runs.architectures import Architecture
from ..receipts.receipt import StepState
from .gpt2 import lr_at  # the schedule is gpt2's: docs/canary.md
from .llama import LlamaConfig, Attention, Block, Residual, RMSNorm, SwiGLU, Llama, LAYER_OPS
from .module import random_parameters
from .table import moe_tensor_specs, names_and_shapes

ARCHITECTURE = "moe"


@dataclass
class MoeConfig(LlamaConfig):
    """llama's keys plus the experts' (defaults = canaries/moe-tiny.toml)."""

    mlp_hidden: int = 176           # H, each expert's
    experts: int = 4                # E
    experts_per_token: int = 2      # K
    capacity_factor: float = 1.25
    balance_coef: float = 0.01
    preset: str = "moe-tiny"
    architecture: str = ARCHITECTURE

    @property
    def expert_capacity(self) -> int:
        """ceil(capacity_factor * B*T*K / E), in float64 as the C++ (CanaryConfig::expert_capacity)."""
        rows = self.capacity_factor * self.batch_size * self.context_length * self.experts_per_token / self.experts
        whole = int(rows)
        return whole + 1 if whole < rows else whole

    @classmethod
    def from_json(cls, canary: Union[str, bytes, Mapping[str, Any]]) -> "MoeConfig":
        """The config of a moe canary JSON (llama's checks, then the experts'); ValueError naming the key."""
        cfg = super().from_json(canary)
        assert isinstance(cfg, MoeConfig)
        if cfg.experts < 2:
            raise ValueError(f"canary JSON key 'experts' must be 2 or more (is {cfg.experts})")
        if not 1 <= cfg.experts_per_token <= cfg.experts:
            raise ValueError(f"canary JSON key 'experts_per_token' must be 1..{cfg.experts} "
                             f"(is {cfg.experts_per_token})")
        if not cfg.capacity_factor > 0.0:
            raise ValueError(f"canary JSON key 'capacity_factor' must be > 0 (is {cfg.capacity_factor})")
        return cfg


def tensor_specs(cfg: MoeConfig):
    return moe_tensor_specs(cfg.vocab_size, cfg.channels, cfg.layers, cfg.heads, cfg.kv_heads, cfg.mlp_hidden,
                            cfg.experts)


def tensor_table(cfg: MoeConfig) -> List[Tuple[str, Tuple[int, ...]]]:
    """[(name, shape)] in canonical order: llama's, each block's mlp.* replaced by moe.*"""
    return names_and_shapes(tensor_specs(cfg))


MOE_OPS = ("moe.router", "moe.route", "moe.dispatch", "moe.experts.gate", "moe.experts.up", "moe.experts.swiglu",
           "moe.experts.down", "moe.combine")


def forward_op_names(cfg: MoeConfig) -> List[str]:
    """The forward ops in execution order, named as the C++ model names them."""
    layer_ops: List[str] = []
    for op in LAYER_OPS:  # llama's block with its MLP ops replaced by the experts'
        if op == "mlp.gate":
            layer_ops += MOE_OPS
        elif op not in ("mlp.up", "mlp.swiglu", "mlp.down"):
            layer_ops.append(op)
    names = ["embedding"]
    for l in range(cfg.layers):
        names += [f"blocks.{l}.{op}" for op in layer_ops]
    return names + ["norm", "lm_head", "loss"]


def random_init(cfg: MoeConfig, seed: int = 0):
    return random_parameters(tensor_specs(cfg), cfg.init_std, cfg.layers, seed)


# ----------------------------------------------------------------------------------
# the ops

def route(probs: torch.Tensor, top_k: int, capacity: int) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """probs (N,E) -> (weights, expert, slot), each (N,K): the kernel's decisions
    (engines/kernels/moe_kernels.h, moe_route_forward). expert and slot are int64; slot is
    -1 for a dropped choice."""
    N, E = probs.shape
    # A stable descending sort keeps the lower expert first among equal probabilities.
    _, order = torch.sort(probs, dim=-1, descending=True, stable=True)
    expert = order[:, :top_k]                                                 # (N,K)
    chosen = torch.gather(probs, 1, expert)                                   # (N,K)
    weights = chosen / chosen.sum(dim=-1, keepdim=True)
    # Capacity, rank-major: choice (n, j) is the c-th of its expert, counting every row's
    # ranks before j, then the rows before n at rank j.
    one_hot = F.one_hot(expert.transpose(0, 1).reshape(-1), E)                # (K*N,E), rank-major
    position = torch.cumsum(one_hot, dim=0) - one_hot                         # choices of that expert before
    taken = (position * one_hot).sum(dim=-1).view(top_k, N).transpose(0, 1)   # (N,K)
    slot = torch.where(taken < capacity, taken, torch.full_like(taken, -1))
    return weights, expert, slot


def balance_loss(probs: torch.Tensor, expert: torch.Tensor, coef: float) -> torch.Tensor:
    """coef * E * sum_e f_e P_e: f_e the share of the N*K choices of e (a constant), P_e the mean probability."""
    N, E = probs.shape
    share = F.one_hot(expert.reshape(-1), E).sum(dim=0).to(probs.dtype) / expert.numel()
    return coef * E * (share * probs.mean(dim=0)).sum()


def routing_record(route_op: "_Route", experts: int) -> List[float]:
    """One layer's record of its last forward (host values; kernels/moe_kernels.h,
    moe_routing_record): the rows each expert took, the dropped choices, the balance loss,
    and the low 48 bits of the XXH3-64 of every choice's (expert, slot) as little-endian
    int32 pairs in choice order."""
    expert, slot = (t.detach().reshape(-1).cpu().numpy().astype("<i4") for t in route_op.decisions)
    placed = slot >= 0
    counts = np.bincount(expert[placed], minlength=experts).astype(float)
    pairs = np.stack([expert, slot], axis=1).reshape(-1)
    decisions_hash = xxhash.xxh3_64_intdigest(pairs.tobytes()) & ((1 << 48) - 1)
    return [*counts, float(expert.size - placed.sum()), float(route_op.balance.detach().cpu()), float(decisions_hash)]


class _Route(nn.Module):
    """Op `blocks.l.moe.route`: router logits (B,T,E) -> (weights, expert, slot), each (B,T,K),
    and the layer's balance loss (kept on the module for the model to add)."""

    def __init__(self, cfg: MoeConfig):
        super().__init__()
        self.top_k, self.capacity, self.coef = cfg.experts_per_token, cfg.expert_capacity, cfg.balance_coef

    def forward(self, logits):
        B, T, E = logits.shape
        # At least fp32, as the C++ router (a bf16 logit under autocast is widened; float64 stays).
        probs = torch.softmax(logits.to(torch.promote_types(logits.dtype, torch.float32)).view(B * T, E), dim=-1)
        weights, expert, slot = route(probs, self.top_k, self.capacity)
        self.balance = balance_loss(probs, expert, self.coef)
        self.decisions = (expert, slot)  # for the step's routing record, read after the step
        K = self.top_k
        return weights.view(B, T, K), expert.view(B, T, K), slot.view(B, T, K)


class _Dispatch(nn.Module):
    """Op `blocks.l.moe.dispatch`: each placed choice's token row at (expert, slot) of the
    experts' buffers (E,cap,C), zeros in empty slots."""

    def __init__(self, cfg: MoeConfig):
        super().__init__()
        self.experts, self.capacity = cfg.experts, cfg.expert_capacity

    def forward(self, x, expert, slot):
        B, T, C = x.shape
        K = expert.shape[-1]
        rows = x.reshape(B * T, 1, C).expand(B * T, K, C).reshape(-1, C)      # (N*K,C), choice order
        placed = (slot >= 0).reshape(-1)
        target = expert.reshape(-1) * self.capacity + slot.reshape(-1).clamp(min=0)
        # Dropped choices write zeros into a spare row past the buffers, cut off below.
        target = torch.where(placed, target, torch.full_like(target, self.experts * self.capacity))
        buffers = x.new_zeros(self.experts * self.capacity + 1, C).index_add(0, target, rows * placed[:, None])
        return buffers[:-1].view(self.experts, self.capacity, C)


class _ExpertLinear(nn.Module):
    """Ops `blocks.l.moe.experts.gate` / `up` / `down`: every expert's own linear layer,
    out (E,cap,OC) = inp (E,cap,C) @ weight (E,OC,C)^T."""

    def __init__(self, experts: int, in_features: int, out_features: int):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(experts, out_features, in_features))

    def forward(self, x):
        return torch.bmm(x, self.weight.transpose(1, 2))


class _Combine(nn.Module):
    """Op `blocks.l.moe.combine`: each token's weighted sum of its placed choices' expert
    outputs (B,T,C), in rank order."""

    def __init__(self, cfg: MoeConfig):
        super().__init__()
        self.capacity = cfg.expert_capacity

    def forward(self, expert_out, weights, expert, slot):
        B, T, K = expert.shape
        E, cap, C = expert_out.shape
        placed = slot >= 0
        index = (expert * cap + slot.clamp(min=0)).reshape(-1)                   # (N*K,)
        rows = expert_out.reshape(E * cap, C).index_select(0, index).view(B, T, K, C)
        scale = torch.where(placed, weights, torch.zeros_like(weights)).to(rows.dtype)
        out = rows[:, :, 0] * scale[..., 0:1]
        for j in range(1, K):
            out = out + rows[:, :, j] * scale[..., j:j + 1]
        return out


class _Experts(nn.Module):
    """The experts' ops `gate`, `up`, `swiglu`, `down` (a container)."""

    def __init__(self, cfg: MoeConfig):
        super().__init__()
        E, C, H = cfg.experts, cfg.channels, cfg.mlp_hidden
        self.gate = _ExpertLinear(E, C, H)
        self.up = _ExpertLinear(E, C, H)
        self.down = _ExpertLinear(E, H, C)
        self.swiglu = SwiGLU()


class _Moe(nn.Module):
    """The MoE ops of a block: `router`, `route`, `dispatch`, `experts.*`, `combine` (a container)."""

    def __init__(self, cfg: MoeConfig):
        super().__init__()
        self.router = nn.Linear(cfg.channels, cfg.experts, bias=False)
        self.route = _Route(cfg)
        self.dispatch = _Dispatch(cfg)
        self.experts = _Experts(cfg)
        self.combine = _Combine(cfg)

    def forward(self, h):
        ex = self.experts
        weights, expert, slot = self.route(self.router(h))
        buffers = self.dispatch(h, expert, slot)                                 # (E,cap,C)
        out = ex.down(ex.swiglu(ex.gate(buffers), ex.up(buffers)))               # (E,cap,C)
        return self.combine(out, weights, expert, slot)                          # (B,T,C)


class _MlpResidual(nn.Module):
    """Holds op `blocks.l.mlp.residual` under llama's name."""

    def __init__(self):
        super().__init__()
        self.residual = Residual()


class _MoeBlock(Block):
    def __init__(self, cfg: MoeConfig):
        nn.Module.__init__(self)
        # Registration order is the canonical parameter order: attn_norm, attn.*, mlp_norm, moe.*
        self.attn_norm = RMSNorm(cfg.channels, cfg.layernorm_eps)
        self.attn = Attention(cfg)
        self.mlp_norm = RMSNorm(cfg.channels, cfg.layernorm_eps)
        self.moe = _Moe(cfg)
        self.mlp = _MlpResidual()

    def forward(self, x, cos, sin):
        a = self.attn
        h = self.attn_norm(x)
        q, k, v = a.q(h), a.k(h), a.v(h)
        q, k = a.rope_q(q, cos, sin), a.rope_k(k, cos, sin)
        x = a.residual(x, a.o(a(q, k, v)))
        return self.mlp.residual(x, self.moe(self.mlp_norm(x)))


class Moe(Llama):
    """The moe canary as a module: `loss = model(tokens)`, as Llama (parameters by canary
    name in canonical order, every forward op the module of its name)."""

    block_class = _MoeBlock

    def __init__(self, cfg: MoeConfig, init: Optional[Mapping[str, Any]] = None,
                 device: Optional[Union[str, torch.device]] = None):
        super().__init__(cfg, init if init is not None else random_init(cfg), device)

    def op_names(self) -> List[str]:
        return forward_op_names(self.cfg)

    def canonical_table(self) -> List[Tuple[str, Tuple[int, ...]]]:
        return tensor_table(self.cfg)

    def step_state(self) -> List[StepState]:
        """The step's routing records, read after the step: /routing as the C++ model writes it
        (canaries/architectures/moe/moe.cpp), one column per layer's route op."""
        names = [n for n in forward_op_names(self.cfg) if n.endswith(".moe.route")]
        records = [routing_record(blk.moe.route, self.cfg.experts) for blk in self.blocks]
        fields = [(f"tokens_expert_{e}", [r[e] for r in records]) for e in range(self.cfg.experts)]
        for i, name in enumerate(("dropped", "balance_loss", "decisions_hash")):
            fields.append((name, [r[self.cfg.experts + i] for r in records]))
        return [StepState("routing", names, fields)]

    def _forward(self, tokens: torch.Tensor) -> torch.Tensor:
        loss = super()._forward(tokens)
        balance = sum(blk.moe.route.balance for blk in self.blocks)
        return loss + (balance - balance.detach())  # the LM loss's value, the balance loss's gradient


# What the lane reads of this architecture (canary_harness.runs.architectures, ARCHITECTURES["moe"]).
MODEL = Architecture("moe", MoeConfig, Moe, forward_op_names, tensor_table, lr_at)
