"""Output containers of torch modules (issue 28): a model's dataclass, ``ModelOutput``-style
dict-and-dataclass, dict, or named tuple output comes back from every transform as the same
container of results, not a container of escaped tracers."""
from __future__ import annotations

import collections
import dataclasses

import pytest

torch = pytest.importorskip("torch")
nn = torch.nn

import fpx  # noqa: E402


@dataclasses.dataclass
class Plain:
    logits: torch.Tensor
    hidden: torch.Tensor


@dataclasses.dataclass
class ModelOutput(collections.OrderedDict):
    """transformers' shape: an OrderedDict and a dataclass, registered with torch's pytree."""
    logits: torch.Tensor = None
    hidden: torch.Tensor = None

    def __post_init__(self):
        for f in dataclasses.fields(self):
            if getattr(self, f.name) is not None:
                self[f.name] = getattr(self, f.name)

    def __setitem__(self, k, v):
        super().__setitem__(k, v)
        super().__setattr__(k, v)


torch.utils._pytree.register_pytree_node(
    ModelOutput, lambda o: (list(o.values()), list(o.keys())),
    lambda keys, vals: ModelOutput(**dict(zip(keys, vals))))

Named = collections.namedtuple("Named", "logits hidden")
KINDS = {"dataclass": Plain, "model_output": ModelOutput, "named": Named,
         "dict": lambda a, b: {"logits": a, "hidden": b}}


class Net(nn.Module):
    def __init__(self, kind):
        super().__init__()
        torch.manual_seed(0)
        self.lin, self.kind = nn.Linear(4, 3), kind

    def forward(self, x):
        h = torch.tanh(x)
        return KINDS[self.kind](self.lin(h), h)


def _get(out, name):
    return out[name] if isinstance(out, dict) else getattr(out, name)


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_output_container_comes_back_with_results(kind):
    m = Net(kind).eval()
    x = torch.randn(2, 4, generator=torch.Generator().manual_seed(1))
    ref = m(x)
    iv = fpx.interval(m)(x)
    assert type(iv) is type(ref)
    for name in ("logits", "hidden"):
        assert isinstance(_get(iv, name), fpx.Interval)
        assert _get(iv, name).contains(_get(ref, name)).all()
    s = fpx.stochastic(m, "sr", samples=3)(x)
    assert type(s) is type(ref) and _get(s, "logits").shape == (3, 2, 3)


def test_layers_of_a_module_with_parameter_lists():
    """Issue 28: the default layers of a module whose parameters live in ParameterLists (they
    never run) are the module itself, not 'none of the layers ['weights', 'biases'] ran'."""
    class Stack(nn.Module):
        def __init__(self):
            super().__init__()
            g = torch.Generator().manual_seed(2)
            self.weights = nn.ParameterList([nn.Parameter(torch.randn(4, 4, generator=g))
                                             for _ in range(2)])
            self.biases = nn.ParameterList([nn.Parameter(torch.randn(4, generator=g))
                                            for _ in range(2)])

        def forward(self, x):
            for w, b in zip(self.weights, self.biases):
                x = torch.tanh(x @ w + b)
            return x
    import copy
    m = Stack().eval()
    x = torch.randn(3, 4, generator=torch.Generator().manual_seed(3))
    v = fpx.classify(m, copy.deepcopy(m).double(), x)
    assert v.kind == "roundoff" and len(v.layers) == 1
