"""Measure one (model, method) pair and print the result as one JSON line.

    python -m benchmarks.zoo.worker MODEL METHOD

The result (``measure``) records whether the capture succeeded (else the error's class,
first line and innermost location), whether the captured program's outputs match eager
(every tensor leaf, rtol 1e-4 / atol 1e-5), the capture time, the node count and the
runtime of the captured program relative to eager (medians of a few calls, one thread).
``run.py`` starts this in a fresh subprocess per pair, so no state leaks between methods.

Depends on: torch, benchmarks.zoo.registry, benchmarks.zoo.methods.
"""

from __future__ import annotations

import json
import statistics
import sys
import time
import traceback
import warnings
from pathlib import Path
from typing import Any

import torch

from fxloom import pytree

if __package__ in (None, ""):  # run as a script: make `benchmarks.zoo` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmarks.zoo import methods, registry

RTOL, ATOL = 1e-4, 1e-5
TIMED_CALLS = 10
WARM_CAPTURES = 5  # captures repeated after the first, if the first took under WARM_LIMIT_S
WARM_LIMIT_S = 3.0
RESULT_PREFIX = "ZOO-RESULT "


tensor_leaves = pytree.tensor_leaves  # every tensor of a model output, in order


def compare(actual: Any, expected: Any) -> str | None:
    """``None`` if the tensor leaves match, else what differs (one line)."""
    got, want = tensor_leaves(actual), tensor_leaves(expected)
    if not want:
        return "eager returned no tensor"
    if len(got) != len(want):
        return f"{len(got)} tensors returned, eager returns {len(want)}"
    for index, (a, b) in enumerate(zip(got, want)):
        try:
            torch.testing.assert_close(a, b, rtol=RTOL, atol=ATOL)
        except AssertionError as error:
            first = str(error).strip().splitlines()[0]
            return f"output {index}: {first}"
    return None


def median_seconds(call: Any, inputs: dict[str, Any]) -> float:
    call(inputs)  # warm-up
    times = []
    for _ in range(TIMED_CALLS):
        start = time.perf_counter()
        call(inputs)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def warm_capture_seconds(capture: Any, model: torch.nn.Module, inputs: dict[str, Any]) -> float:
    """The best of a few more captures: the first one in a fresh process also pays one-time
    costs (lazy imports, caches), which says little about capturing many models."""
    times = []
    for _ in range(WARM_CAPTURES):
        start = time.perf_counter()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            capture(model, inputs)
        times.append(time.perf_counter() - start)
    return min(times)


def error_record(error: BaseException) -> dict[str, Any]:
    frames = traceback.extract_tb(error.__traceback__)
    where = f"{Path(frames[-1].filename).name}:{frames[-1].lineno}" if frames else ""
    lines = str(error).strip().splitlines()
    return {
        "error": type(error).__name__,
        "message": lines[0][:300] if lines else "",
        "where": where,
    }


def measure(model_name: str, method: str) -> dict[str, Any]:
    """Build ``model_name``, capture it with ``method``, and compare it with eager."""
    if method in methods.COMPILERS:
        return measure_compile(model_name, method)
    result: dict[str, Any] = {"model": model_name, "method": method, "status": "error"}
    spec = registry.get(model_name)
    result["family"] = spec.family
    capture = methods.METHODS[method]
    model, inputs = spec.build()
    if method in methods.DYNAMIC_BATCH and spec.example[0] < 2:
        # A batch of 1 cannot stand for the others (both exports specialise sizes 0 and 1).
        inputs = spec.make_inputs(2, spec.example[1])
    try:
        with torch.no_grad():
            expected = methods.run_eager(model, inputs)
    except Exception as error:  # the model itself does not run: no method is to blame
        result.update(stage="eager", **error_record(error))
        return result
    try:
        start = time.perf_counter()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            captured = capture(model, inputs)
        result["capture_s"] = time.perf_counter() - start
        result["nodes"] = captured.nodes
        if result["capture_s"] < WARM_LIMIT_S:
            result["capture_warm_s"] = warm_capture_seconds(capture, model, inputs)
    except Exception as error:  # any failure to capture is a result, not a crash
        result.update(stage="capture", **error_record(error))
        return result
    if captured.core_nodes is not None:
        # Decomposing is a step after the capture: its failure is noted, the capture stands.
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                result["core_nodes"] = captured.core_nodes()
        except Exception as error:
            record = error_record(error)
            result["core_error"] = f"{record['error']}: {record['message'][:120]}"
    try:
        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            actual = captured.run(inputs)
            mismatch = compare(actual, expected)
            if mismatch is not None:
                result.update(status="mismatch", message=mismatch)
                return result
            fixed = methods.fixed_args(model, inputs)  # once: keep inspect out of the timing
            eager_s = median_seconds(lambda given: model(**given, **fixed), inputs)
            captured_s = median_seconds(captured.run, inputs)
    except Exception as error:
        result.update(stage="run", **error_record(error))
        return result
    result.update(status="ok", eager_s=eager_s, captured_s=captured_s)
    result["runtime_ratio"] = captured_s / eager_s
    if method in methods.DYNAMIC_BATCH:
        result["second_batch"] = second_batch(spec, model, captured)
    return result


