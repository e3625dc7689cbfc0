#!/usr/bin/env bash
# cuda_backend.sh MPSIM CONFIG WORK_DIR MODE
#   MODE no-device: without a usable CUDA device, `backends = ["cpu", "cuda"]`
#     must stop before training with exit 2 and say why (Skipped when a
#     device is present: the other mode covers it).
#   MODE side-by-side: with a device, a short synthetic run on both backends
#     must complete and print the agreement table (Skipped without a device).
set -uo pipefail
mpsim=$1 config=$2 work=$3 mode=$4
mkdir -p "$work"
out=$("$mpsim" run "$config" 'backends=["cpu","cuda"]' data.dataset=synthetic data.synthetic_train=1024 \
  data.synthetic_test=256 train.epochs=1 'arms=["fp16-mixed"]' -o "$work/$mode.h5" --force 2>&1)
code=$?
printf '%s\n' "$out"
no_device=0
if [ $code -eq 2 ] && grep -Eq "backend 'cuda' (cannot start: .*no CUDA device|is not available in this build)" <<<"$out"; then
  no_device=1
fi
case $mode in
  no-device)
    if [ $no_device -eq 0 ] && [ $code -eq 0 ]; then echo "SKIP: a CUDA device is present"; exit 77; fi
    [ $no_device -eq 1 ] || { echo "FAIL: expected exit 2 naming why the cuda backend cannot start (got $code)"; exit 1; }
    [ ! -e "$work/$mode.h5" ] || { echo "FAIL: a log was written although nothing ran"; exit 1; }
    echo "ok" ;;
  side-by-side)
    [ $no_device -eq 0 ] || { echo "SKIP: no CUDA device"; exit 77; }
    [ $code -eq 0 ] || { echo "FAIL: exit $code"; exit 1; }
    grep -Eq "^cuda\.fp16-mixed +cpu\.fp16-mixed " <<<"$out" || { echo "FAIL: no agreement row"; exit 1; }
    echo "ok" ;;
esac
