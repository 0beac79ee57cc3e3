"""The op oracle's capture at module outputs, in process (tracing/module_capture.py): what it
judges and what it lists as not judged, on a model of the team's own making (no canary, no
child): a Linear called with a keyword argument (which a forward pre-hook does not see) and
an unknown op module are listed, never a crash; a Linear called positionally is recomputed
in float64 with its operands as they were before the optimizer moved them."""

from __future__ import annotations

import torch

from canary_harness.tracing.module_capture import ModuleCapture


class _Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.first = torch.nn.Linear(4, 4)
        self.second = torch.nn.Linear(4, 4)
        self.act = torch.nn.Tanh()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.second(input=self.act(self.first(x)))


def test_a_keyword_call_and_an_unknown_module_are_listed_and_a_positional_linear_is_judged() -> None:
    torch.manual_seed(0)
    net = _Net()
    optimizer = torch.optim.SGD(net.parameters(), lr=0.5)
    capture = ModuleCapture(net)
    x = torch.randn(3, 4)
    with capture.step():
        net(x).square().sum().backward()
        optimizer.step()  # moves the weights in place after the forward: the capture kept them as they were
    captured = capture.finish()
    capture.close()
    assert captured.not_judged == {"Linear (called with keyword arguments)": 1, "Tanh (no module-level bound yet)": 1}
    (first,) = captured.results
    assert (first.op, first.aten, first.kind, first.count, first.tensor) == ("first", "Linear", "dot", 5, "first.out")
    with torch.no_grad():
        moved = torch.nn.functional.linear(x, net.first.weight, net.first.bias).double().reshape(-1).numpy()
    assert abs(first.got - first.exact).max() <= 5 * 2**-24 * first.magnitude.max()
    assert abs(moved - first.exact).max() > 1e-3  # recomputed from the weights before the update
