#!/usr/bin/env bash
# The GPU check, in one go, for a session that has a machine with a GPU (issue 22, item 5).
#
#   tools/gpu_check.sh                       # tests/test_cuda.py, then the whole suite
#   SUITE="tests/serialize tests/export" tools/gpu_check.sh   # a part of the suite only
#   SUITE=none tools/gpu_check.sh            # tests/test_cuda.py only
#
# It sets up nothing that needs the network (GPU machines reach nothing outside): it uses
# $PYTHON, else .venv/bin/python, else python3, and says what is missing. Logs go to $OUT
# (the device machine's folder that comes back) or ./gpu_check/; the last lines printed
# are a summary to paste into docs/compatibility.md. Each pytest run is bounded by
# $SUITE_TIMEOUT seconds (default 480) so one command fits a device call.
set -u
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-$( [ -x .venv/bin/python ] && echo .venv/bin/python || echo python3 )}
LOGS=${OUT:-gpu_check}
SUITE=${SUITE:-tests}
SUITE_TIMEOUT=${SUITE_TIMEOUT:-480}
mkdir -p "$LOGS"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"

echo "== machine"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null \
    || echo "nvidia-smi: not found"
"$PYTHON" - <<'PY' || { echo "gpu_check: $PYTHON cannot import torch and fxloom" >&2; exit 2; }
import platform, torch, fxloom
print(f"python {platform.python_version()}, torch {torch.__version__} (CUDA {torch.version.cuda}), "
      f"fxloom {fxloom.__version__}")
print(f"cuda available: {torch.cuda.is_available()}, devices: {torch.cuda.device_count()}"
      + (f" ({torch.cuda.get_device_name(0)})" if torch.cuda.is_available() else ""))
for extra in ("transformers", "onnxruntime", "pytest"):
    try:
        print(f"{extra} {__import__(extra).__version__}")
    except ImportError:
        print(f"{extra}: not installed (tests that need it are skipped)")
PY

run() {  # run NAME ARGS...: pytest with a time bound, its log in $LOGS/NAME.txt
    local name=$1; shift
    echo "== $name: pytest $*"
    timeout "$SUITE_TIMEOUT" "$PYTHON" -m pytest -p no:cacheprovider -rfEs "$@" \
        >"$LOGS/$name.txt" 2>&1
    local rc=$?
    tail -n 25 "$LOGS/$name.txt"
    [ $rc -eq 124 ] && echo "($name stopped after ${SUITE_TIMEOUT}s: raise SUITE_TIMEOUT or narrow SUITE)"
    RESULT[$name]="$(grep -E '(passed|failed|skipped|error).* in [0-9.]+s' "$LOGS/$name.txt" | tail -1 | tr -d '=')"
    [ -n "${RESULT[$name]}" ] || RESULT[$name]="no result (exit code $rc)"
}

declare -A RESULT
run cuda tests/test_cuda.py -v -s
if [ "$SUITE" != none ]; then
    # shellcheck disable=SC2086
    run suite $SUITE --ignore=tests/test_cuda.py
fi

echo
echo "== summary for docs/compatibility.md"
"$PYTHON" - "${RESULT[cuda]}" "${RESULT[suite]:-not run}" "$SUITE" <<'PY'
import platform, sys, torch
cuda, suite, scope = sys.argv[1:]
gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no GPU"
print("| GPU | Python | torch (CUDA) | tests/test_cuda.py | suite (" + scope + ") |")
print("|---|---|---|---|---|")
print(f"| {gpu} | {platform.python_version()} | {torch.__version__} ({torch.version.cuda}) "
      f"| {cuda.strip()} | {suite.strip()} |")
PY
