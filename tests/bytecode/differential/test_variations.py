"""Hand-written programs, each through every call variation CI runs (``run.CI_VARIATIONS``):
the call sequences of ``variations.py`` applied to the shapes of program users write."""

from __future__ import annotations

import pytest

from differential.harness import Call, Case, run_case
from differential.run import CI_VARIATIONS
from differential.variations import sequence, tensor

pytestmark = pytest.mark.usefixtures("one_thread")

PROGRAMS = {
    "the issue's aliasing example": "def f(x, y, n, s):\n    return x + y * 2\n",
    "global reads and a flag": """
SCALE = 2
OFFSETS = {"x": 0.5}
ENABLED = True


def f(x, y, n, s):
    if ENABLED:
        x = x * SCALE
    return x + OFFSETS["x"] * n
""",
    "a closure cell read": """
def make():
    scale = 3.0

    def f(x, y, n, s):
        return x * scale + y
    return f


f = make()
""",
    "a class attribute read and written": """
class Config:
    scale = 2
    calls = 0


def f(x, y, n, s):
    Config.calls += 1
    return x * Config.scale - y
""",
    "an input changed in place": "def f(x, y, n, s):\n    x.add_(y)\n    return x * n\n",
    "a branch on a value and .item()": """
def f(x, y, n, s):
    if (x @ y).sum() > 0:
        k = y.sum().item()
        return x * k
    return y - n
""",
    "a print and a raise on some ints": """
def f(x, y, n, s):
    print("n is", n, tuple(x.shape))
    if n == 3:
        raise ValueError(f"n is {n}")
    return torch.relu(x) * s
""",
}


@pytest.mark.parametrize("name", PROGRAMS)
def test_every_variation_of_the_calls_agrees_with_eager(name):
    source = "import torch\n\n" + PROGRAMS[name]
    base = Call((tensor((3, 3), 1), tensor((3, 3), 2), 2, 1.5), label="base")
    failure = run_case(Case(source, sequence(base, list(CI_VARIATIONS))))
    assert failure is None, str(failure)
