"""The GPT-2 canary in PyTorch: the package's one implementation, on any device.

It follows the canary contract in docs/design.md ("The canary contract: preset tiny") and
nothing else: it shares no code, no kernels and no data layout with the C++ engines. The
forward pass uses PyTorch's own ops (F.embedding, F.layer_norm, F.linear, softmax,
F.gelu, F.cross_entropy), the backward pass is PyTorch autograd, and only the parts the
contract spells out as formulas (learning-rate schedule, global-norm clipping, AdamW) are
written by hand, literally from docs/design.md. It grew out of the external twin's model
(tests/twin), which now imports it: the PyTorch lane (canary_harness.lane), the twin and
bench/torch_step.py run this one module.

Parameters are a plain ordered dict {name: tensor} whose names and shapes are the
contract's tensor table (a pack's /init/<name>, a receipt's /tensors/step_XXXXXX/<name>),
or the nn.Module `GPT2`, whose named_parameters() are exactly those names in canonical
order. Weights are (out, in), as in torch.nn.Linear. Nothing here assumes a device:
positions and the causal mask are made on the tokens' device, so the same code runs on
CPU, CUDA and XLA.

Forward ops carry the C++ model's op names (docs/canary.md, "Fault injection"): in
forward_loss an optional `hook(name, tensor) -> tensor` sees every op's output; in `GPT2`
every op is a module whose path is its name, so module hooks see the same ops, which is
how the lane injects faults and traces ops (canary_harness.tracing.trace).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields
from typing import Any, Dict, List, Mapping, Optional, Tuple, Union

import torch
import torch.nn as nn
import torch.nn.functional as F

from ..runs.architectures import Architecture, architecture_of
from .module import CanaryModule, Hook, random_parameters
from .config import canary_object, check_sizes, typed_fields
from .table import gpt2_tensor_specs, gpt2_tensor_table, is_decayed


# ----------------------------------------------------------------------------------
# configuration (defaults = docs/design.md preset `tiny`)

@dataclass
class CanaryConfig:
    vocab_size: int = 256        # V
    context_length: int = 64     # T
    channels: int = 128          # C
    layers: int = 4              # L
    heads: int = 4               # NH (head size C/NH = 32)
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
    layernorm_eps: float = 1e-5  # biased variance
    preset: str = "tiny"         # the canary's name: lane names use it
    init_std: float = 0.02
    data_seed: int = 20240611
    # the MLP's GELU: "tanh" (GPT-2's approximation) or "erf" (exact); a canary JSON names
    # it only when it is not the default (docs/canary-files.md, model.gelu)
    gelu: str = field(default="tanh", metadata={"absent_means_default": True})

    @property
    def head_size(self) -> int:
        return self.channels // self.heads

    def field_names(self) -> List[str]:
        return [f.name for f in fields(self)]

    @classmethod
    def from_json(cls, canary: Union[str, bytes, Mapping[str, Any]]) -> "CanaryConfig":
        """The config of a canary JSON as the C++ writes it (a receipt's or pack's `canary`).

        Every key of the C++ config is required; a missing or mistyped one, another
        architecture, or sizes that do not fit raise ValueError naming the key.
        """
        canary = canary_object(canary)
        architecture = architecture_of(canary)
        if architecture != "gpt2":
            raise ValueError(f"canary architecture '{architecture}' is not this model's (gpt2); "
                             f"canary_harness.runs.architectures.model_of('{architecture}') gives its model")
        cfg = cls(**typed_fields(cls, canary))
        check_sizes(canary, ("vocab_size", "context_length", "channels", "layers", "heads", "batch_size", "steps"))
        if cfg.channels % cfg.heads != 0:
            raise ValueError(f"canary JSON: heads {cfg.heads} does not divide channels {cfg.channels}")
        if cfg.gelu not in TORCH_GELU:
            raise ValueError(f"canary JSON key 'gelu' is {cfg.gelu!r}, not one of {', '.join(TORCH_GELU)}")
        return cfg


# A canary's `gelu` as torch's `approximate` argument (F.gelu, nn.GELU).
TORCH_GELU = {"tanh": "tanh", "erf": "none"}


CLIP_EPS = 1e-6    # clip factor = max_grad_norm / (norm + CLIP_EPS)


# ----------------------------------------------------------------------------------
# the tensor table: names and shapes, in the contract's canonical order

def tensor_table(cfg: CanaryConfig) -> List[Tuple[str, Tuple[int, ...]]]:
    """[(name, shape)] in canonical order: wte, wpe, blocks.0.* .. blocks.L-1.*, lnf.*"""
    return gpt2_tensor_table(cfg.vocab_size, cfg.context_length, cfg.channels, cfg.layers)


def forward_op_names(cfg: CanaryConfig) -> List[str]:
    """The forward ops in execution order, named as the C++ model names them."""
    names = ["embedding"]
    for l in range(cfg.layers):
        p = f"blocks.{l}."
        names += [p + op for op in ("ln1", "attn.qkv", "attn", "attn.proj", "attn.residual", "ln2", "mlp.fc",
                                    "mlp.gelu", "mlp.proj", "mlp.residual")]
    return names + ["lnf", "lm_head", "loss"]


def random_init(cfg: CanaryConfig, seed: int = 0) -> Dict[str, torch.Tensor]:
    """Random parameters with the contract's init distribution (for the benchmark; the
    twin and the lane always start from the harness's own init, a dump or a pack). Uses
    torch's generator, so values differ from the C++ engine's counter-based generator."""
    specs = gpt2_tensor_specs(cfg.vocab_size, cfg.context_length, cfg.channels, cfg.layers)
    return {name: t.requires_grad_(True) for name, t in random_parameters(specs, cfg.init_std, cfg.layers, seed).items()}


# ----------------------------------------------------------------------------------
# forward pass: one small function per op, shapes in comments. The functional model
# (forward_loss) and the module (GPT2) both call exactly these, in the same order, so the
# two give the same bits.

def _identity(name: str, t: torch.Tensor) -> torch.Tensor:
    return t


def embed(p, tokens):
    # tokens (B,T) int64 -> x (B,T,C) = wte[tok] + wpe[pos]
    T = tokens.shape[1]
    pos = torch.arange(T, dtype=torch.long, device=tokens.device)
    return F.embedding(tokens, p["wte"]) + F.embedding(pos, p["wpe"])[None, :, :]


def layernorm(x, weight, bias, cfg):
    # x (B,T,C) -> (B,T,C); biased variance, eps cfg.layernorm_eps (1e-5)
    return F.layer_norm(x, (x.shape[-1],), weight, bias, cfg.layernorm_eps)


def attention_core(qkv, heads: int):
    # qkv (B,T,3C) -> (B,T,C): causal softmax(q k^T / sqrt(hs)) v, heads re-joined
    B, T, C3 = qkv.shape
    C = C3 // 3
    NH, hs = heads, C // heads
    q, k, v = qkv.split(C, dim=-1)                         # each (B,T,C): q, k, v in order
    # heads contiguous: head h uses columns h*hs .. h*hs+hs-1
    q = q.view(B, T, NH, hs).transpose(1, 2)               # (B,NH,T,hs)
    k = k.view(B, T, NH, hs).transpose(1, 2)               # (B,NH,T,hs)
    v = v.view(B, T, NH, hs).transpose(1, 2)               # (B,NH,T,hs)
    att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hs))  # (B,NH,T,T)
    causal = torch.ones(T, T, dtype=torch.bool, device=qkv.device).tril()
    att = att.masked_fill(~causal, float("-inf"))
    att = torch.softmax(att, dim=-1)                       # (B,NH,T,T)
    y = att @ v                                            # (B,NH,T,hs)
    return y.transpose(1, 2).contiguous().view(B, T, C)    # (B,T,C) heads re-joined


def gelu(x, cfg):
    # tanh: 0.5x(1+tanh(sqrt(2/pi)(x+0.044715x^3))); erf: x Phi(x)
    return F.gelu(x, approximate=TORCH_GELU[cfg.gelu])


def residual(x, branch):
    # (B,T,C) + (B,T,C)
    return x + branch


def lm_head(x, wte):
    # x (B,T,C) -> logits (B,T,V), tied to wte
    return F.linear(x, wte)


def cross_entropy(logits, targets):
    # logits (B,T,V), targets (B,T) -> scalar mean cross-entropy over all B*T positions
    return F.cross_entropy(logits.view(-1, logits.shape[-1]), targets.reshape(-1))


def attention(x, p, prefix, cfg, hook: Hook = _identity):
    # x (B,T,C) -> (B,T,C)
    qkv = hook(prefix + "attn.qkv",
               F.linear(x, p[prefix + "attn.qkv.weight"], p[prefix + "attn.qkv.bias"]))  # (B,T,3C)
    y = hook(prefix + "attn", attention_core(qkv, cfg.heads))  # (B,T,C)
    return hook(prefix + "attn.proj", F.linear(y, p[prefix + "attn.proj.weight"], p[prefix + "attn.proj.bias"]))


def mlp(x, p, prefix, cfg, hook: Hook = _identity):
    # x (B,T,C) -> (B,T,4C) -> gelu -> (B,T,C)
    h = hook(prefix + "mlp.fc", F.linear(x, p[prefix + "mlp.fc.weight"], p[prefix + "mlp.fc.bias"]))  # (B,T,4C)
    h = hook(prefix + "mlp.gelu", gelu(h, cfg))
    return hook(prefix + "mlp.proj", F.linear(h, p[prefix + "mlp.proj.weight"], p[prefix + "mlp.proj.bias"]))


def block(x, p, l, cfg, hook: Hook = _identity):
    # pre-LN transformer block: (B,T,C) -> (B,T,C)
    prefix = f"blocks.{l}."
    h = hook(prefix + "ln1", layernorm(x, p[prefix + "ln1.weight"], p[prefix + "ln1.bias"], cfg))
    x = hook(prefix + "attn.residual", residual(x, attention(h, p, prefix, cfg, hook)))
    h = hook(prefix + "ln2", layernorm(x, p[prefix + "ln2.weight"], p[prefix + "ln2.bias"], cfg))
    x = hook(prefix + "mlp.residual", residual(x, mlp(h, p, prefix, cfg, hook)))
    return x


def forward_loss(p, tokens, cfg, hook: Optional[Hook] = None):
    # tokens (B,T+1) int -> scalar loss (mean cross-entropy over all B*T positions)
    hook = hook or _identity
    T = cfg.context_length
    inputs = tokens[:, :T].long()                          # (B,T)
    targets = tokens[:, 1:].long()                         # (B,T)
    x = hook("embedding", embed(p, inputs))                # (B,T,C)
    for l in range(cfg.layers):
        x = block(x, p, l, cfg, hook)                      # (B,T,C)
    x = hook("lnf", layernorm(x, p["lnf.weight"], p["lnf.bias"], cfg))  # (B,T,C)
    logits = hook("lm_head", lm_head(x, p["wte"]))         # (B,T,V), LM head tied to wte
    return hook("loss", cross_entropy(logits, targets))


# ----------------------------------------------------------------------------------
# the model as an nn.Module: named_parameters() are the canary's names, canonical order,
# and every op of the C++ model is a module whose path is the op's name (`embedding`,
# `blocks.2.attn.qkv`, `blocks.2.attn`, ..., `lm_head`, `loss`). Containers (the blocks,
# `mlp`) only call their op modules; an op module calls no other module. Op tracing
# (canary_harness.tracing.trace) and fault injection hook these modules.

class Embedding(nn.Module):
    """Op `embedding`: wte[tokens] + wpe[positions]. wte and wpe are the model's (wte is tied
    to the LM head), passed in, so the op holds no parameter of its own."""

    def forward(self, tokens, wte, wpe):
        return embed({"wte": wte, "wpe": wpe}, tokens)


class Residual(nn.Module):
    """Op `blocks.l.attn.residual` / `blocks.l.mlp.residual`: the stream plus the branch."""

    def forward(self, x, branch):
        return residual(x, branch)


class Attention(nn.Module):
    """Op `blocks.l.attn`: the attention core (qkv -> heads re-joined). It also holds the ops
    around it, `qkv`, `proj` and `residual`, which the block calls."""

    def __init__(self, C: int, heads: int):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(C, 3 * C)
        self.proj = nn.Linear(C, C)
        self.residual = Residual()

    def forward(self, qkv):
        return attention_core(qkv, self.heads)


class _Mlp(nn.Module):
    """The MLP's ops `fc`, `gelu`, `proj` and `residual` (a container; the block calls them)."""

    def __init__(self, C: int, gelu: str):
        super().__init__()
        self.fc = nn.Linear(C, 4 * C)
        self.gelu = nn.GELU(approximate=TORCH_GELU[gelu])
        self.proj = nn.Linear(4 * C, C)
        self.residual = Residual()