SECOND_BATCH = 5  # the examples' batch is 2


def second_batch(spec: registry.ModelSpec, model: torch.nn.Module, captured: Any) -> str:
    """ "ok" if the captured program computes eager's result at another batch size, else why not."""
    inputs = spec.make_inputs(SECOND_BATCH, spec.example[1])
    try:
        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            expected = methods.run_eager(model, inputs)
            return compare(captured.run(inputs), expected) or "ok"
    except Exception as error:
        record = error_record(error)
        return f"{record['error']}: {record['message'][:200]}"


# ----------------------------------------------------------------------------- compilers
STEADY_ROUNDS = (30, 300)  # one eager and one compiled call per round, interleaved
STEADY_SECONDS = 1.5  # rounds within the bounds, to fill about this long
STAGES = ("first", "identical", "other_batch")


def measure_compile(model_name: str, method: str) -> dict[str, Any]:
    """Compile ``model_name`` with a compile-on-first-call ``method`` and call it three times:
    at the example (the call that compiles), again at the same inputs (an identical call must
    compile nothing), then at another batch size. After each call: whether it equals eager and
    how many graphs the compiler holds. Then the steady-state time per call at the example,
    compiled against eager (interleaved calls, medians, one thread)."""
    result: dict[str, Any] = {"model": model_name, "method": method, "status": "error"}
    spec = registry.get(model_name)
    result["family"] = spec.family
    compiler = methods.COMPILERS[method]
    model, inputs = spec.build()
    batch = spec.example[0] + 3  # another batch size (1 and 2 are special to both compilers)
    others = spec.make_inputs(batch, spec.example[1])
    fixed = methods.fixed_args(model, inputs)
    calls = {"first": inputs, "identical": inputs, "other_batch": others}
    try:
        with torch.no_grad():
            expected = {stage: model(**given, **fixed) for stage, given in calls.items()}
    except Exception as error:  # the model itself does not run: no method is to blame
        result.update(stage="eager", **error_record(error))
        return result
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        result["start_up_s"] = _start_up(compiler)
        before = compiler.graphs(None)
        try:
            start = time.perf_counter()
            compiled = compiler.compile(model)
            for stage, given in calls.items():
                got = compiled(**given, **fixed)
                if stage == "first":
                    result["first_call_s"] = time.perf_counter() - start
                result[f"graphs_{stage}"] = compiler.graphs(compiled) - before
                mismatch = compare(got, expected[stage])
                result[f"correct_{stage}"] = mismatch is None
                if mismatch is not None:
                    result.setdefault("message", f"{stage}: {mismatch}")
            result.update(compiler.details(compiled))
            eager_s, compiled_s, ratio = steady_state(
                lambda: model(**inputs, **fixed), lambda: compiled(**inputs, **fixed)
            )
            result["graphs_steady"] = compiler.graphs(compiled) - before
        except Exception as error:
            result.update(stage="run", **error_record(error))
            return result
    correct = all(result[f"correct_{stage}"] for stage in STAGES)
    result.update(status="ok" if correct else "mismatch", eager_s=eager_s, captured_s=compiled_s)
    result["runtime_ratio"] = ratio
    return result


def _start_up(compiler: methods.Compiler) -> float:
    """Each library's one-time start-up (its imports, torch's meta kernels), paid on a small
    function of its own, so the first call timed after it is what compiling the model costs."""
    start = time.perf_counter()
    warm = compiler.compile(torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.ReLU()))
    warm(torch.randn(2, 3))
    return time.perf_counter() - start


def steady_state(eager: Any, compiled: Any) -> tuple[float, float, float]:
    """Median seconds per call of ``eager()`` and ``compiled()``, and the median of the
    per-round ratios compiled / eager: one call of each per round (interleaved and paired, so
    a change in a shared machine's load hits both sides of a ratio), after a warm-up; as many
    rounds as fit in about ``STEADY_SECONDS``."""
    start = time.perf_counter()
    for _ in range(3):
        eager(), compiled()
    per_round = (time.perf_counter() - start) / 3
    low, high = STEADY_ROUNDS
    rounds = max(low, min(high, int(STEADY_SECONDS / max(per_round, 1e-6))))
    times: dict[Any, list[float]] = {eager: [], compiled: []}
    for _ in range(rounds):
        for call in (eager, compiled):
            start = time.perf_counter()
            call()
            times[call].append(time.perf_counter() - start)
    ratios = [c / e for c, e in zip(times[compiled], times[eager])]
    return (
        statistics.median(times[eager]),
        statistics.median(times[compiled]),
        statistics.median(ratios),
    )


def main(argv: list[str] | None = None) -> None:
    model_name, method = sys.argv[1:] if argv is None else argv
    torch.set_num_threads(1)
    result = measure(model_name, method)
    print(RESULT_PREFIX + json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
