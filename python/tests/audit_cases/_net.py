"""A small regression model and its data for the audit cases: fixed seeds, made on `device`
(the CPU for the static audit, torch_xla's device for `--xla`).

Batches come from host memory (numpy) as new tensors, as a data loader hands them over,
and go to the device as the loop's input: slicing them is no op of the step."""

import numpy as np
import torch


class Data:
    def __init__(self, inputs, targets, device) -> None:
        self.inputs, self.targets = inputs, targets
        self.device = torch.device(device)

    def batch(self, i: int, batch: int = 8):
        start = (i * batch) % (self.inputs.shape[0] - batch + 1)
        x = torch.from_numpy(np.ascontiguousarray(self.inputs[start:start + batch]))
        y = torch.from_numpy(np.ascontiguousarray(self.targets[start:start + batch]))
        if self.device.type == "cpu":
            return x, y
        return x.to(self.device), y.to(self.device)


def net_and_data(seed: int = 0, device="cpu"):
    torch.manual_seed(seed)
    net = torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1)).to(device)
    rng = np.random.default_rng(seed + 1)
    inputs = rng.standard_normal((64, 6), dtype=np.float32)
    targets = rng.standard_normal((64, 1), dtype=np.float32)
    return net, Data(inputs, targets, device)
