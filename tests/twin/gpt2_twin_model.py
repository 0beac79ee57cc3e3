"""GPT-2 canary model, written a second time in PyTorch (fp32, CPU).

This module is the model half of the external twin (tests/twin/torch_twin.py) and of
the PyTorch step benchmark (bench/torch_step.py). It follows the canary contract in
DESIGN.md ("The canary contract: preset tiny") and nothing else: it shares no code,
no kernels and no data layout with the C++ engines. The forward pass uses PyTorch's
own ops (F.embedding, F.layer_norm, F.linear, softmax, F.gelu, F.cross_entropy), the
backward pass is PyTorch autograd, and only the parts that the contract spells out as
formulas (learning-rate schedule, global-norm clipping, AdamW) are written by hand,
literally from DESIGN.md.

Parameters live in a plain ordered dict {name: tensor} whose names and shapes are the
contract's tensor table, so they load directly from a receipt's
/tensors/step_XXXXXX/<name> datasets. Weights are (out, in), as in torch.nn.Linear.
"""

import math
from dataclasses import dataclass, fields

import torch
import torch.nn.functional as F


# ----------------------------------------------------------------------------------
# configuration (defaults = DESIGN.md preset `tiny`)

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

    @property
    def head_size(self):
        return self.channels // self.heads

    def field_names(self):
        return [f.name for f in fields(self)]


CLIP_EPS = 1e-6    # clip factor = max_grad_norm / (norm + CLIP_EPS)


# ----------------------------------------------------------------------------------
# the tensor table: names and shapes, in the contract's canonical order

def tensor_table(cfg):
    """[(name, shape)] in canonical order: wte, wpe, blocks.0.* .. blocks.L-1.*, lnf.*"""
    V, T, C = cfg.vocab_size, cfg.context_length, cfg.channels
    table = [("wte", (V, C)), ("wpe", (T, C))]
    for l in range(cfg.layers):
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


def is_decayed(name, shape):
    """AdamW weight decay applies to 2-D tensors only: wte, wpe, every .weight matrix.
    Biases and LayerNorm weights (1-D) are not decayed."""
    return len(shape) == 2


def random_init(cfg, seed=0):
    """Random parameters with the contract's init distribution (for the benchmark; the
    twin itself always starts from the receipt's step-0 dump). Uses torch's generator,
    so values differ from the C++ engine's counter-based generator."""
    g = torch.Generator().manual_seed(seed)
    proj_std = 0.02 / math.sqrt(2 * cfg.layers)
    params = {}
    for name, shape in tensor_table(cfg):
        if name.endswith("ln1.weight") or name.endswith("ln2.weight") or name == "lnf.weight":
            t = torch.ones(shape)
        elif len(shape) == 1:
            t = torch.zeros(shape)
        else:
            std = proj_std if name.endswith(".proj.weight") else 0.02
            t = torch.randn(shape, generator=g) * std
        params[name] = t.to(torch.float32).requires_grad_(True)
    return params


# ----------------------------------------------------------------------------------
# forward pass: one small function per piece, shapes in comments

def embed(p, tokens):
    # tokens (B,T) int64 -> x (B,T,C) = wte[tok] + wpe[pos]
    T = tokens.shape[1]
    pos = torch.arange(T, dtype=torch.long)
    return F.embedding(tokens, p["wte"]) + F.embedding(pos, p["wpe"])[None, :, :]


def layernorm(x, weight, bias, cfg):
    # x (B,T,C) -> (B,T,C); biased variance, eps cfg.layernorm_eps (1e-5)
    return F.layer_norm(x, (x.shape[-1],), weight, bias, cfg.layernorm_eps)


def attention(x, p, prefix, cfg):
    # x (B,T,C) -> (B,T,C)
    B, T, C = x.shape
    NH, hs = cfg.heads, cfg.head_size
    qkv = F.linear(x, p[prefix + "attn.qkv.weight"], p[prefix + "attn.qkv.bias"])  # (B,T,3C)
    q, k, v = qkv.split(C, dim=-1)                         # each (B,T,C): q, k, v in order
    # heads contiguous: head h uses columns h*hs .. h*hs+hs-1
    q = q.view(B, T, NH, hs).transpose(1, 2)               # (B,NH,T,hs)
    k = k.view(B, T, NH, hs).transpose(1, 2)               # (B,NH,T,hs)
    v = v.view(B, T, NH, hs).transpose(1, 2)               # (B,NH,T,hs)
    att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hs))  # (B,NH,T,T)
    causal = torch.ones(T, T, dtype=torch.bool).tril()
    att = att.masked_fill(~causal, float("-inf"))
    att = torch.softmax(att, dim=-1)                       # (B,NH,T,T)
    y = att @ v                                            # (B,NH,T,hs)
    y = y.transpose(1, 2).contiguous().view(B, T, C)       # (B,T,C) heads re-joined
    return F.linear(y, p[prefix + "attn.proj.weight"], p[prefix + "attn.proj.bias"])


