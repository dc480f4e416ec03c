#!/usr/bin/env bash
# benchmarks/gpu_suite.py on a GPU machine that cannot reach a package registry: the wheels carried in
# .whl/ (TRL, datasets and what the image lacks: benchmarks/gpu_wheels.txt says how to fetch them) go to
# /tmp/site first. Results, the markdown report and the log go to $OUT (the device tool's output folder),
# else ./gpu-suite-out.
# Extra arguments go to the suite (e.g. --stages env,correctness or --dry-run).
set -euo pipefail
cd "$(dirname "$0")/.."
out="${OUT:-gpu-suite-out}"
mkdir -p "$out"
if compgen -G ".whl/*.whl" > /dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
    export PYTHONPATH="/tmp/site${PYTHONPATH:+:$PYTHONPATH}"
fi
export PYTHONUNBUFFERED=1
python3 benchmarks/gpu_suite.py --json "$out/gpu_suite.json" --markdown "$out/gpu_suite.md" "$@" 2>&1 | tee "$out/gpu_suite.log"