class _Block(nn.Module):
    def __init__(self, cfg: CanaryConfig):
        super().__init__()
        C = cfg.channels
        self.ln1 = nn.LayerNorm(C, eps=cfg.layernorm_eps)
        self.attn = Attention(C, cfg.heads)
        self.ln2 = nn.LayerNorm(C, eps=cfg.layernorm_eps)
        self.mlp = _Mlp(C, cfg.gelu)

    def forward(self, x):
        # pre-LN transformer block: (B,T,C) -> (B,T,C), the ops of block() in its order
        attn, mlp = self.attn, self.mlp
        x = attn.residual(x, attn.proj(attn(attn.qkv(self.ln1(x)))))
        return mlp.residual(x, mlp.proj(mlp.gelu(mlp.fc(self.ln2(x)))))


class LmHead(nn.Module):
    """Op `lm_head`: logits = x @ wte^T (tied: wte is passed in)."""

    def forward(self, x, wte):
        return lm_head(x, wte)


class Loss(nn.Module):
    """Op `loss`: the mean cross-entropy."""

    def forward(self, logits, targets):
        return cross_entropy(logits, targets)


class GPT2(CanaryModule):
    """The canary as a module: `loss = model(tokens)` with tokens (B, T+1).

    `init` ({name: array or tensor}, e.g. a pack's init) sets every parameter; without it
    the parameters are random_init()'s. named_parameters() yields the canary's tensor
    names in canonical order, so a Recorder's name map for this model is the identity.
    Every forward op is the module of that name (`model.get_submodule("blocks.1.attn.proj")`),
    called once per forward in forward_op_names() order; it computes what forward_loss
    computes, bit for bit.
    """

    def __init__(self, cfg: CanaryConfig, init: Optional[Mapping[str, Any]] = None,
                 device: Optional[Union[str, torch.device]] = None):
        super().__init__()
        self.cfg = cfg
        V, T, C = cfg.vocab_size, cfg.context_length, cfg.channels
        self.wte = nn.Parameter(torch.empty(V, C))
        self.wpe = nn.Parameter(torch.empty(T, C))
        self.embedding = Embedding()
        self.blocks = nn.ModuleList(_Block(cfg) for _ in range(cfg.layers))
        self.lnf = nn.LayerNorm(C, eps=cfg.layernorm_eps)
        self.lm_head = LmHead()
        self.loss = Loss()
        names = [n for n, _ in self.named_parameters()]
        table = tensor_table(cfg)
        assert names == [n for n, _ in table], "module parameters are not the canary's canonical order"
        modules = dict(self.named_modules())
        assert all(op in modules for op in forward_op_names(cfg)), "an op of the canary is not a module"
        self.load_canary_tensors(init if init is not None else random_init(cfg))
        if device is not None:
            self.to(device)

    def op_names(self) -> List[str]:
        return forward_op_names(self.cfg)

    def _forward(self, tokens: torch.Tensor) -> torch.Tensor:
        T = self.cfg.context_length
        inputs = tokens[:, :T].long()                          # (B,T)
        targets = tokens[:, 1:].long()                         # (B,T)
        x = self.embedding(inputs, self.wte, self.wpe)         # (B,T,C)
        for blk in self.blocks:
            x = blk(x)                                         # (B,T,C)
        x = self.lnf(x)                                        # (B,T,C)
        logits = self.lm_head(x, self.wte)                     # (B,T,V), tied to wte
        return self.loss(logits, targets)