def mlp(x, p, prefix):
    # x (B,T,C) -> (B,T,4C) -> gelu -> (B,T,C)
    h = F.linear(x, p[prefix + "mlp.fc.weight"], p[prefix + "mlp.fc.bias"])  # (B,T,4C)
    h = F.gelu(h, approximate="tanh")  # 0.5x(1+tanh(sqrt(2/pi)(x+0.044715x^3)))
    return F.linear(h, p[prefix + "mlp.proj.weight"], p[prefix + "mlp.proj.bias"])  # (B,T,C)


def block(x, p, l, cfg):
    # pre-LN transformer block: (B,T,C) -> (B,T,C)
    prefix = f"blocks.{l}."
    h = layernorm(x, p[prefix + "ln1.weight"], p[prefix + "ln1.bias"], cfg)
    x = x + attention(h, p, prefix, cfg)
    h = layernorm(x, p[prefix + "ln2.weight"], p[prefix + "ln2.bias"], cfg)
    x = x + mlp(h, p, prefix)
    return x


def forward_loss(p, tokens, cfg):
    # tokens (B,T+1) int -> scalar fp32 loss (mean cross-entropy over all B*T positions)
    T = cfg.context_length
    inputs = tokens[:, :T].long()                          # (B,T)
    targets = tokens[:, 1:].long()                         # (B,T)
    x = embed(p, inputs)                                   # (B,T,C)
    for l in range(cfg.layers):
        x = block(x, p, l, cfg)                            # (B,T,C)
    x = layernorm(x, p["lnf.weight"], p["lnf.bias"], cfg)  # (B,T,C)
    logits = F.linear(x, p["wte"])                         # (B,T,V), LM head tied to wte
    return F.cross_entropy(logits.view(-1, logits.shape[-1]), targets.reshape(-1))


# ----------------------------------------------------------------------------------
# schedule, clipping, AdamW: written literally from DESIGN.md

def lr_at(step, cfg):
    """Learning rate of step `step` (0-based), in float64."""
    peak = cfg.peak_lr
    lo = cfg.min_lr_ratio * peak
    w = cfg.warmup_steps
    if step < w:
        return peak * (step + 1) / w
    span = max(1, cfg.steps - w)
    return lo + 0.5 * (peak - lo) * (1.0 + math.cos(math.pi * (step - w) / span))


def global_grad_norm(grads):
    """L2 norm over all gradients (accumulated in float64), returned as a Python float."""
    total = torch.zeros((), dtype=torch.float64)
    for g in grads:
        total += g.double().pow(2).sum()
    return math.sqrt(total.item())


def clip_grads_(grads, norm, cfg):
    """If norm > max_grad_norm, scale every gradient by max_grad_norm / (norm + 1e-6)."""
    if norm > cfg.max_grad_norm:
        scale = torch.tensor(cfg.max_grad_norm / (norm + CLIP_EPS), dtype=torch.float32)
        for g in grads:
            g.mul_(scale)


class AdamW:
    """AdamW exactly as DESIGN.md writes it (= PyTorch's AdamW):
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
        f32 = lambda x: torch.tensor(x, dtype=torch.float32)
        lr_t = f32(lr)
        decay = f32(1.0 - lr * c.weight_decay)
        bc1 = f32(1.0 - c.beta1 ** t)
        bc2 = f32(1.0 - c.beta2 ** t)
        for name, p in params.items():
            g = grads[name]
            m, v = self.m[name], self.v[name]
            if is_decayed(name, p.shape):
                p.mul_(decay)
            m.mul_(c.beta1).add_(g, alpha=1.0 - c.beta1)
            v.mul_(c.beta2).addcmul_(g, g, value=1.0 - c.beta2)
            p.sub_(lr_t * (m / bc1) / (torch.sqrt(v / bc2) + c.adam_eps))


class TorchAdamW:
    """The same update through torch.optim.AdamW (two param groups: decayed and not),
    for cross-checking the hand-written one. lr is set on the groups every step."""

    def __init__(self, params, cfg):
        decay = [t for n, t in params.items() if is_decayed(n, t.shape)]
        no_decay = [t for n, t in params.items() if not is_decayed(n, t.shape)]
        self.opt = torch.optim.AdamW(
            [{"params": decay, "weight_decay": cfg.weight_decay},
             {"params": no_decay, "weight_decay": 0.0}],
            lr=cfg.peak_lr, betas=(cfg.beta1, cfg.beta2), eps=cfg.adam_eps)

    def step(self, params, grads, step, lr):
        for g in self.opt.param_groups:
            g["lr"] = lr
        self.opt.step()  # gradients are read from .grad, which `grads` aliases


# ----------------------------------------------------------------------------------
# one training step

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
