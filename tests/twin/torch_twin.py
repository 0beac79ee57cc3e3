#!/usr/bin/env python3
"""External twin of the `tiny` GPT-2 canary, in PyTorch (fp32, CPU).

What it is: a second, independent implementation of the canary contract in docs/canary.md
("The canary contract: preset tiny"). Given a receipt written by the C++ harness with
`--dump-tensors 0 --record-batches`, it starts from the receipt's own initial weights
(/tensors/step_000000/<name>) and replays the receipt's own batches (/batches/tokens),
then compares, step by step, its loss, pre-clip gradient norm and learning rate with
the receipt's (/steps/loss, /steps/grad_norm, /steps/lr), and its parameters with any
later dumps (/tensors/step_S/<name> = parameters at the start of step S).

Why it is independent: nothing here comes from the C++ code. The forward pass is
PyTorch's own ops, the backward pass is PyTorch autograd, and the schedule, clipping
and AdamW are written from the formulas in docs/canary.md (the package's PyTorch canary,
python/canary_harness/models/gpt2.py, which the PyTorch lane runs too).
Only the inputs (initial weights, token batches) are taken from the receipt, so a
disagreement points at the engine's numerics or at a misreading of the contract.
The two implementations reduce in different orders, so agreement is to tolerances
(fp32 rounding), not bitwise.

Usage:
    /usr/bin/python3 tests/twin/torch_twin.py RECEIPT.h5 [--steps N] [--json]
        [--threads N] [--loss-rtol 1e-4] [--param-atol 1e-4] [--torch-adamw] [--verbose]

Exit status: 0 every compared loss within --loss-rtol (relative) and every dumped
parameter within --param-atol (absolute); 1 a comparison failed; 2 the receipt is
missing or malformed (one line naming the file and dataset).
"""

import argparse
import json
import math
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, os.pardir, "python"))

import h5py  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402

from canary_harness.models import gpt2 as model  # noqa: E402

RERUN_HINT = "rerun with --record-batches --dump-tensors 0"


class ReceiptError(Exception):
    """The receipt lacks something the twin needs (exit 2)."""


# ----------------------------------------------------------------------------------
# reading the receipt

# canary JSON key -> CanaryConfig field; a few spellings are accepted for robustness
KEY_ALIASES = {
    "vocab_size": ["vocab_size", "V", "vocab"],
    "context_length": ["context_length", "T", "seq_len", "block_size"],
    "channels": ["channels", "C", "n_embd"],
    "layers": ["layers", "L", "n_layer"],
    "heads": ["heads", "NH", "n_head"],
    "batch_size": ["batch_size", "B"],
    "steps": ["steps"],
    "peak_lr": ["peak_lr", "lr"],
    "min_lr_ratio": ["min_lr_ratio"],
    "warmup_steps": ["warmup_steps", "warmup"],
    "beta1": ["beta1"],
    "beta2": ["beta2"],
    "adam_eps": ["adam_eps", "eps"],
    "weight_decay": ["weight_decay", "wd"],
    "max_grad_norm": ["max_grad_norm", "grad_clip"],
    "layernorm_eps": ["layernorm_eps", "ln_eps"],
    "preset": ["preset", "name"],
    "init_std": ["init_std"],
    "data_seed": ["data_seed"],
    "gelu": ["gelu"],
}


def _flatten(obj, out):
    """Collect leaf keys of a (possibly nested) JSON object; first occurrence wins."""
    if isinstance(obj, dict):
        for k, v in obj.items():
            if isinstance(v, dict):
                _flatten(v, out)
            elif k not in out:
                out[k] = v
    return out


def _attr_text(value):
    if isinstance(value, bytes):
        return value.decode("utf-8")
    if isinstance(value, np.ndarray) and value.shape == ():
        return _attr_text(value[()])
    return str(value)


def read_config(f, path, notes):
    """CanaryConfig from /manifest attribute `canary`, defaults from docs/canary.md."""
    cfg = model.CanaryConfig()
    if "manifest" not in f:
        raise ReceiptError(f"{path}: missing /manifest group")
    attrs = f["manifest"].attrs
    flat = {}
    if "canary" in attrs:
        text = _attr_text(attrs["canary"])
        try:
            flat = _flatten(json.loads(text), {})
        except json.JSONDecodeError as e:
            raise ReceiptError(f"{path}: /manifest attribute 'canary' is not JSON ({e})")
    else:
        notes.append("no /manifest attribute 'canary': using docs/canary.md tiny defaults")
    steps_from_canary = False
    for field in cfg.field_names():
        for key in KEY_ALIASES[field]:
            if key in flat:
                cur = getattr(cfg, field)
                try:
                    setattr(cfg, field, type(cur)(flat[key]))
                except (TypeError, ValueError):
                    raise ReceiptError(
                        f"{path}: /manifest canary key '{key}' has bad value {flat[key]!r}")
                steps_from_canary |= field == "steps"
                break
    if not steps_from_canary and "steps_planned" in attrs:
        cfg.steps = int(attrs["steps_planned"])
    if cfg.heads <= 0 or cfg.channels % cfg.heads != 0:
        raise ReceiptError(f"{path}: /manifest canary: channels {cfg.channels} "
                           f"not divisible by heads {cfg.heads}")
    return cfg


