"""A loop that draws its batch inside the step, as the own-model example's batch(i) does:
window starts from torch.randint with no device (host memory), read with .tolist() (no
device read: they never left the host), and windows of a host token stream stacked. Every
one of these host tensors has more than one element."""

import numpy as np
import torch

from _net import net_and_data


def make_step(device="cpu"):
    net, _ = net_and_data(device=device)
    optimizer = torch.optim.SGD(net.parameters(), lr=1e-2)
    stream = np.linspace(-1.0, 1.0, 256, dtype=np.float32)

    def step(i):
        data = torch.as_tensor(stream)  # host memory, as a data loader hands it over
        starts = torch.randint(len(data) - 7, (4,), generator=torch.Generator().manual_seed(i))
        x = torch.stack([data[s:s + 6] for s in starts.tolist()]).to(device)
        loss = net(x).square().mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        return loss

    return step
