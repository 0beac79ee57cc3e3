"""The canary contract in JAX, trained from a canary pack on a mesh of XLA devices, written
as a receipt (docs/xla.md, "JAX SPMD"):

    python3 -m canary_harness.jax --pack PACK.h5 --out R.h5 [--mesh DxM] [--shard-plan dp|tp|zero3]
        [--precision fp32|bf16] [--steps N] [--compile-cache DIR] [--inject-fault step=K,op=NAME[,ulps=N]] [--force]

`--inject-fault kind=weight-scale|weight-ulps|lr-scale|eps-scale,...` injects a regression of
`harness power` instead (LaneRegression; docs/budgets.md, "Detection power").

The gpt2 and llama canaries of docs/design.md and docs/canary.md, written in jax.numpy
from the contract (no code shared with the C++ engines or the PyTorch models, but for the
RoPE tables and the schedule, which the contract gives as formulas): forward, jax.grad's
backward, the global-norm clip and AdamW in one jitted step. The mesh is D x M of XLA devices named ("data",
"model"); on a machine without accelerators they are virtual CPU devices
(--xla_force_host_platform_device_count, set here before JAX starts), which XLA's SPMD
partitioner shards and runs collectives over for real. The shard plans are tpu-mesh's
(docs/engines/tpu-mesh.md, "Shard plans") as NamedShardings, chosen from each tensor's
role in the tensor table (canary_harness.models.table: its linear's parallel role), never
from its name:

- dp: parameters replicated, the batch split on "data";
- tp: column-parallel weights' output dimension and row-parallel weights' input dimension
  on "model" (Megatron), the rest replicated, the batch split on "data";
- zero3: dimension 0 of every parameter and of its moments on "data", the batch too.

Everything the receipt holds is read after the step (parameters, clipped gradients, Adam's
moments, gathered to the host): nothing inside the step leaves the devices. Lane
`<canary>/jax@DxM+PLAN[+bf16]`; budget features `jax` (XLA's CPU kernels against
cpu-ref's), `jax-bf16` with --precision bf16, and on more than one device `mesh-fp32`
(`mesh-bf16`): the real partitioner is judged under the budget the emulation declares.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any, Dict, List, NamedTuple, NoReturn, Optional, Sequence, Tuple

import numpy as np

from .runs.architectures import architecture_of, described, model_of
from .receipts.budget_features import format_features
from .receipts.digest import batch_hash
from .runs.faults import FaultSpec
from .cli.lane_args import check_choice, check_out, parse_lane_fault
from .cli.lane_stacks import budget_features as stack_budget_features, lane_name, stack_options
from .models.table import is_decayed
from .pack import PackError, read_pack
from .receipts.receipt import ReceiptError, ReceiptWriter
from .cli.usage import UsageError, count_flag

PROG = "canary_harness.jax"


def _force_devices(count: int) -> None:
    """XLA's CPU client makes `count` virtual devices; set before JAX is imported."""
    if "jax" in sys.modules:
        return
    flags = [f for f in os.environ.get("XLA_FLAGS", "").split() if not f.startswith("--xla_force_host_platform_device_count")]
    os.environ["XLA_FLAGS"] = " ".join(flags + [f"--xla_force_host_platform_device_count={count}"])
    os.environ.setdefault("JAX_PLATFORMS", "cpu")


# ---- the model: docs/design.md's gpt2, in jax.numpy ----------------------------------------------

def _linear(x, w, b, mm):
    y = mm(x, w.T)  # w is (out, in), as the contract's tables give it
    return y if b is None else y + b


def _layernorm(x, w, b, eps):
    import jax.numpy as jnp

    mean = jnp.mean(x, axis=-1, keepdims=True)
    var = jnp.mean(jnp.square(x - mean), axis=-1, keepdims=True)  # biased
    return (x - mean) / jnp.sqrt(var + eps) * w + b


def _attention(qkv, heads):
    import jax
    import jax.numpy as jnp

    B, T, C3 = qkv.shape
    C = C3 // 3
    hs = C // heads
    q, k, v = (t.reshape(B, T, heads, hs).transpose(0, 2, 1, 3) for t in jnp.split(qkv, 3, axis=-1))
    att = (q @ k.transpose(0, 1, 3, 2)) * np.float32(1.0 / np.sqrt(hs))
    causal = jnp.tril(jnp.ones((T, T), dtype=bool))
    att = jax.nn.softmax(jnp.where(causal, att, -jnp.inf), axis=-1)
    return (att @ v).transpose(0, 2, 1, 3).reshape(B, T, C)