# ----------------------------------------------------------------------------------
# schedule, clipping, AdamW: written literally from docs/design.md

def lr_at(step: int, cfg: CanaryConfig) -> float:
    """Learning rate of step `step` (0-based), in float64."""
    peak = cfg.peak_lr
    lo = cfg.min_lr_ratio * peak
    w = cfg.warmup_steps
    if step < w:
        return peak * (step + 1) / w
    span = cfg.steps - w
    if span <= 0:
        return lo
    return lo + 0.5 * (peak - lo) * (1.0 + math.cos(math.pi * (step - w) / span))


def bias_corrections(step: int, cfg: CanaryConfig) -> Tuple[float, float]:
    """(1 - beta1^t, 1 - beta2^t) with t = step + 1, beta^t by repeated products in float64
    (as the C++ model computes them)."""
    b1t = b2t = 1.0
    for _ in range(step + 1):
        b1t *= cfg.beta1
        b2t *= cfg.beta2
    return 1.0 - b1t, 1.0 - b2t


def global_grad_norm(grads):
    """L2 norm over all gradients (accumulated in float64), returned as a Python float."""
    total = torch.zeros((), dtype=torch.float64)
    for g in grads:
        total += g.double().pow(2).sum().cpu()
    return math.sqrt(total.item())


def clip_grads_(grads, norm, cfg):
    """If norm > max_grad_norm, scale every gradient by max_grad_norm / (norm + 1e-6)."""
    if norm > cfg.max_grad_norm:
        for g in grads:
            g.mul_(torch.tensor(cfg.max_grad_norm / (norm + CLIP_EPS), dtype=torch.float32, device=g.device))


