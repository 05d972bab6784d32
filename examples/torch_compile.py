"""``torch.compile`` (inductor, CPU) vs eager: round-off, and fpx can say so.

Inductor fuses the elementwise ops, reorders reductions and vectorizes them: the compiled
module's outputs differ from eager ones in the last bits, and ``torch.testing.assert_close``
with tight tolerances fails now and then. fpx answers the question that matters: is the
compiled output a result the eager program could produce under round-off? (It bounds every
result of the eager program's arithmetic, in any summation order.)
Run: ``python examples/torch_compile.py`` (needs a C++ compiler for inductor).
"""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

import fpx


class Net(nn.Module):
    def __init__(self, seed: int = 0):
        super().__init__()
        torch.manual_seed(seed)
        self.conv = nn.Conv2d(3, 16, 3, padding=1)
        self.bn = nn.BatchNorm2d(16)
        self.fc1 = nn.Linear(16 * 4 * 4, 64)
        self.fc2 = nn.Linear(64, 10)

    def forward(self, x):
        x = F.max_pool2d(F.silu(self.bn(self.conv(x))), 2)
        x = F.gelu(self.fc1(x.flatten(1)))
        return F.log_softmax(self.fc2(x), -1)


def main():
    model = Net().eval()
    x = torch.randn(8, 3, 8, 8, generator=torch.Generator().manual_seed(0))
    compiled = torch.compile(model)
    with torch.no_grad():
        eager, fused = model(x), compiled(x)
    print("max |eager - compiled|:", (eager - fused).abs().max().item())
    v = fpx.classify(model, fused, x)
    print(v.report())
    fpx.testing.assert_close(fused, eager, fn=model, args=(x,))
    print("fpx.testing.assert_close(compiled, eager, fn=model): passed")


if __name__ == "__main__":
    main()