def gpt2_loss(params: Dict[str, Any], tokens: Any, cfg: Any, mm, hook=None) -> Any:
    """tokens (B, T+1) int32 -> the mean cross-entropy over all B*T positions. `hook(name, x)`
    sees every forward op's output under the C++ model's op name (models.gpt2.forward_op_names)."""
    import jax
    import jax.numpy as jnp

    hook = hook or (lambda name, x: x)
    T = cfg.context_length
    inputs, targets = tokens[:, :T], tokens[:, 1:]
    x = hook("embedding", params["wte"][inputs] + params["wpe"][jnp.arange(T)])
    for l in range(cfg.layers):
        p = f"blocks.{l}."
        h = hook(p + "ln1", _layernorm(x, params[p + "ln1.weight"], params[p + "ln1.bias"], cfg.layernorm_eps))
        qkv = hook(p + "attn.qkv", _linear(h, params[p + "attn.qkv.weight"], params[p + "attn.qkv.bias"], mm))
        y = hook(p + "attn", _attention(qkv, cfg.heads))
        y = hook(p + "attn.proj", _linear(y, params[p + "attn.proj.weight"], params[p + "attn.proj.bias"], mm))
        x = hook(p + "attn.residual", x + y)
        h = hook(p + "ln2", _layernorm(x, params[p + "ln2.weight"], params[p + "ln2.bias"], cfg.layernorm_eps))
        h = hook(p + "mlp.fc", _linear(h, params[p + "mlp.fc.weight"], params[p + "mlp.fc.bias"], mm))
        h = hook(p + "mlp.gelu", jax.nn.gelu(h, approximate=cfg.gelu == "tanh"))
        h = hook(p + "mlp.proj", _linear(h, params[p + "mlp.proj.weight"], params[p + "mlp.proj.bias"], mm))
        x = hook(p + "mlp.residual", x + h)
    x = hook("lnf", _layernorm(x, params["lnf.weight"], params["lnf.bias"], cfg.layernorm_eps))
    logits = hook("lm_head", mm(x, params["wte"].T))  # the LM head, tied to wte
    logp = jax.nn.log_softmax(logits, axis=-1)
    return hook("loss", -jnp.mean(jnp.take_along_axis(logp, targets[..., None], axis=-1)))


def _rmsnorm(x, w, eps):
    import jax.numpy as jnp

    return x * (1.0 / jnp.sqrt(jnp.mean(jnp.square(x), axis=-1, keepdims=True) + np.float32(eps))) * w


