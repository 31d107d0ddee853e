#!/usr/bin/env bash
# The CUDA paths on a machine with a GPU, in one go (CI has none, so they are checked here):
#   bash benchmarks/cuda_check.sh OUTDIR
# 1. the bundled example, v7 (crashes with a KeyError) and v7-fixed, four stages with
#    --device cuda: reports under OUTDIR/example-*;
# 2. the tests that need a GPU (tests/e2e/test_cuda_paths.py: CUDA events, the allocator, the sync
#    debug mode, the non_blocking watch, the CUDA sanitizer, a float16 speedup) and the ones
#    that take another path on CUDA, with the reports of their gate runs under OUTDIR.
# Needs traingate installed (pip install -e .) in the interpreter that has CUDA's torch.
set -uo pipefail
out=${1:?usage: cuda_check.sh OUTDIR}
mkdir -p "$out"
python3 - <<'PY' | tee "$out/device.txt"
import torch
print("torch", torch.__version__, "cuda", torch.version.cuda, "available", torch.cuda.is_available())
print("device", torch.cuda.get_device_name(0) if torch.cuda.is_available() else None)
PY
work=$(mktemp -d)
python3 examples/materialize.py v7-fixed "$work/v7-fixed" >/dev/null
for version in v7 v7-fixed; do
  tree=examples/amp-trainer
  [ "$version" = v7-fixed ] && tree="$work/v7-fixed"
  start=$(date +%s)
  timeout 300 traingate run "$tree" --task T035 --version "$version" --device cuda --out "$work/example-$version" \
    >"$out/example-$version.log" 2>&1
  echo "example $version: exit $? in $(( $(date +%s) - start )) s" | tee -a "$out/summary.txt"
done
timeout 400 python3 -m pytest -q -p no:randomly -p no:benchmark -p no:cacheprovider -n 4 --basetemp="$work/pytest" -rs --durations=10 \
  tests/e2e/test_cuda_paths.py tests/stages/test_cuda_found_units.py tests/stages/concurrency/test_payloads.py tests/pipeline/gate/test_torch_probe.py \
  "tests/e2e/test_example_variants.py::test_example_suite_results" >"$out/pytest.log" 2>&1
echo "pytest: exit $?" | tee -a "$out/summary.txt"
tail -15 "$out/pytest.log"
# The reports, without the children's work folders.
(cd "$work" && find . -path ./pytest -prune -o \( -name "*.json" -o -name "*.md" \) -print; \
  find pytest -maxdepth 3 -path "*gate-*" \( -name "*.json" -o -name "*.md" \)) 2>/dev/null \
  | (cd "$work" && tar czf "$out/reports.tgz" -T -)
