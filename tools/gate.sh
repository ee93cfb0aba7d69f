#!/usr/bin/env bash
# The gate a change to kernels/ or tests/ passes before it is called done (CI has no GPU and cannot
# see a break that only a GPU shows): on a GPU machine, `make test` natively, then a smoke
# `make report` end to end (the smoke grid's bench, then the render of that folder). Where the GPU
# machine has no Quarto, the render is left to one that has: the line to run there is printed.
# Each step's result and wall time, the commit and the device go to <out>/gate.txt.
#   usage: tools/gate.sh [out]   (make gate; PYTHON=... and JOBS=... pass through to make)
set -uo pipefail
cd "$(dirname "$0")/.."
out=${1:-results/runs/gate-$(date -u +%Y%m%dT%H%M%SZ)}
mkdir -p "$out"
record="$out/gate.txt"
py=${PYTHON:-python3}
commit=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
dirty=$(git status --porcelain --untracked-files=no 2>/dev/null | grep -q . && echo " (dirty tree)")
gpu=$($py -c "import torch; print(torch.cuda.get_device_name() if torch.cuda.is_available() else '')" 2>/dev/null)
if [ -z "$gpu" ]; then
  echo "gate: no CUDA GPU seen by $py: the gate runs on a GPU machine (CI runs the interpreter)"
  exit 2
fi
# The files under test, hashed: names the tree where git's record of it is stale (a copied tree).
tree=$(find kernels tests tools -name '*.py' -o -name '*.sh' | LC_ALL=C sort | xargs cat | sha256sum | cut -c1-12)
{ echo "gate: $(date -u +%Y-%m-%dT%H:%M:%SZ), commit $commit$dirty, tree $tree, $gpu"
  $py -c "import torch, triton; print(f'torch {torch.__version__}, triton {triton.__version__}')"
} | tee "$record"

status=0
step() {  # step NAME COMMAND...: runs it, records PASS/FAIL and its seconds
  local name=$1; shift
  local t0=$SECONDS
  "$@"
  local rc=$?
  local verdict=PASS; [ $rc -eq 0 ] || { verdict="FAIL (exit $rc)"; status=1; }
  echo "gate: $name: $verdict, $((SECONDS - t0)) s" | tee -a "$record"
  return $rc
}

step "make test (native)" make --no-print-directory test &&
step "make bench GRID=smoke" make --no-print-directory bench GRID=smoke BENCH_OUT="$out"
if [ $status -eq 0 ]; then
  if command -v quarto >/dev/null; then
    step "make render" make --no-print-directory render RESULTS="$out"
  else
    echo "gate: make render: not run here (no Quarto on the PATH); on a machine with Quarto:" \
         "make render RESULTS=$out" | tee -a "$record"
  fi
fi
echo "gate: $([ $status -eq 0 ] && echo passed || echo FAILED) ($out)" | tee -a "$record"
exit $status