class AdamW:
    """AdamW exactly as docs/design.md writes it (= PyTorch's AdamW), with host scalars (the
    twin's optimizer; the lane's XLA-safe one is canary_harness.runs.optim.CanaryAdamW):
        p *= 1 - lr*wd                      (2-D tensors only)
        m  = b1 m + (1-b1) g
        v  = b2 v + (1-b2) g^2
        p -= lr * (m/(1-b1^t)) / (sqrt(v/(1-b2^t)) + eps),   t = step+1
    All state is fp32; per-step scalars are fp32 0-D tensors."""

    def __init__(self, params, cfg):
        self.cfg = cfg
        self.m = {n: torch.zeros_like(t, dtype=torch.float32) for n, t in params.items()}
        self.v = {n: torch.zeros_like(t, dtype=torch.float32) for n, t in params.items()}

    @torch.no_grad()
    def step(self, params, grads, step, lr):
        c = self.cfg
        t = step + 1
        for name, p in params.items():
            f32 = lambda x: torch.tensor(x, dtype=torch.float32, device=p.device)  # noqa: E731
            g = grads[name]
            m, v = self.m[name], self.v[name]
            if is_decayed(p.shape):
                p.mul_(f32(1.0 - lr * c.weight_decay))
            m.mul_(c.beta1).add_(g, alpha=1.0 - c.beta1)
            v.mul_(c.beta2).addcmul_(g, g, value=1.0 - c.beta2)
            p.sub_(f32(lr) * (m / f32(1.0 - c.beta1 ** t)) / (torch.sqrt(v / f32(1.0 - c.beta2 ** t)) + c.adam_eps))


