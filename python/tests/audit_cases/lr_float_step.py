"""A learning-rate schedule fed to the update as a Python float: a new constant every step."""

import torch

from _net import net_and_data


def lr_at(i):
    return 0.1 * (1.0 - i / 10)


def make_step(device="cpu"):
    net, data = net_and_data(device=device)

    def step(i):
        x, y = data.batch(i)
        loss = torch.nn.functional.mse_loss(net(x), y)
        net.zero_grad()
        loss.backward()
        lr = lr_at(i)
        with torch.no_grad():
            for p in net.parameters():
                p.add_(p.grad, alpha=-lr)  # LR_LINE
        return loss

    return step
