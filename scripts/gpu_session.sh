#!/usr/bin/env bash
# The GPU checks of issue 41, as one prepared script for a lent GPU machine (docs/gpu.md).
#
# On the GPU machine, from the checkout's root, after ../shared/gpu/pack.sh's parts were carried into
# /tmp/gpu-parts:   . /tmp/gpu-parts/unpack.sh && bash scripts/gpu_session.sh "$OUT" [quick|full]
#
# profile: bench_gpu at batch 32 and 256 (xform's default, captured, against transformers fp16) and
# scripts/profile_decode.py on CUDA (about 4 minutes).
# variants: issue 57's fused (--fuse) and weight-only (--weights) exports and the captured reorder: their CUDA
# tests, `run --device cuda --check` of each on the demo, and bench_gpu's Marian-base grid for each against the
# captured default, ONNX Runtime's BeamSearch operator (scripts/ort_beamsearch.py) and transformers fp16.
# step: the device tests (the captured step among them), scripts/bench_gpu.py for xform with and without
# capture against transformers fp16 at batch 1, 16, 64, and scripts/bench_cuda_step.py (about 9 minutes).
# quick: the ONNX Runtime CUDA tests (the device tests on the real provider, DeviceCache on CUDA memory)
# and `xform run --device cuda --check` on the demo in fp32 and fp16, greedy and beam 4; full also runs
# scripts/bench_gpu.py (Marian-base, batch 1 to 256, greedy and beam 4: about 6 minutes on an H100).
# Every log goes to OUT; the exit status is the first failure's.
set -u
OUT=${1:?usage: gpu_session.sh OUT [profile|step|variants|quick|full]}; MODE=${2:-quick}
mkdir -p "$OUT"; status=0
step() { local name=$1; shift; echo "== $name: $*" | tee -a "$OUT/summary.txt"
         "$@" >"$OUT/$name.log" 2>&1; local rc=$?; echo "   exit $rc" | tee -a "$OUT/summary.txt"
         tail -n 25 "$OUT/$name.log"; [ $rc -eq 0 ] || [ $status -ne 0 ] || status=$rc; }
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > "$OUT/gpu.txt" 2>&1
python3 -c 'import onnxruntime as o, torch; print("onnxruntime", o.__version__, o.get_available_providers(), "torch", torch.__version__)' >> "$OUT/gpu.txt" 2>&1
cat "$OUT/gpu.txt"
W=/tmp/xform-gpu; mkdir -p "$W"
if [ "$MODE" = profile ]; then  # the captured default: the grid's missing rows, and where a step's time goes
  step bench_gpu timeout 150 python3 scripts/bench_gpu.py --work "$W" --out "$W/out" --iters 2 --batches 32,256 \
       --engines "xform fp32,xform fp16,transformers fp16"
  cp "$W/out/bench_gpu.json" "$OUT/" 2>/dev/null
  B=$W/bundles-marian-base
  step profile timeout 70 bash -c "for p in fp32 fp16; do for b in 1 64; do python3 scripts/profile_decode.py \
       $B/xform-\$p --device cuda --batch \$b --beams 1 --iters 2; done; done; python3 scripts/profile_decode.py \
       $B/xform-fp16 --device cuda --batch 32 --beams 4 --iters 2; python3 scripts/profile_decode.py \
       $B/xform-fp16 --device cuda --batch 1 --beams 1 --iters 2 --no-cuda-graph"
  exit $status
fi
if [ "$MODE" = variants ]; then  # issue 57 items 2 and 3: the fused and weight-only exports on CUDA (about 8 minutes)
  step pytest timeout 120 python3 -m pytest -q -p no:cacheprovider tests/exporter/test_weights.py \
       tests/exporter/test_fused_bundle.py tests/runtime/test_cuda_graphs.py -k "cuda or gpu" -rs
  for v in "--fuse attention,qkv,skip_layer_norm" "--fuse cross_attention,skip_layer_norm" "--weights int4" \
           "--weights int8"; do
    name=$(echo "$v" | tr -c 'a-z0-9\n' '_')
    step "export$name" python3 -m xform export demo -o "$W/v$name" --precision fp16 $v --force
    step "check$name" python3 -m xform run "$W/v$name" --device cuda --check --text 01234567 --text 7654 --text 40512
    step "check$name-beam4" python3 -m xform run "$W/v$name" --device cuda --check --num-beams 4 --text 01234567
  done
  step bench_gpu timeout 380 python3 scripts/bench_gpu.py --work "$W" --out "$W/out" --iters 1 --batches 1,64,256 \
       --engines "xform-graph fp16,xform-graph-reorder fp16,xform-graph fp16-fused,xform-graph fp16-int4,ort-beamsearch fp16,transformers fp16"
  cp "$W/out/bench_gpu.json" "$OUT/" 2>/dev/null
  exit $status
fi
if [ "$MODE" = step ]; then  # issue 41 item 4: the captured step, verified and measured; 7 files to OUT
  step pytest timeout 150 python3 -m pytest -q -p no:cacheprovider tests/runtime/test_ort_device.py \
       tests/runtime/test_cuda_graphs.py tests/runtime/test_cache.py -rs
  step bench_gpu timeout 300 python3 scripts/bench_gpu.py --work "$W" --out "$W/out" --iters 2 --batches 1,16,64 \
       --engines "xform fp32,xform-graph fp32,xform-graph-cand fp32,xform fp16,xform-graph fp16,xform-graph-cand fp16,transformers fp16"
  cp "$W/out/bench_gpu.json" "$OUT/" 2>/dev/null
  if [ -n "${CUDA_STEP:-}" ]; then
    step cuda_step timeout 170 python3 scripts/bench_cuda_step.py --work "$W" --out "$W/out" --steps 60
    cp "$W/out/bench_cuda_step.json" "$OUT/" 2>/dev/null
  fi
  exit $status
fi
step pytest python3 -m pytest -q -p no:cacheprovider tests/runtime/test_ort_device.py tests/runtime/test_cache.py -rs
W=/tmp/xform-gpu; mkdir -p "$W"
step export python3 -m xform export demo -o "$W/d32" --force
step export16 python3 -m xform export demo -o "$W/d16" --precision fp16 --force
for b in d32 d16; do
  step "check-$b" python3 -m xform run "$W/$b" --device cuda --check --text 01234567 --text 7654 --text 40512
  step "check-$b-beam4" python3 -m xform run "$W/$b" --device cuda --check --num-beams 4 --text 01234567 --text 7654
done
step check-tf32 python3 -m xform run "$W/d32" --device cuda --allow-tf32 --check --text 01234567 --text 7654
if [ "$MODE" = full ]; then
  step bench python3 scripts/bench_gpu.py --work "$W" --out "$OUT" --iters 3
fi
exit $status