def _rope(x, cos, sin, head_size):
    """Rotate-half RoPE on every head of x (B, T, heads*hd) with the (T, hd/2) tables."""
    import jax.numpy as jnp

    B, T, width = x.shape
    half = head_size // 2
    x = x.reshape(B, T, width // head_size, head_size)
    x1, x2 = x[..., :half], x[..., half:]
    c, s = cos[:T, None, :], sin[:T, None, :]
    return jnp.concatenate([x1 * c - x2 * s, x2 * c + x1 * s], axis=-1).reshape(B, T, width)


def _gqa(q, k, v, heads, kv_heads):
    """Causal softmax(q k^T / sqrt(hd)) v per query head h with kv head h // (NH/NKV)."""
    import jax
    import jax.numpy as jnp

    B, T, width = q.shape
    hd = width // heads
    q = q.reshape(B, T, heads, hd).transpose(0, 2, 1, 3)
    k = jnp.repeat(k.reshape(B, T, kv_heads, hd).transpose(0, 2, 1, 3), heads // kv_heads, axis=1)
    v = jnp.repeat(v.reshape(B, T, kv_heads, hd).transpose(0, 2, 1, 3), heads // kv_heads, axis=1)
    att = (q @ k.transpose(0, 1, 3, 2)) * np.float32(1.0 / np.sqrt(hd))
    causal = jnp.tril(jnp.ones((T, T), dtype=bool))
    att = jax.nn.softmax(jnp.where(causal, att, -jnp.inf), axis=-1)
    return (att @ v).transpose(0, 2, 1, 3).reshape(B, T, width)


def llama_loss(params: Dict[str, Any], tokens: Any, cfg: Any, mm, hook=None) -> Any:
    """The llama canary (RMSNorm, RoPE, grouped-query attention, SwiGLU, an untied LM head;
    docs/canary.md): tokens (B, T+1) int32 -> the mean cross-entropy, `hook` as gpt2_loss's."""
    import jax
    import jax.numpy as jnp

    from .models.llama import rope_tables

    hook = hook or (lambda name, x: x)
    T, hd, eps = cfg.context_length, cfg.head_size, cfg.layernorm_eps
    cos, sin = (np.asarray(table.numpy()) for table in rope_tables(T, hd, cfg.rope_theta))
    inputs, targets = tokens[:, :T], tokens[:, 1:]
    x = hook("embedding", params["wte"][inputs])
    for l in range(cfg.layers):
        p = f"blocks.{l}."
        h = hook(p + "attn_norm", _rmsnorm(x, params[p + "attn_norm.weight"], eps))
        q = hook(p + "attn.q", _linear(h, params[p + "attn.q.weight"], None, mm))
        k = hook(p + "attn.k", _linear(h, params[p + "attn.k.weight"], None, mm))
        v = hook(p + "attn.v", _linear(h, params[p + "attn.v.weight"], None, mm))
        q = hook(p + "attn.rope_q", _rope(q, cos, sin, hd))
        k = hook(p + "attn.rope_k", _rope(k, cos, sin, hd))
        y = hook(p + "attn", _gqa(q, k, v, cfg.heads, cfg.kv_heads))
        y = hook(p + "attn.o", _linear(y, params[p + "attn.o.weight"], None, mm))
        x = hook(p + "attn.residual", x + y)
        h = hook(p + "mlp_norm", _rmsnorm(x, params[p + "mlp_norm.weight"], eps))
        gate = hook(p + "mlp.gate", _linear(h, params[p + "mlp.gate.weight"], None, mm))
        up = hook(p + "mlp.up", _linear(h, params[p + "mlp.up.weight"], None, mm))
        h = hook(p + "mlp.swiglu", jax.nn.silu(gate) * up)
        h = hook(p + "mlp.down", _linear(h, params[p + "mlp.down.weight"], None, mm))
        x = hook(p + "mlp.residual", x + h)
    x = hook("norm", _rmsnorm(x, params["norm.weight"], eps))
    logits = hook("lm_head", mm(x, params["lm_head.weight"].T))
    logp = jax.nn.log_softmax(logits, axis=-1)
    return hook("loss", -jnp.mean(jnp.take_along_axis(logp, targets[..., None], axis=-1)))


class Architecture(NamedTuple):
    """What the JAX lane needs of a canary's architecture: its config, tensor table with the
    parallel roles, forward op names and loss."""

    config: Any
    specs: List[Any]
    op_names: List[str]
    loss: Any


def architecture(pack: Any) -> Architecture:
    """The pack's canary (its JSON's `architecture`, the legacy identity's where absent) for the
    JAX lane; UsageError for an architecture the lane has no loss for, or a config that does not parse."""
    name = architecture_of(pack.canary)
    if name not in JAX_LOSSES:
        raise UsageError(f"{pack.path}: the JAX lane runs {' and '.join(JAX_LOSSES)} canaries, not '{name}'")
    try:
        info, model = described(name), model_of(name)
        cfg = model.config_class.from_json(pack.canary_json)
        specs = info.specs(*(getattr(cfg, key) for key in info.table_keys))
        return Architecture(cfg, specs, model.forward_op_names(cfg), JAX_LOSSES[name])
    except ValueError as e:
        raise UsageError(f"{pack.path}: {e}") from None


# The architectures the JAX lane implements: each one's loss in JAX, by its name.
JAX_LOSSES = {"gpt2": gpt2_loss, "llama": llama_loss}


def ulps_up(x, ulps: int):
    """fp32 `x` moved up by `ulps` units in the last place, as canary_harness.runs.faults.ulps_up
    does it for torch: the bits as an ordered integer line (sign and magnitude; -0.0 and
    +0.0 at 0), plus ulps; NaN and +inf stay."""
    import jax
    import jax.numpy as jnp

    sign = np.int32(-0x80000000)
    bits = jax.lax.bitcast_convert_type(x, jnp.int32)
    magnitude = bits & np.int32(0x7FFFFFFF)
    key = jnp.where(bits < 0, -magnitude, magnitude) + np.int32(ulps)
    moved = jnp.where(key < 0, (-key) | sign, jnp.where((key == 0) & (bits < 0), sign, key))
    return jnp.where(jnp.isnan(x) | (x == jnp.inf), x, jax.lax.bitcast_convert_type(moved, jnp.float32))


def fault_hook(fault: Any, active: Any):
    """The hook of --inject-fault: op `fault.op`'s output with element 0 moved up by
    `fault.ulps` ulps where `active` (a traced flag, true at the fault's step: one program
    for every step); the gradient passes through unchanged, as the torch lane's nudge."""
    import jax
    import jax.numpy as jnp

    @jax.custom_vjp
    def nudge(x, on):
        flat = x.reshape(-1)
        return flat.at[0].set(jnp.where(on, ulps_up(flat[0], fault.ulps), flat[0])).reshape(x.shape)

    nudge.defvjp(lambda x, on: (nudge(x, on), None), lambda _, g: (g, None))
    return lambda name, x: nudge(x, active) if name == fault.op else x


def matmul(precision: str):
    """fp32: XLA's fp32 dot at its highest precision; bf16: operands rounded to bf16 (round to
    nearest even, lax.reduce_precision: an explicit op that XLA's simplifier keeps, where a
    bf16 round trip of converts may be folded away), products accumulated in fp32 (a TPU
    MXU's bf16 pass; a product of two bf16 values is exact in fp32). XLA's CPU dot has no
    bf16 x bf16 = f32 kernel, so the operands stay f32 holding bf16 values."""
    import jax
    import jax.numpy as jnp

    highest = jax.lax.Precision.HIGHEST
    if precision == "bf16":
        bf16 = lambda x: jax.lax.reduce_precision(x, exponent_bits=8, mantissa_bits=7)  # noqa: E731
        return lambda a, b: jnp.matmul(bf16(a), bf16(b), precision=highest)
    return lambda a, b: jnp.matmul(a, b, precision=highest)


def make_step(cfg: Any, names: Sequence[str], precision: str, fault: Any = None, loss_fn: Any = gpt2_loss,
              eps_factor: float = 1.0):
    """The jitted step: loss and gradients, the global norm (fp32: XLA on a TPU has no
    float64), the clip, AdamW as docs/design.md writes it (its eps times `eps_factor`, a
    regression's). Per-step numbers (lr, 1 - lr*wd, the bias corrections) are traced
    arguments: one compile for every step."""
    import jax
    import jax.numpy as jnp

    from .models.gpt2 import CLIP_EPS

    mm = matmul(precision)
    f32 = np.float32
    beta1, beta2, eps = f32(cfg.beta1), f32(cfg.beta2), f32(cfg.adam_eps * eps_factor)
    one_minus_beta1, one_minus_beta2 = f32(1) - beta1, f32(1) - beta2
    max_norm, clip_eps = f32(cfg.max_grad_norm), f32(CLIP_EPS)

    def step(params, m, v, tokens, lr, decay, bc1, bc2, active):
        hook = fault_hook(fault, active) if fault is not None else None
        loss, grads = jax.value_and_grad(loss_fn)(params, tokens, cfg, mm, hook)
        norm = jnp.sqrt(sum(jnp.sum(jnp.square(grads[n])) for n in names))
        factor = jnp.where(norm > max_norm, max_norm / (norm + clip_eps), f32(1))
        grads = {n: grads[n] * factor for n in names}
        new_p, new_m, new_v = {}, {}, {}
        for n in names:
            g, p = grads[n], params[n]
            if is_decayed(p.shape):  # decoupled decay (the contract's rule)
                p = p * decay
            new_m[n] = m[n] * beta1 + g * one_minus_beta1
            new_v[n] = v[n] * beta2 + g * one_minus_beta2 * g
            new_p[n] = p - lr * (new_m[n] / bc1) / (jnp.sqrt(new_v[n] / bc2) + eps)
        return new_p, new_m, new_v, grads, loss, norm

    return step


def make_eval(cfg: Any, precision: str, loss_fn: Any = gpt2_loss):
    """The jitted held-out evaluation (docs/logit-kl.md): the loss and the (B, T, V) logits the
    loss reads (its `lm_head` op) of one batch, forward only: a second program, compiled at
    the first evaluation."""
    mm = matmul(precision)

    def evaluate(params, tokens):
        seen = {}

        def keep(name, x):
            if name == "lm_head":
                seen["logits"] = x
            return x

        loss = loss_fn(params, tokens, cfg, mm, keep)
        return loss, seen["logits"]

    return evaluate


class LaneRegression:
    """A regression of `harness power` (a canary_harness.runs.regressions.RegressionSpec, or None
    for none) in the JAX lane, each kind as the C++ canary injects it (canaries/canary.cpp):
    weight-ulps on the tensor's first initial value, eps-scale in AdamW's eps (fp32 of eps x F),
    lr-scale in the rate of every step from K (fp32 of lr x (1 + E); 1 - lr*wd follows it),
    weight-scale on the parameter between steps K-1 and K, on the host (each value's exact
    double product rounded once to fp32), so that the jitted step stays one program."""

    def __init__(self, spec: Any) -> None:
        self.spec = spec
        self.kind = spec.kind if spec is not None else None

    def initial(self, name: str, values: Any) -> Any:
        """The tensor's initial fp32 values, its first moved up by weight-ulps' N."""
        values = np.array(values, dtype=np.float32)
        if self.kind == "weight-ulps" and name == self.spec.tensor:
            flat = values.reshape(-1)
            flat[0] = np.asarray(ulps_up(flat[0], self.spec.ulps))
        return values

    def eps_factor(self) -> float:
        return self.spec.by if self.kind == "eps-scale" else 1.0

    def lr(self, step: int, rate: float) -> Any:
        """The step's fp32 rate from the schedule's `rate` (a double)."""
        scaled = self.kind == "lr-scale" and step >= self.spec.step
        return np.float32(rate * (1.0 + self.spec.by) if scaled else rate)

    def between_steps(self, step: int, params: Dict[str, Any], sharding: Dict[str, Any]) -> None:
        """weight-scale at its step: the parameter times 1 + E, put back with its sharding."""
        if self.kind != "weight-scale" or step != self.spec.step:
            return
        import jax

        name = self.spec.tensor
        scaled = np.asarray(params[name], dtype=np.float64) * (1.0 + self.spec.by)
        params[name] = jax.device_put(scaled.astype(np.float32), sharding[name])


class HeldOut:
    """The pack's held-out batch evaluated into the receipt's /eval at the steps its canary's
    [eval] names (the C++ engines' and the PyTorch lane's held_out_hash), its compiles counted
    apart from the step's."""

    def __init__(self, pack: Any, cfg: Any, precision: str, loss_fn: Any, batch: Any, replicated: Any) -> None:
        import jax

        self.pack, self.every, self.rows = pack, pack.held_out.every, pack.held_out.rows
        self.tokens = pack.held_out.tokens
        self.fn = jax.jit(make_eval(cfg, precision, loss_fn), out_shardings=(replicated, replicated))
        self.batch = batch
        self.declared = False

    def due(self, step: int) -> bool:
        return step > 0 and step % self.every == 0

    def record(self, step: int, params: Any, writer: Any, counters: Any) -> None:
        import jax

        counters.begin()
        loss, logits = self.fn(params, jax.device_put(self.tokens, self.batch))
        jax.block_until_ready(logits)
        compiles = counters.end(step)["UncachedCompile"]
        if not self.declared:
            writer.declare_eval(self.every, self.pack.held_out.held_out_hash, "the canary pack's held-out batch",
                                self.tokens[:self.rows, 1:], int(logits.shape[-1]))
            self.declared = True
        writer.append_eval(step, float(loss), np.asarray(logits, dtype=np.float32)[:self.rows], compiles)


# ---- the compiler's own counters ------------------------------------------------------------------

class JaxCompileCounters:
    """JAX's compile events (jax.monitoring) over each step, as the /compile row tpu-mesh and
    torch_xla record: UncachedCompile (XLA compiles that no cache answered),
    PersistentCacheHit and PersistentCacheMiss (lookups in --compile-cache), CachedCompile
    (the step's program found in jit's in-memory cache: 1 when the step compiled nothing),
    CompileTime (seconds tracing, lowering and compiling), HostSync: 0, since a jitted step
    cannot read a device value to the host (the recording reads after it), and
    TracingCacheMiss: jit's own explained misses (jax_explain_cache_misses), whose
    explanations, each naming what changed, are kept per step in `explanations`."""

    _HITS = "/jax/compilation_cache/cache_hits"
    _MISSES = "/jax/compilation_cache/cache_misses"
    _BACKEND = "/jax/core/compile/backend_compile_duration"
    _PHASES = "/jax/core/compile/"

    def __init__(self) -> None:
        import logging

        import jax
        from jax import monitoring

        self._events: List[str] = []
        self._seconds = 0.0
        self._misses: List[str] = []
        self.explanations: Dict[int, List[str]] = {}
        monitoring.register_event_listener(lambda event, **_: self._events.append(event))
        monitoring.register_event_duration_secs_listener(self._duration)
        jax.config.update("jax_explain_cache_misses", True)
        misses = self._misses

        class Explained(logging.Handler):
            def emit(self, record: logging.LogRecord) -> None:
                if record.getMessage().startswith("TRACING CACHE MISS"):
                    misses.append(record.getMessage())

        pjit = logging.getLogger("jax._src.pjit")  # where JAX explains a miss, as a warning
        pjit.addHandler(Explained())
        pjit.propagate = False  # kept here and printed after the run, not on stderr as it happens

    def _duration(self, event: str, seconds: float, **_: Any) -> None:
        self._events.append(event)
        if event.startswith(self._PHASES):
            self._seconds += seconds

    def begin(self) -> None:
        self._events.clear()
        self._misses.clear()
        self._seconds = 0.0

    def end(self, step: int) -> Dict[str, float]:
        hits, misses = self._events.count(self._HITS), self._events.count(self._MISSES)
        compiled = self._events.count(self._BACKEND) - hits  # a hit still reports a (short) backend compile
        if self._misses:
            self.explanations[step] = list(self._misses)
        return {"UncachedCompile": float(compiled), "CachedCompile": float(compiled + hits == 0),
                "PersistentCacheHit": float(hits), "PersistentCacheMiss": float(misses),
                "CompileTime": self._seconds, "HostSync": 0.0, "TracingCacheMiss": float(len(self._misses))}


def use_compile_cache(directory: str) -> None:
    """JAX's persistent compilation cache in `directory`, for every program however fast it
    compiles (JAX skips programs under a second by default)."""
    import jax

    os.makedirs(directory, exist_ok=True)
    jax.config.update("jax_compilation_cache_dir", directory)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)


# ---- meshes and shard plans ------------------------------------------------------------------------

def parse_mesh(text: str) -> Tuple[int, int]:
    d, x, m = text.partition("x")
    if not x or not d.isdigit() or not m.isdigit() or not 1 <= int(d) <= 64 or not 1 <= int(m) <= 64:
        raise UsageError(f"--mesh: '{text}' is not DxM with D and M in 1..64 (e.g. 2x2)")
    return int(d), int(m)


def partition_specs(specs: Sequence[Any], plan: str, mesh_shape: Tuple[int, int]) -> Dict[str, Tuple[Any, ...]]:
    """Each tensor's PartitionSpec entries under `plan`, from its role in the table
    (TensorSpec.parallel: "column" or "row" for a linear's weight, its bias follows its
    weight's output dimension); UsageError where a dimension does not divide."""
    data, model = mesh_shape
    out: Dict[str, Tuple[Any, ...]] = {}
    for s in specs:
        entries: List[Any] = [None] * len(s.shape)
        if plan == "tp" and s.parallel in ("column", "column-bias"):
            entries[0] = "model"
        elif plan == "tp" and s.parallel == "row":
            entries[1] = "model"
        elif plan == "zero3":
            entries[0] = "data"
        for dim, axis in enumerate(entries):
            size = {"data": data, "model": model}.get(axis, 1)
            if axis is not None and s.shape[dim] % size:
                raise UsageError(f"--shard-plan {plan} on --mesh {data}x{model}: {s.name} dimension {dim} has size "
                                 f"{s.shape[dim]}, which does not divide into {size} shards")
        out[s.name] = tuple(entries)
    return out


# ---- the run ---------------------------------------------------------------------------------------

class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        print(f"{PROG}: error: {message} (see `python3 -m {PROG} --help`)", file=sys.stderr)
        sys.exit(2)


def parse_args(argv: Optional[Sequence[str]]) -> argparse.Namespace:
    ap = _Parser(prog=f"python3 -m {PROG}", description="Train a canary pack's canary in JAX on a mesh of XLA devices "
                                                         "and write a receipt (engine jax).")
    ap.add_argument("--pack", required=True, help="canary pack written by `harness export`")
    ap.add_argument("--out", required=True, help="receipt path (.h5); its directory must exist")
    ap.add_argument("--mesh", default="1x1", help="DxM devices, axes data and model (default 1x1)")
    ap.add_argument("--shard-plan", default="dp", help="dp (default), tp or zero3 (tpu-mesh's plans)")
    ap.add_argument("--precision", default="fp32", help="fp32 (default) or bf16 (bf16 matmul operands)")
    ap.add_argument("--steps", help="steps to run, 1..the pack's (default: all of them)")
    ap.add_argument("--compile-cache", help="DIR: JAX's persistent compilation cache; a later run of the same program "
                                            "loads it from DIR instead of compiling")
    ap.add_argument("--inject-fault", help="step=K,op=NAME[,ulps=N]: move element 0 of op NAME's output up by N ulps "
                                           "(default 1) at step K, as the other engines do (docs/canary.md); or a "
                                           "regression of `harness power`, kind=weight-scale|weight-ulps|lr-scale|"
                                           "eps-scale,... (docs/budgets.md)")
    ap.add_argument("--force", action="store_true", help="overwrite an existing receipt")
    return ap.parse_args(argv)


def run(args: argparse.Namespace) -> int:
    check_choice("shard-plan", args.shard_plan, "plan", stack_id="jax")
    check_choice("precision", args.precision, "precision", stack_id="jax")
    mesh_shape = parse_mesh(args.mesh)
    import importlib.util

    if importlib.util.find_spec("jax") is None:
        raise UsageError("JAX is not installed here; run the JAX lane with .venv/bin/python (docs/python-env.md)")
    try:
        pack = read_pack(args.pack)
    except PackError as e:
        raise UsageError(str(e)) from None
    arch = architecture(pack)
    steps = count_flag("steps", args.steps, 1, pack.steps) if args.steps is not None else pack.steps
    args.fault = parse_lane_fault(args.inject_fault, arch.op_names, [s.name for s in arch.specs], steps) \
        if args.inject_fault is not None else None
    check_out(args.out, args.force)
    _force_devices(mesh_shape[0] * mesh_shape[1])
    layout = partition_specs(arch.specs, args.shard_plan, mesh_shape)
    if pack.batch_shape[0] % mesh_shape[0]:
        raise UsageError(f"--mesh {args.mesh}: the batch of {pack.batch_shape[0]} sequences does not divide into "
                         f"{mesh_shape[0]} shards on data")
    return _train(args, pack, arch, layout, mesh_shape, steps)


def _train(args, pack, arch, layout, mesh_shape, steps) -> int:
    import jax
    from jax.sharding import Mesh, NamedSharding, PartitionSpec

    from .models.gpt2 import bias_corrections, lr_at  # the schedule and AdamW of every architecture
    from .runs.recording import StepDigest

    if args.compile_cache is not None:
        try:
            use_compile_cache(args.compile_cache)
        except OSError as e:
            raise UsageError(f"--compile-cache: cannot use '{args.compile_cache}' ({e.strerror or e})") from None
    counters = JaxCompileCounters()
    cfg, names = arch.config, [s.name for s in arch.specs]
    devices = jax.devices()
    if len(devices) < mesh_shape[0] * mesh_shape[1]:
        raise UsageError(f"--mesh {args.mesh}: JAX has {len(devices)} devices here")
    mesh = Mesh(np.array(devices[:mesh_shape[0] * mesh_shape[1]]).reshape(mesh_shape), ("data", "model"))
    shard = {n: NamedSharding(mesh, PartitionSpec(*layout[n])) for n in names}
    scalar = NamedSharding(mesh, PartitionSpec())
    batch = NamedSharding(mesh, PartitionSpec("data", None))
    nudge = args.fault if isinstance(args.fault, FaultSpec) else None
    regression = LaneRegression(None if nudge is not None else args.fault)
    params = {n: jax.device_put(regression.initial(n, pack.init[n]), shard[n]) for n in names}
    m = {n: jax.device_put(np.zeros(pack.init[n].shape, np.float32), shard[n]) for n in names}
    v = {n: jax.device_put(np.zeros(pack.init[n].shape, np.float32), shard[n]) for n in names}
    state = (shard, shard, shard)
    step_fn = jax.jit(make_step(cfg, names, args.precision, nudge, arch.loss, regression.eps_factor()),
                      in_shardings=state + (batch, scalar, scalar, scalar, scalar, scalar),
                      out_shardings=state + (shard, scalar, scalar))
    digest = StepDigest(names, [int(np.prod(pack.init[n].shape)) for n in names])
    held_out = HeldOut(pack, cfg, args.precision, arch.loss, batch, scalar) if pack.held_out is not None else None
    writer = ReceiptWriter(args.out, _manifest(args, pack, steps, mesh_shape), names, overwrite=args.force)
    start = time.perf_counter()
    try:
        for i in range(steps + 1):
            if held_out is not None and held_out.due(i):  # before the step: the parameters at its start
                held_out.record(i, params, writer, counters)
            if i == steps:
                break
            tokens = pack.batch(i)
            regression.between_steps(i, params, shard)
            lr = regression.lr(i, lr_at(i, cfg))
            bc1, bc2 = (np.float32(c) for c in bias_corrections(i, cfg))
            decay = np.float32(1) - lr * np.float32(cfg.weight_decay)
            on_device = jax.device_put(tokens, batch)
            counters.begin()
            active = np.bool_(nudge is not None and i == nudge.step)
            params, m, v, grads, loss, norm = step_fn(params, m, v, on_device, lr, decay, bc1, bc2, active)
            jax.block_until_ready(loss)
            compile_row = counters.end(i)
            host = [np.asarray(t, dtype=np.float32).reshape(-1) for family in (params, grads, m, v) for t in
                    (family[n] for n in names)]
            rows = digest.plan.rows(host)
            hashes, sketches = digest.split(rows)
            writer.append_step(loss=float(loss), grad_norm=float(norm), lr=float(lr), batch_hash=batch_hash(tokens),
                               hashes=hashes, sketches=sketches, compile=compile_row)
        writer.finish()
    except BaseException:
        writer.discard()
        raise
    finally:
        writer.close()
    seconds = time.perf_counter() - start
    print(f"lane        {_lane(pack, args, mesh_shape)}")
    print(f"devices     {mesh_shape[0]}x{mesh_shape[1]} of {jax.devices()[0].platform} ({args.shard_plan}, {args.precision})")
    print(f"steps       {steps}, {1000 * seconds / steps:.1f} ms/step (compile and recording included)")
    for step, explained in sorted(counters.explanations.items()):
        for text in explained:  # jit's own words: where the step was traced again, and what changed
            print(f"cache miss  step {step}: " + " | ".join(line.strip() for line in text.splitlines()))
    print(f"receipt     {os.path.abspath(args.out)}")
    return 0


def _described(pack, args, mesh_shape) -> Dict[str, str]:
    """The lane's options as its stack's description takes them (lane_stacks.py)."""
    return stack_options(pack.name, mesh=f"{mesh_shape[0]}x{mesh_shape[1]}", shard_plan=args.shard_plan,
                         precision=args.precision)


def _lane(pack, args, mesh_shape) -> str:
    return lane_name("jax", _described(pack, args, mesh_shape))


def budget_features(pack, args, mesh_shape) -> str:
    """What separates a JAX run from cpu-ref: XLA's CPU kernels (jax), bf16 matmul operands
    (jax-bf16), and the mesh's reduction splits where there is more than one device (judged
    under tpu-mesh's own entries, mesh-fp32 or mesh-bf16)."""
    return format_features(stack_budget_features("jax", _described(pack, args, mesh_shape)))


def _manifest(args, pack, steps, mesh_shape) -> Dict[str, Any]:
    import jax

    features = args.shard_plan + ("+bf16" if args.precision == "bf16" else "")
    run_options = {"pack": os.path.basename(pack.path), "mesh": args.mesh, "shard_plan": args.shard_plan,
                   "precision": args.precision, "steps": steps, "inject_fault": str(args.fault) if args.fault else None}
    return {
        "lane": _lane(pack, args, mesh_shape), "engine": "jax", "features": features,
        "budget_features": budget_features(pack, args, mesh_shape),
        "canary": pack.canary_json, "seed": pack.seed, "steps_planned": steps, "threads": 1,
        "data_seed": pack.data_seed, "pack": os.path.basename(pack.path), "trace": "none",
        "device": f"{jax.devices()[0].platform} x{mesh_shape[0] * mesh_shape[1]}", "precision": args.precision,
        "autocast": "none", "fault_injection": str(args.fault) if args.fault else "none", "deterministic": 1, "pack_git_commit": pack.git_commit,
        "run_options": json.dumps(run_options, sort_keys=True),
    }


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse_args(argv)
    try:
        return run(args)
    except (UsageError, ReceiptError) as e:
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
