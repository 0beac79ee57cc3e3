"""The same steps as the positive cases, written the XLA-safe way: each audits clean.

- AdamW with its step counter, bias corrections and learning rate in 0-D device tensors,
  updated in place on the device (the pattern of canary_harness.runs.optim.CanaryAdamW);
- the learning rate of a schedule copied into a 0-D device tensor from host data
  (lr_t.copy_(torch.tensor(lr))), never passed to an op as a Python float;
- the loss returned as a device tensor and read after the step;
- the positive targets selected with a fixed-shape mask (a multiply), not nonzero();
- one batch size from the first step on.
"""

import torch

from _net import net_and_data


class DeviceAdamW(torch.optim.Optimizer):
    """AdamW whose per-step numbers live on the device: t, 1 - b1^t, 1 - b2^t and lr are
    0-D tensors updated in place, so every step is the same graph with no host read."""

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2):
        super().__init__(params, {"lr": lr, "betas": betas, "eps": eps, "weight_decay": weight_decay})
        device = self.param_groups[0]["params"][0].device
        self.step_t = torch.zeros((), device=device)
        self.lr_t = torch.full((), float(lr), device=device)
        for group in self.param_groups:
            for p in group["params"]:
                self.state[p] = {"step": self.step_t, "exp_avg": torch.zeros_like(p), "exp_avg_sq": torch.zeros_like(p)}

    def set_lr(self, lr):
        self.lr_t.copy_(torch.tensor(lr))  # data from the host, not a constant of the graph

    @torch.no_grad()
    def step(self, closure=None):
        self.step_t.add_(1)
        for group in self.param_groups:
            beta1, beta2 = group["betas"]
            correction1 = 1 - torch.pow(beta1, self.step_t)
            correction2 = 1 - torch.pow(beta2, self.step_t)
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                m, v = state["exp_avg"], state["exp_avg_sq"]
                p.mul_(1 - self.lr_t * group["weight_decay"])
                m.mul_(beta1).add_(p.grad, alpha=1 - beta1)
                v.mul_(beta2).addcmul_(p.grad, p.grad, value=1 - beta2)
                p.sub_(self.lr_t * (m / correction1) / ((v / correction2).sqrt() + group["eps"]))


def safe_adamw(device="cpu"):
    net, data = net_and_data(device=device)
    optimizer = DeviceAdamW(net.parameters(), lr=1e-3, weight_decay=0.1)

    def step(i):
        x, y = data.batch(i)
        loss = torch.nn.functional.mse_loss(net(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        return loss  # read by the caller, after the step

    return step


def safe_clip(device="cpu"):
    """torch.nn.utils.clip_grad_norm_ as it comes: the norm and the clip coefficient stay
    device tensors (no .item()), on torch 1.13 and 2.x."""
    net, data = net_and_data(device=device)
    optimizer = DeviceAdamW(net.parameters(), lr=1e-3, weight_decay=0.1)

    def step(i):
        x, y = data.batch(i)
        loss = torch.nn.functional.mse_loss(net(x), y)
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(net.parameters(), 0.5)
        optimizer.step()
        return loss

    return step


def safe_lr(device="cpu"):
    net, data = net_and_data(device=device)
    lr_t = torch.zeros((), device=device)

    def step(i):
        lr_t.copy_(torch.tensor(0.1 * (1.0 - i / 10)))
        x, y = data.batch(i)
        loss = torch.nn.functional.mse_loss(net(x), y)
        net.zero_grad()
        loss.backward()
        with torch.no_grad():
            for p in net.parameters():
                p.sub_(lr_t * p.grad)
        return loss

    return step


LOSSES = []


def safe_loss(device="cpu"):
    net, data = net_and_data(device=device)
    optimizer = torch.optim.SGD(net.parameters(), lr=0.05)

    def step(i):
        x, y = data.batch(i)
        loss = torch.nn.functional.mse_loss(net(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        LOSSES.append(loss.detach())  # a device tensor: read it after the step (or after the run)

    return step


def safe_mask(device="cpu"):
    net, data = net_and_data(device=device)
    optimizer = torch.optim.SGD(net.parameters(), lr=0.05)

    def step(i):
        x, y = data.batch(i)
        keep = (y > 0).to(y.dtype)  # the mask as numbers: the shape stays (8, 1)
        loss = (((net(x) - y) ** 2) * keep).sum() / keep.sum().clamp(min=1)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()

    return step


def safe_batch(device="cpu"):
    net, data = net_and_data(device=device)
    optimizer = torch.optim.SGD(net.parameters(), lr=0.05)

    def step(i):
        x, y = data.batch(i, 16)
        loss = torch.nn.functional.mse_loss(net(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()

    return step
