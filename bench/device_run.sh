#!/usr/bin/env bash
# The GPU run behind chapter 11's GPU numbers and the README's GPU rows, in one command (device
# time is scarce): the tests that need CUDA, the end-to-end check, then the benchmarks, most
# important first, each under a time limit. Results land in OUT (default bench/results/device):
# tests.txt (versions, then tests), e2e.txt, gpu_results.json (copy it to notebooks/data/ for
# chapter 11), run_all.txt.
#
#   bash bench/device_run.sh [OUT] [SECONDS_FOR_BENCHMARKS]
#   BENCHES="block,call_overhead" bash bench/device_run.sh   # another order or subset of benchmarks
#
# Packages the GPU image lacks (bytecode, depyf and its needs) travel as wheels in .whl/.
set -u
out=${1:-bench/results/device}
budget=${2:-330}
mkdir -p "$out"
if ls .whl/*.whl >/dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
    export PYTHONPATH=/tmp/site
fi
export PYTHONPATH="${PYTHONPATH:+$PYTHONPATH:}$PWD" PYTHONUNBUFFERED=1
python3 -c "import torch, triton, sys; print(sys.version.split()[0], torch.__version__, triton.__version__, torch.cuda.get_device_name())" | tee "$out/tests.txt"

xdist=$(python3 -c "import xdist" 2>/dev/null && echo "-n 8")
timeout 120 python3 -m pytest -q -p no:cacheprovider $xdist tests/test_inductor_reductions.py \
    tests/test_inductor_training.py tests/test_aot_tininductor.py tests/test_triton_launcher.py \
    tests/test_cuda_runtime.py tests/test_inductor_pointwise.py tests/test_dynamo_graph_breaks.py \
    tests/test_dynamo_api.py tests/test_autotune.py tests/test_inductor_indexing.py 2>&1 | tail -25 | tee -a "$out/tests.txt"
timeout 60 python3 bench/gpu_e2e.py 2>&1 | tail -30 | tee "$out/e2e.txt"

start=$(date +%s)
IFS=, read -r -a names <<<"${BENCHES:-gpt_train,block,profile_step,pointwise_chain,call_overhead,cold_compile,block reduce-overhead,softmax_layernorm,call_overhead reduce-overhead,guard_overhead,resnet_train,dynamic_shapes}"
for name in "${names[@]}"; do
    left=$((budget - ($(date +%s) - start)))
    [ "$left" -gt 20 ] || { echo "== $name: skipped (time budget spent)"; continue; }
    timeout "$left" python3 bench/run_all.py --only "$name" --timeout "$left" --out "$out/part_${name// /_}.json"
done 2>&1 | tee "$out/run_all.txt"
python3 - "$out" <<'PY'
import json, sys, pathlib
out = pathlib.Path(sys.argv[1])
parts = sorted(out.glob("part_*.json"), key=lambda p: p.stat().st_mtime)
combined = None
for p in parts:
    d = json.loads(p.read_text())
    combined = combined or {k: v for k, v in d.items() if k != "results"} | {"results": {}}
    combined["results"].update(d["results"])
    p.unlink()
if combined:
    (out / "gpu_results.json").write_text(json.dumps(combined, indent=1))
    print("combined:", ", ".join(combined["results"]))
PY