def require(f, path, name, hint=None):
    if name not in f:
        msg = f"{path}: missing /{name}"
        raise ReceiptError(msg + (f": {hint}" if hint else ""))
    return f[name]


def read_tensors(group, gpath, path, cfg):
    """{name: float32 tensor} for the whole tensor table from one dump group."""
    out = {}
    for name, shape in model.tensor_table(cfg):
        if name not in group:
            raise ReceiptError(f"{path}: missing /{gpath}/{name}: {RERUN_HINT}")
        arr = np.asarray(group[name][()], dtype=np.float32)
        if tuple(arr.shape) != tuple(shape):
            raise ReceiptError(f"{path}: /{gpath}/{name} has shape {tuple(arr.shape)}, "
                               f"canary expects {tuple(shape)}")
        out[name] = torch.from_numpy(arr.copy())
    return out


def read_receipt(path):
    if not os.path.exists(path):
        raise ReceiptError(f"{path}: no such file")
    try:
        f = h5py.File(path, "r")
    except OSError as e:
        raise ReceiptError(f"{path}: not a readable HDF5 file ({e})")
    with f:
        notes = []
        cfg = read_config(f, path, notes)

        loss = np.asarray(require(f, path, "steps/loss")[()], dtype=np.float64)
        if loss.ndim != 1 or loss.shape[0] == 0:
            raise ReceiptError(f"{path}: /steps/loss holds no steps (shape {loss.shape})")
        grad_norm = lr = None
        if "steps/grad_norm" in f:
            grad_norm = np.asarray(f["steps/grad_norm"][()], dtype=np.float64)
        else:
            notes.append("no /steps/grad_norm: grad norms not compared")
        if "steps/lr" in f:
            lr = np.asarray(f["steps/lr"][()], dtype=np.float64)
        else:
            notes.append("no /steps/lr: learning rates not compared")

        tok_ds = require(f, path, "batches/tokens", RERUN_HINT)
        tokens = np.asarray(tok_ds[()])
        if not np.issubdtype(tokens.dtype, np.integer):
            raise ReceiptError(f"{path}: /batches/tokens has dtype {tokens.dtype}, "
                               f"expected int32")
        want = (cfg.batch_size, cfg.context_length + 1)
        if tokens.ndim != 3 or tuple(tokens.shape[1:]) != want:
            raise ReceiptError(f"{path}: /batches/tokens has shape {tokens.shape}, "
                               f"canary expects (N, {want[0]}, {want[1]})")
        if tokens.size and (tokens.min() < 0 or tokens.max() >= cfg.vocab_size):
            raise ReceiptError(f"{path}: /batches/tokens has values outside "
                               f"[0, {cfg.vocab_size})")

        require(f, path, "tensors/step_000000", RERUN_HINT)
        init = read_tensors(f["tensors/step_000000"], "tensors/step_000000", path, cfg)

        dump_steps = []
        if "tensors" in f:
            for key in f["tensors"].keys():
                if key.startswith("step_") and key[5:].isdigit() and int(key[5:]) > 0:
                    dump_steps.append(int(key[5:]))
        dump_steps.sort()
        dumps = {}  # step S -> params at the start of step S (a few MB each)
        for s in dump_steps:
            gpath = f"tensors/step_{s:06d}"
            dumps[s] = read_tensors(f[gpath], gpath, path, cfg)

    return dict(cfg=cfg, loss=loss, grad_norm=grad_norm, lr=lr, tokens=tokens,
                init=init, dumps=dumps, notes=notes)


# ----------------------------------------------------------------------------------
# comparison

def rel_diff(a, b):
    return abs(a - b) / max(abs(b), 1e-30)


def worse(d, best):
    """True if d should replace best as the worst value so far; NaN is the worst."""
    if best is None or math.isnan(d):
        return best is None or not math.isnan(best)
    return not math.isnan(best) and d > best


