"""A small regression model and its data for the audit cases: fixed seeds, CPU tensors.

Batches come from host memory (numpy) as new tensors, as a data loader hands them over:
slicing them is no op of the step."""

import numpy as np
import torch


def net_and_data(seed: int = 0):
    torch.manual_seed(seed)
    net = torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
    rng = np.random.default_rng(seed + 1)
    inputs = rng.standard_normal((64, 6), dtype=np.float32)
    targets = rng.standard_normal((64, 1), dtype=np.float32)
    return net, inputs, targets


def batch_at(inputs, targets, i: int, batch: int = 8):
    start = (i * batch) % (inputs.shape[0] - batch + 1)
    return (torch.from_numpy(np.ascontiguousarray(inputs[start:start + batch])),
            torch.from_numpy(np.ascontiguousarray(targets[start:start + batch])))
