"""Per-call overhead of ``fxloom.compile`` (guard + run) on two small cases, in CPU time.

- ``add``: ``x + y`` on two 4-element tensors (the fast-start case);
- ``layer``: ``run_layer(layer, x)`` over one ``Indexed`` layer (an ``nn.Linear(4, 4)`` plus
  its int ``layer_idx``, ``bench_recompiles.py``'s "layers' own index"), a module the call
  brings, whose guard reads its submodule's parameters.

Each tree is measured in a fresh process (one torch thread), the trees interleaved round by
round, so that the load of a shared machine falls on both alike; the figure is the best of
5 blocks of per-call process CPU time (``time.process_time``), in microseconds, eager beside.

    python benchmarks/bench_call_overhead.py --trees /work/main /work/wt-branch --rounds 3
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

PREFIX = "OVERHEAD "


def worker() -> None:
    import torch
    from bench_recompiles import Indexed  # the same layer as its "layers' own index" case

    import fxloom

    torch.set_num_threads(1)

    def run_layer(layer, x):
        return layer(x)

    def add(x, y):
        return x + y

    cases = {
        "add": (add, (torch.randn(4), torch.randn(4))),
        "layer": (run_layer, (Indexed(3), torch.randn(2, 4))),
    }
    found = {}
    for name, (fn, args) in cases.items():
        compiled = fxloom.compile(fn)
        for _ in range(5):
            compiled(*args)
        torch.testing.assert_close(compiled(*args), fn(*args))
        best = {}
        for _ in range(5):
            for label, target in (("eager", fn), ("compiled", compiled)):
                calls = 2000
                start = time.process_time()
                for _ in range(calls):
                    target(*args)
                seconds = (time.process_time() - start) / calls
                best[label] = min(best.get(label, float("inf")), seconds * 1e6)
        found[name] = best
    print(PREFIX + json.dumps(found))


def measure(tree: str) -> dict:
    env = dict(os.environ, PYTHONPATH=tree)
    done = subprocess.run(
        [sys.executable, __file__, "--worker"], capture_output=True, text=True, env=env
    )
    for line in done.stdout.splitlines():
        if line.startswith(PREFIX):
            return json.loads(line[len(PREFIX) :])
    raise RuntimeError(done.stderr[-2000:])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--trees", nargs="+", default=["."], help="source trees to compare")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    if args.worker:
        worker()
        return
    for round_ in range(args.rounds):
        for tree in args.trees:
            found = measure(tree)
            cells = "  ".join(
                f"{case}: {v['compiled']:.1f} us (eager {v['eager']:.1f})"
                for case, v in found.items()
            )
            print(f"round {round_} {tree}: {cells}  load {os.getloadavg()[0]:.1f}", flush=True)


if __name__ == "__main__":
    main()