def compare_params(twin, ref):
    """max abs diff over all tensors, the tensor where it occurs, and the worst
    relative-to-norm diff ||twin - ref||_2 / ||ref||_2."""
    worst_abs = worst_abs_name = worst_rel = worst_rel_name = None
    for name, r in ref.items():
        d = (twin[name].detach() - r).double()
        a = d.abs().max().item() if d.numel() else 0.0
        rn = r.double().norm().item()
        rel = d.norm().item() / rn if rn > 0 else d.norm().item()
        if worse(a, worst_abs):
            worst_abs, worst_abs_name = a, name
        if worse(rel, worst_rel):
            worst_rel, worst_rel_name = rel, name
    return worst_abs, worst_abs_name, worst_rel, worst_rel_name


def run_twin(rec, max_steps, use_torch_adamw, verbose):
    cfg = rec["cfg"]
    n = min(len(rec["loss"]), rec["tokens"].shape[0])
    if max_steps is not None:
        n = min(n, max_steps)
    if len(rec["loss"]) > rec["tokens"].shape[0] and (max_steps is None or max_steps > n):
        rec["notes"].append(f"/batches/tokens holds {rec['tokens'].shape[0]} batches for "
                            f"{len(rec['loss'])} steps: compared the first {n}")

    params = {k: v.clone().requires_grad_(True) for k, v in rec["init"].items()}
    opt = (model.TorchAdamW if use_torch_adamw else model.AdamW)(params, cfg)

    rows = []
    param_checks = []
    for s in range(n + 1):
        if s in rec["dumps"]:
            a, an, r, rn = compare_params(params, rec["dumps"][s])
            param_checks.append(dict(step=s, max_abs_diff=a, worst_tensor=an,
                                     max_rel_l2_diff=r, worst_rel_tensor=rn))
        if s == n:
            break
        tokens = torch.from_numpy(rec["tokens"][s].astype(np.int64))
        loss, gnorm, lr = model.train_step(params, opt, tokens, s, cfg)
        row = dict(step=s, loss_twin=loss, loss_receipt=float(rec["loss"][s]),
                   grad_norm_twin=gnorm, lr_twin=lr)
        if rec["grad_norm"] is not None and s < len(rec["grad_norm"]):
            row["grad_norm_receipt"] = float(rec["grad_norm"][s])
        if rec["lr"] is not None and s < len(rec["lr"]):
            row["lr_receipt"] = float(rec["lr"][s])
        rows.append(row)
        if verbose:
            print(f"step {s:4d}  loss twin {loss:.7f}  receipt {row['loss_receipt']:.7f}  "
                  f"grad_norm twin {gnorm:.6f}  lr {lr:.6e}", file=sys.stderr)
    skipped = [s for s in rec["dumps"] if s > n]
    return rows, param_checks, skipped


def summarize(rows, param_checks, skipped, args, notes):
    def worst(key_twin, key_ref, fn):
        best_v, best_s = None, None
        for r in rows:
            if key_ref not in r:
                continue
            d = fn(r[key_twin], r[key_ref])
            if worse(d, best_v):
                best_v, best_s = d, r["step"]
        return (0.0 if best_v is None else best_v), best_s

    absd = lambda a, b: abs(a - b)
    max_abs_loss, abs_loss_step = worst("loss_twin", "loss_receipt", absd)
    max_rel_loss, rel_loss_step = worst("loss_twin", "loss_receipt", rel_diff)
    max_abs_gn, gn_step = worst("grad_norm_twin", "grad_norm_receipt", absd)
    max_rel_gn, _ = worst("grad_norm_twin", "grad_norm_receipt", rel_diff)
    max_abs_lr, lr_step = worst("lr_twin", "lr_receipt", absd)
    has_gn = any("grad_norm_receipt" in r for r in rows)
    has_lr = any("lr_receipt" in r for r in rows)

    loss_ok = all(rel_diff(r["loss_twin"], r["loss_receipt"]) <= args.loss_rtol for r in rows)
    params_ok = all(pc["max_abs_diff"] <= args.param_atol for pc in param_checks)
    return dict(
        receipt=args.receipt,
        steps_compared=len(rows),
        max_abs_loss_diff=max_abs_loss,
        max_abs_loss_diff_step=abs_loss_step,
        max_rel_loss_diff=max_rel_loss,
        max_rel_loss_diff_step=rel_loss_step,
        max_abs_grad_norm_diff=max_abs_gn if has_gn else None,
        max_abs_grad_norm_diff_step=gn_step if has_gn else None,
        max_rel_grad_norm_diff=max_rel_gn if has_gn else None,
        max_abs_lr_diff=max_abs_lr if has_lr else None,
        max_abs_lr_diff_step=lr_step if has_lr else None,
        param_checks=param_checks,
        param_dumps_not_reached=skipped,
        loss_rtol=args.loss_rtol,
        param_atol=args.param_atol,
        optimizer="torch.optim.AdamW" if args.torch_adamw else "hand-written AdamW",
        torch_version=torch.__version__,
        threads=args.threads,
        notes=notes,
        first_loss=[rows[0]["loss_twin"], rows[0]["loss_receipt"]] if rows else None,
        last_loss=[rows[-1]["loss_twin"], rows[-1]["loss_receipt"]] if rows else None,
        loss_pass=loss_ok,
        params_pass=params_ok,
        **{"pass": loss_ok and params_ok and len(rows) > 0},
    )