class TorchAdamW:
    """The same update through torch.optim.AdamW (two param groups: decayed and not),
    for cross-checking the hand-written one. lr is set on the groups every step."""

    def __init__(self, params, cfg):
        decay = [t for n, t in params.items() if is_decayed(t.shape)]
        no_decay = [t for n, t in params.items() if not is_decayed(t.shape)]
        self.opt = torch.optim.AdamW(
            [{"params": decay, "weight_decay": cfg.weight_decay},
             {"params": no_decay, "weight_decay": 0.0}],
            lr=cfg.peak_lr, betas=(cfg.beta1, cfg.beta2), eps=cfg.adam_eps)

    def step(self, params, grads, step, lr):
        for g in self.opt.param_groups:
            g["lr"] = lr
        self.opt.step()  # gradients are read from .grad, which `grads` aliases


# ----------------------------------------------------------------------------------
# one training step (the twin's: host scalars, host reads; the lane's is XLA-safe)

def train_step(params, opt, tokens, step, cfg):
    """Step s: loss on params_s with batch s, backward, clip, AdamW -> params_{s+1}.
    tokens (B,T+1) int. Returns (loss float, grad_norm before clipping, lr)."""
    for t in params.values():
        t.grad = None
    loss = forward_loss(params, tokens, cfg)
    loss.backward()
    grads = {n: t.grad for n, t in params.items()}
    norm = global_grad_norm(grads.values())
    clip_grads_(grads.values(), norm, cfg)
    lr = lr_at(step, cfg)
    opt.step(params, grads, step, lr)
    return loss.item(), norm, lr


# What the lane reads of this architecture (canary_harness.runs.architectures, ARCHITECTURES["gpt2"]).
MODEL = Architecture("gpt2", CanaryConfig, GPT2, forward_op_names, tensor_table, lr_at)