def print_human(s):
    print(f"torch twin vs {s['receipt']}  (torch {s['torch_version']}, "
          f"{s['threads']} thread(s), {s['optimizer']})")
    for n in s["notes"]:
        print(f"  note: {n}")
    print(f"  steps compared:          {s['steps_compared']}")
    if s["first_loss"]:
        print(f"  loss first step:         twin {s['first_loss'][0]:.7f}  "
              f"receipt {s['first_loss'][1]:.7f}")
        print(f"  loss last step:          twin {s['last_loss'][0]:.7f}  "
              f"receipt {s['last_loss'][1]:.7f}")
    print(f"  max |loss diff|:         {s['max_abs_loss_diff']:.3e} at step "
          f"{s['max_abs_loss_diff_step']}")
    print(f"  max rel loss diff:       {s['max_rel_loss_diff']:.3e} at step "
          f"{s['max_rel_loss_diff_step']}  (tolerance {s['loss_rtol']:g})  "
          f"{'ok' if s['loss_pass'] else 'FAIL'}")
    if s["max_abs_grad_norm_diff"] is not None:
        print(f"  max |grad_norm diff|:    {s['max_abs_grad_norm_diff']:.3e} at step "
              f"{s['max_abs_grad_norm_diff_step']}  (rel {s['max_rel_grad_norm_diff']:.3e})")
    if s["max_abs_lr_diff"] is not None:
        print(f"  max |lr diff|:           {s['max_abs_lr_diff']:.3e} at step "
              f"{s['max_abs_lr_diff_step']}")
    for pc in s["param_checks"]:
        ok = pc["max_abs_diff"] <= s["param_atol"]
        print(f"  params at step {pc['step']:>6}:   max |diff| {pc['max_abs_diff']:.3e} "
              f"({pc['worst_tensor']}), max rel-L2 {pc['max_rel_l2_diff']:.3e} "
              f"({pc['worst_rel_tensor']})  (tolerance {s['param_atol']:g})  "
              f"{'ok' if ok else 'FAIL'}")
    if not s["param_checks"]:
        print("  params: no dumps after step 0 within the compared steps")
    if s["param_dumps_not_reached"]:
        print(f"  dumps beyond the compared steps (not checked): "
              f"{s['param_dumps_not_reached']}")
    print(f"  verdict: {'PASS' if s['pass'] else 'FAIL'}")


def main(argv=None):
    ap = argparse.ArgumentParser(
        description="Replay a harness receipt of the GPT-2 canary in PyTorch and compare.")
    ap.add_argument("receipt", help="HDF5 receipt written with --record-batches "
                                    "--dump-tensors 0[,S...]")
    ap.add_argument("--steps", type=int, default=None,
                    help="compare at most N steps (default: all in the receipt)")
    ap.add_argument("--json", action="store_true", help="print a JSON object")
    ap.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    ap.add_argument("--loss-rtol", type=float, default=1e-4,
                    help="relative loss tolerance per step (default 1e-4)")
    ap.add_argument("--param-atol", type=float, default=1e-4,
                    help="absolute tolerance on dumped parameters (default 1e-4)")
    ap.add_argument("--torch-adamw", action="store_true",
                    help="use torch.optim.AdamW instead of the hand-written update")
    ap.add_argument("--verbose", action="store_true",
                    help="print every step's numbers to stderr")
    args = ap.parse_args(argv)
    if args.steps is not None and args.steps < 1:
        ap.error("--steps must be >= 1")
    if args.threads < 1:
        ap.error("--threads must be >= 1")

    torch.set_num_threads(args.threads)
    torch.set_default_dtype(torch.float32)

    try:
        rec = read_receipt(args.receipt)
    except ReceiptError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2

    rows, param_checks, skipped = run_twin(rec, args.steps, args.torch_adamw, args.verbose)
    summary = summarize(rows, param_checks, skipped, args, rec["notes"])
    if args.json:
        print(json.dumps(summary, indent=2))
    else:
        print_human(summary)
    return 0 if summary["pass"] else 1


if __name__ == "__main__":
    sys.exit(main())
