#!/usr/bin/env bash
# shellcheck disable=SC2317  # the stage_* functions are called by name
# tools/gpu_session.sh STAGE...   STAGE: check | tests | bench | experiment | block | transformer | attention | transformer-full | study
#
# Runs on a lent GPU machine, from the repository root, with the bundle of
# tools/gpu_bundle.sh carried (".gpu"); nothing is built there. Every stage
# writes under ${OUT:-/tmp/out}, which the device tool brings back (at most 8
# files, so each stage leaves one tarball):
#   session.txt             this console output, whole
#   gpu-tests.tar.gz        gpu-tests/: per test binary a Catch2 console log
#   gpu-bench.tar.gz        gpu-bench/: bench/gpu_vs_torch.sh's files
#   gpu-experiment.tar.gz   gpu-experiment/: HDF5 logs, resolved configs, logs
#   gpu-block.tar.gz        gpu-block/: the same for the block-scaled arms
#   gpu-transformer.tar.gz  gpu-transformer/: the same for the ViT and the GPT
# Stages:
#   check       only the preamble: GPU, driver, bundle, library resolution
#   tests       every test case of the three device test binaries, one process
#               each as CTest runs them (a case skips with exit 77)
#   bench       bench/gpu_vs_torch.sh on the bundle's build tree; MPSIM_BENCH_ARGS
#               go to bench_gpu (e.g. --quick)
#   experiment  mpsim run: the default experiment on the cuda backend and the
#               emulator_vs_gpu study, each --smoke first, then full size
#               (MPSIM_GPU_SIZE=smoke stops after the smoke runs)
#   block       the emulator_vs_gpu study with the mxfp8, nvfp4 and fp8-current arms
#               (MPSIM_BLOCK_EPOCHS, default 2), and deepseek-fp8 on cuda (smoke; on a
#               device that is not compute capability 9.x it must be refused, exit 2,
#               before any work)
#   attention   the attention_overflow study at full size on cuda alone
#               (MPSIM_ATTENTION_SEEDS, default [1])
#   transformer-full  charlm.toml and vit.toml at full size on cuda alone
#   study       MPSIM_STUDY's config on cuda alone (MPSIM_STUDY_ARGS: overrides)
#   transformer the ViT and the character-level GPT (issue 20) at smoke size on the
#               emulator and the cuda backend side by side (kernels_attention.cu)
# All stages of one call share MPSIM_GPU_BUDGET_S seconds (default 540, under
# the tool's 600 s per command); a run that would overstep is stopped by
# `timeout` and reported, so the summary and tarballs are always written.
# Exit status: 0 done, 77 no usable CUDA device (nothing measured), 1 a failure.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
bundle=${MPSIM_GPU_BUNDLE:-$root/.gpu}
unpacked=${MPSIM_GPU_ROOT:-/tmp/mpsim-gpu}   # outside the repo: never carried back
out=${OUT:-/tmp/out}
budget=${MPSIM_GPU_BUDGET_S:-540}
start=$(date +%s)
deadline=$((start + budget))

usage() { sed -n 3,33p "$0" | sed 's/^# \{0,1\}//'; exit 2; }
[ $# -ge 1 ] || usage
for s in "$@"; do
  case $s in check|tests|bench|experiment|block|transformer|attention|transformer-full|study) ;; -h|--help) usage ;; *) echo "unknown stage '$s'" >&2; usage ;; esac
done
mkdir -p "$out"
work=$(mktemp -d /tmp/gpu_session.XXXXXX)

left() { echo $((deadline - $(date +%s))); }
summary=()     # the table printed last (only the output's end comes back)
results=()     # per stage: ok | skip | fail
add_row() { summary+=("$(printf '%-30s %-6s %6s  %s' "$@")"); }

# --- preamble: what ran where, then make the bundle runnable ----------------
preamble() {
  echo "== date:    $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  local smi
  smi=$(nvidia-smi --query-gpu=name,driver_version,memory.total,compute_cap,clocks.max.sm,power.limit \
          --format=csv,noheader 2>/dev/null | head -1 || true)
  echo "== gpu:     ${smi:-nvidia-smi not available}"
  echo "== driver:  $(nvidia-smi --query-gpu=driver_version --format=csv,noheader 2>/dev/null | head -1 ||
                      echo none)$(nvidia-smi 2>/dev/null | grep -o 'CUDA Version: [0-9.]*' | sed 's/^/, /' || true)"
  echo "== host:    $(hostname), $(nproc) cores, kernel $(uname -r), $(getconf GNU_LIBC_VERSION)"
  # The CPU model: the cpu.* arms run here too, and must give this machine's bits on any CPU.
  echo "== cpu:     $(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo 2>/dev/null | head -1)$(grep -qw avx512f /proc/cpuinfo 2>/dev/null && echo ', AVX-512' || true)"
  [ -f "$bundle/MANIFEST.txt" ] || { echo "no bundle at $bundle: run tools/gpu_bundle.sh here first and carry .gpu" >&2; exit 1; }
  sed -n 's/^/== bundle:  /; 2,5p' "$bundle/MANIFEST.txt"

  # Unpack once per bundle (a warm machine keeps /tmp between calls).
  local sum
  sum=$(sha256sum "$bundle/bundle.tar.xz" | cut -d' ' -f1)
  if [ "$(cat "$unpacked/.sha256" 2>/dev/null)" != "$sum" ]; then
    rm -rf "$unpacked"; mkdir -p "$unpacked"
    local ok=1
    if command -v xz >/dev/null; then
      xz -dc "$bundle/bundle.tar.xz" | tar -C "$unpacked" -xf - || ok=0
    else   # no xz binary: Python's tarfile reads xz too
      python3 -c 'import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2])' \
        "$bundle/bundle.tar.xz" "$unpacked" || ok=0
    fi
    [ "$ok" = 1 ] || { echo "could not unpack $bundle/bundle.tar.xz into $unpacked" >&2; exit 1; }
    echo "$sum" > "$unpacked/.sha256"
  fi
  build=$unpacked/build
  [ -x "$build/experiments/mpsim" ] || { echo "$unpacked holds no build/experiments/mpsim" >&2; exit 1; }

  # Library path: the bundle's, then the device's CUDA libraries wherever they
  # are (the toolkit's, else PyTorch's pip wheels), then libstdc++/libgcc_s
  # from the bundle only if the device's are too old.
  orig_ld=${LD_LIBRARY_PATH:-}
  local ld=$unpacked/lib missing
  missing=$(unresolved "$ld${orig_ld:+:$orig_ld}")
  if grep -q 'libcu' <<< "$missing"; then
    local d lib found
    for lib in libcudart.so.13 libcublas.so.13 libcublasLt.so.13; do
      grep -qF "$lib" <<< "$missing" || continue
      found=""
      for d in "${CUDA_HOME:-/usr/local/cuda}/lib64" /usr/local/cuda/lib64 /usr/local/cuda/lib \
               /usr/local/cuda/targets/x86_64-linux/lib; do
        [ -e "$d/$lib" ] && { found=$d; break; }
      done
      if [ -z "$found" ]; then   # PyTorch's nvidia-* wheels, else anywhere likely
        local dirs
        read -r -a dirs <<< "$(python3 -c 'import nvidia; print(*nvidia.__path__)' 2>/dev/null || true)"
        found=$(find "${dirs[@]}" /usr/local /opt /usr/lib -name "$lib" -print -quit 2>/dev/null || true)
        found=${found%/*}
      fi
      [ -n "$found" ] && [[ ":$ld:" != *":$found:"* ]] && ld=$ld:$found
    done
  fi
  missing=$(unresolved "$ld${orig_ld:+:$orig_ld}")
  if grep -q 'GLIBCXX\|GCC_\|CXXABI' <<< "$missing"; then ld=$unpacked/fallback:$ld; fi
  missing=$(unresolved "$ld${orig_ld:+:$orig_ld}")
  export LD_LIBRARY_PATH=$ld${orig_ld:+:$orig_ld}
  echo "== libs:    LD_LIBRARY_PATH=$LD_LIBRARY_PATH"
  if [ -n "$missing" ]; then
    echo "unresolved libraries (ldd):"; sed 's/^/  /' <<< "$missing"
    echo "the bundle cannot run here: see docs/gpu-session.md" >&2
    exit 1
  fi
  echo "== libs:    every executable's libraries resolve; cuBLAS: $(ldd "$build/experiments/mpsim" |
                    awk '$1 == "libcublas.so.13" { print $3 }')"

  # PyTorch's python must not see the bundle's libraries (its own libgomp, ...).
  mkdir -p "$work/bin"
  local py
  py=$(command -v "${MPSIM_TORCH_PYTHON:-python3}" || echo python3)
  if [ -n "$orig_ld" ]; then
    printf '#!/usr/bin/env bash\nexport LD_LIBRARY_PATH=%q\nexec %q "$@"\n' "$orig_ld" "$py" > "$work/bin/python3"
  else
    printf '#!/usr/bin/env bash\nunset LD_LIBRARY_PATH\nexec %q "$@"\n' "$py" > "$work/bin/python3"
  fi
  chmod +x "$work/bin/python3"
}

# ldd's complaints for every bundled executable under library path $1.
unresolved() {
  local b
  for b in "$build"/tests/gpu/* "$build"/bench/* "$build"/experiments/*; do
    [ -f "$b" ] || continue
    LD_LIBRARY_PATH=$1 ldd "$b" 2>&1 | grep -E 'not found' | sed "s|^|$(basename "$b"): |" || true
  done | sort -u
}

# Pack a stage's folder into $OUT at once, so a later stage's overrun keeps it.
pack() {
  tar -C "$work" -czf "$out/$1.tar.gz" "$1"
  # The device tool returns files of at most 16 MiB.
  [ "$(stat -c %s "$out/$1.tar.gz")" -le $((16 * 1024 * 1024)) ] ||
    echo "warning: $1.tar.gz is over 16 MiB and will not come back; rerun the stage alone with less output" >&2
}

# --- tests -----------------------------------------------------------------
stage_tests() {
  local dir=$work/gpu-tests name bin log c rc pass fail skip notrun t0 any_run=0 failed=()
  mkdir -p "$dir/fp8-dumps"
  # The FP8 tensor-core check writes each device result there, for models compared off the device.
  export MPSIM_TC_DUMP=$dir/fp8-dumps
  # MPSIM_GPU_TESTS: which test binaries (all three by default).
  for name in ${MPSIM_GPU_TESTS:-test_gpu_device test_gpu_backend_ops test_gpu_tensor_core_check}; do
    bin=$build/tests/gpu/$name
    if [ ! -x "$bin" ]; then add_row "  $name" "absent" "" "not in the bundle"; continue; fi
    log=$dir/$name.log
    pass=0 fail=0 skip=0 notrun=0 t0=$(date +%s)
    local cases=()
    mapfile -t cases < <("$bin" --list-test-names-only | sed '/^$/d')
    echo "== tests: $name, ${#cases[@]} test cases"
    if [ ${#cases[@]} -eq 0 ]; then
      add_row "  $name" "" "" "could not list its test cases"; failed+=("$name: --list-test-names-only"); continue
    fi
    for c in "${cases[@]}"; do
      if [ "$(left)" -lt 15 ]; then notrun=$((notrun + 1)); continue; fi
      echo "=== $c" >> "$log"
      rc=0
      # A comma separates Catch2 test specs: escape it, as catch_discover_tests does.
      # A hung case may take ${MPSIM_TEST_TIMEOUT_S:-300} s, never the whole budget.
      timeout -k 5 "$(( $(left) < ${MPSIM_TEST_TIMEOUT_S:-300} ? $(left) : ${MPSIM_TEST_TIMEOUT_S:-300} ))" \
        "$bin" "${c//,/\\,}" --durations yes > "$dir/case.txt" 2>&1 || rc=$?
      # Catch2 exits 0 when the name matched nothing: that is no pass.
      [ "$rc" = 0 ] && grep -q '^No test cases matched' "$dir/case.txt" && rc=1
      cat "$dir/case.txt" >> "$log"
      echo "=== exit $rc" >> "$log"
      case $rc in
        0) pass=$((pass + 1)) ;;
        77) skip=$((skip + 1)) ;;
        *) fail=$((fail + 1)); failed+=("$name: $c (exit $rc$( [ "$rc" -ge 124 ] && echo ', timed out'))") ;;
      esac
    done
    [ $((pass + fail)) -gt 0 ] && any_run=1
    add_row "  $name" "" "$(( $(date +%s) - t0 )) s" \
      "$pass passed, $fail failed, $skip skipped$( [ "$notrun" -gt 0 ] && echo ", $notrun not run (budget)")"
    [ "$skip" -gt 0 ] && grep -m1 '^SKIPPED' "$log" | sed "s/^/   $name: /"
  done
  rm -f "$dir/case.txt"
  if [ ${#failed[@]} -gt 0 ]; then
    echo "== tests: failed cases (logs in gpu-tests/):"; printf '  %s\n' "${failed[@]}"
    return 1
  fi
  [ "$any_run" = 1 ] || return 77
}

# --- bench -----------------------------------------------------------------
stage_bench() {
  local dir=$work/gpu-bench rc=0
  mkdir -p "$dir"
  # bench/gpu_vs_torch.sh takes a BUILD_DIR: the bundle mirrors the build tree.
  # shellcheck disable=SC2086  # MPSIM_BENCH_ARGS is a list of options
  MPSIM_TORCH_PYTHON=$work/bin/python3 timeout -k 10 "$(left)" \
    bash bench/gpu_vs_torch.sh "$build" "$dir" ${MPSIM_BENCH_ARGS:-} || rc=$?
  case $rc in
    0) add_row "  bench_gpu" "" "" "$(grep -c '^- ' "$dir/gpu_vs_torch.md" 2>/dev/null || echo 0) bars;$(
         [ -f "$dir/torch_gpu.json" ] && echo ' PyTorch ran' || echo ' PyTorch skipped')" ;;
    77) add_row "  bench_gpu" "" "" "no CUDA device: nothing measured"; return 77 ;;
    124|137) add_row "  bench_gpu" "" "" "stopped at the time budget"; return 1 ;;
    *) add_row "  bench_gpu" "" "" "failed, exit $rc"; return 1 ;;
  esac
}

# --- experiment ------------------------------------------------------------
# One mpsim run: NAME CONFIG [overrides...]; the summary table to the console.
mpsim_run() {
  local name=$1 config=$2 rc=0 t0
  t0=$(date +%s)
  shift 2
  if [ "$(left)" -lt 30 ]; then add_row "  $name" "" "" "not run (budget)"; return 1; fi
  echo "== experiment: mpsim run $config $*"
  local dir=$work/gpu-${run_stage:-experiment}
  timeout -k 10 "$(left)" "$build/experiments/mpsim" run "$config" -o "$dir/$name.h5" --force \
    "data.path=$data" "$@" > "$dir/$name.txt" 2> "$dir/$name.err" || rc=$?
  cat "$dir/$name.txt"
  local wall=$(( $(date +%s) - t0 ))
  if [ "$rc" -eq 0 ]; then
    add_row "  $name" "" "$wall s" "$(grep -c ' completed$' "$dir/$name.txt") arms completed"
  elif [ "$rc" -eq 2 ] && grep -q "backend 'cuda' cannot start" "$dir/$name.err"; then
    tail -1 "$dir/$name.err"
    add_row "  $name" "" "$wall s" "no CUDA device: not run"; return 77
  else
    tail -5 "$dir/$name.err"
    add_row "  $name" "" "$wall s" "$( [ "$rc" -ge 124 ] && echo 'stopped at the time budget' || echo "failed, exit $rc")"
    return 1
  fi
}

stage_experiment() {
  mkdir -p "$work/gpu-experiment"
  data=${MPSIM_DATA_DIR:-$bundle/data/fashion-mnist}
  [ -f "$data/train-images-idx3-ubyte.gz" ] || { echo "no Fashion-MNIST in $data (bundle made with MPSIM_BUNDLE_DATA=0?)" >&2; return 1; }
  # The configs travel with the tree when tracked; gpu_bundle.sh copies them otherwise.
  local default=experiments/configs/default.toml study=experiments/configs/emulator_vs_gpu.toml rc=0
  [ -f "$bundle/configs/default.toml" ] && default=$bundle/configs/default.toml
  [ -f "$bundle/configs/emulator_vs_gpu.toml" ] && study=$bundle/configs/emulator_vs_gpu.toml
  # Smoke runs first (seconds): they prove the whole path before the long ones.
  mpsim_run default_cuda_smoke "$default" --smoke backends=cuda || rc=$?
  [ "$rc" -eq 77 ] && return 77
  mpsim_run emulator_vs_gpu_smoke "$study" --smoke || rc=$?
  if [ "${MPSIM_GPU_SIZE:-full}" != smoke ]; then
    # The default experiment: four policies, 8 epochs, on the GPU only.
    mpsim_run default_cuda "$default" backends=cuda || rc=$?
    # Study f: the same arms on the emulator (all cores) and on the GPU.
    mpsim_run emulator_vs_gpu "$study" || rc=$?
  fi
  return "$rc"
}

# --- block -----------------------------------------------------------------
# Block-scaled arms (issue 19 §7) on the emulator and on the cuda backend,
# whose block GEMMs run in block_quantize.cu's kernels; and a preset the
# kernels do not cover (DeepSeek-V3's tiles), which must be refused before work.
stage_block() {
  run_stage=block
  mkdir -p "$work/gpu-block"
  data=${MPSIM_DATA_DIR:-$bundle/data/fashion-mnist}
  [ -f "$data/train-images-idx3-ubyte.gz" ] || { echo "no Fashion-MNIST in $data" >&2; return 1; }
  local study=experiments/configs/emulator_vs_gpu.toml rc=0 refused=0
  [ -f "$bundle/configs/emulator_vs_gpu.toml" ] && study=$bundle/configs/emulator_vs_gpu.toml
  mpsim_run block_vs_gpu_smoke "$study" --smoke 'arms=["mxfp8","nvfp4","fp8-current"]' || rc=$?
  [ "$rc" -eq 77 ] && return 77
  if [ "${MPSIM_GPU_SIZE:-full}" != smoke ]; then
    mpsim_run block_vs_gpu "$study" 'arms=["mxfp8","nvfp4","fp8-current"]' "train.epochs=${MPSIM_BLOCK_EPOCHS:-2}" || rc=$?
  fi
  # DeepSeek-V3's tiles: on an H100/H200 the partials are the tensor cores' own (cuBLASLt FP8, fast
  # accumulation), promoted as the emulator does; elsewhere refused before any work (exit 2).
  local cc
  cc=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -1)
  # Per-tensor FP8 through the same tensor cores (fp8-current with gemm = "h100") likewise.
  if [ "${cc%%.*}" = 9 ]; then
    mpsim_run block_deepseek_smoke "$study" --smoke 'arms=["deepseek-fp8","fp8-current-h100"]' || rc=$?
  else
    echo "== block: deepseek-fp8 on cuda must be refused before any work (exit 2) on compute capability $cc"
    "$build/experiments/mpsim" run "$study" --smoke 'arms=["deepseek-fp8"]' 'backends=["cuda"]' "data.path=$data" \
      -o "$work/gpu-block/refused.h5" --force > "$work/gpu-block/refused.txt" 2>&1 || refused=$?
    cat "$work/gpu-block/refused.txt"
    if [ "$refused" -eq 2 ] && grep -q "cannot run on the cuda backend" "$work/gpu-block/refused.txt" &&
       [ ! -e "$work/gpu-block/refused.h5" ]; then
      add_row "  deepseek-fp8 refused" "" "" "exit 2 before work, as expected"
    else
      add_row "  deepseek-fp8 refused" "" "" "NOT refused as expected (exit $refused)"; rc=1
    fi
  fi
  # Blackwell's block-scaled tensor cores against the b200 model (mxfp8-b200, nvfp4-b200): on sm_100 only.
  if [ "${cc%%.*}" = 10 ]; then
    mpsim_run block_b200_smoke "$study" --smoke 'arms=["mxfp8-b200","nvfp4-b200"]' || rc=$?
  fi
  run_stage=
  return "$rc"
}

# --- transformer -----------------------------------------------------------
# The ViT on Fashion-MNIST and the GPT on the bundle's copy of the fortunes
# text (the device has no Debian packages), each at smoke size on the CPU
# emulator and on the cuda backend: the first run of the transformer kernels;
# then the GPT on cuda with train.attention = "cublas", and the GPT with
# model.fused_attention on both backends.
stage_transformer() {
  run_stage=transformer
  mkdir -p "$work/gpu-transformer"
  local rc=0 fashion=${MPSIM_DATA_DIR:-$bundle/data/fashion-mnist} text=${MPSIM_TEXT_DIR:-$bundle/data/fortunes}
  data=$fashion
  mpsim_run vit_vs_gpu_smoke experiments/configs/vit.toml --smoke 'backends=["cpu","cuda"]' || rc=$?
  [ "$rc" -eq 77 ] && return 77
  if [ -d "$text" ]; then
    data=$text
    mpsim_run charlm_vs_gpu_smoke experiments/configs/charlm.toml --smoke 'backends=["cpu","cuda"]' || rc=$?
    # The same GPT on cuda with attention's products in batched cuBLAS GEMMs (train.attention), whose
    # log and time compare with the cuda arm above (the kernels, the CPU's sums).
    mpsim_run charlm_cublas_attention_smoke experiments/configs/charlm.toml --smoke 'backends=["cuda"]' \
      train.attention=cublas || rc=$?
    # FlashAttention-2's fused path (model.fused_attention) on the CPU and on cuda side by side: the first run
    # of the fused kernels in training.
    mpsim_run charlm_fused_vs_gpu_smoke experiments/configs/charlm.toml --smoke 'backends=["cpu","cuda"]' \
      model.fused_attention=true || rc=$?
  else
    add_row "  charlm_vs_gpu_smoke" "" "" "not run: no text in $text"; rc=1
  fi
  run_stage=
  return "$rc"
}

# --- attention -------------------------------------------------------------
# The attention_overflow study (issue 20 section 5) at full size on the cuda
# backend alone: 300 steps of the GPT at lr 0.3, fp32 and fp16-mixed, each
# plain and with QK-LayerNorm. Its CPU log is compared with this one here.
stage_attention() {
  run_stage=attention
  mkdir -p "$work/gpu-attention"
  local rc=0 text=${MPSIM_TEXT_DIR:-$bundle/data/fortunes}
  [ -d "$text" ] || { add_row "  attention_overflow_cuda" "" "" "not run: no text in $text"; return 1; }
  data=$text
  mpsim_run attention_overflow_cuda experiments/configs/attention_overflow.toml 'backends=["cuda"]' \
    "seeds=${MPSIM_ATTENTION_SEEDS:-[1]}" --jobs 4 || rc=$?
  run_stage=
  return "$rc"
}

# --- transformer-full ------------------------------------------------------
# The GPT (charlm.toml, 400 steps) and the ViT (vit.toml, 3 epochs) at full
# size on the cuda backend alone, every arm at once; their CPU logs are here.
stage_transformer-full() {
  run_stage=transformer-full
  mkdir -p "$work/gpu-transformer-full"
  local rc=0 fashion=${MPSIM_DATA_DIR:-$bundle/data/fashion-mnist} text=${MPSIM_TEXT_DIR:-$bundle/data/fortunes}
  data=$text
  # shellcheck disable=SC2086 # MPSIM_CHARLM_ARGS: more overrides, e.g. train.max_steps=3000
  mpsim_run charlm_cuda experiments/configs/charlm.toml 'backends=["cuda"]' ${MPSIM_CHARLM_ARGS:-} --jobs 4 || rc=$?
  [ -n "${MPSIM_CHARLM_ONLY:-}" ] && { run_stage=; return "$rc"; }
  data=$fashion
  mpsim_run vit_cuda experiments/configs/vit.toml 'backends=["cuda"]' --jobs 4 || rc=$?
  run_stage=
  return "$rc"
}

# --- study ------------------------------------------------------------------
# Any study config on the cuda backend alone: MPSIM_STUDY (a config name under
# experiments/configs, e.g. transformer_precision), MPSIM_STUDY_ARGS (more
# overrides, e.g. seeds=[1,2,3]); fortunes for a GPT, Fashion-MNIST otherwise.
stage_study() {
  run_stage=study
  mkdir -p "$work/gpu-study"
  local rc=0 name=${MPSIM_STUDY:-} config
  config=experiments/configs/$name.toml
  [ -n "$name" ] || { add_row "  study" "" "" "not run: MPSIM_STUDY names no config"; run_stage=; return 1; }
  [ -f "$config" ] || { add_row "  $name" "" "" "not run: no $config"; run_stage=; return 1; }
  if grep -q 'dataset = "fortunes"' "$config"; then data=${MPSIM_TEXT_DIR:-$bundle/data/fortunes}
  else data=${MPSIM_DATA_DIR:-$bundle/data/fashion-mnist}; fi
  # shellcheck disable=SC2086 # MPSIM_STUDY_ARGS is a list of overrides
  mpsim_run "${name}_cuda" "$config" 'backends=["cuda"]' ${MPSIM_STUDY_ARGS:-} --jobs 4 || rc=$?
  run_stage=
  return "$rc"
}

# --- main ------------------------------------------------------------------
# main runs on the left of `||`, where bash ignores errexit: every step that
# matters checks its own status (stages return 0, 77 or 1).
main() {
  preamble
  local s rc
  for s in "$@"; do
    [ "$s" = check ] && { results+=(ok); add_row check ok "" "libraries resolve"; continue; }
    echo
    echo "== stage $s (budget left $(left) s)"
    local t0 n=${#summary[@]}
    t0=$(date +%s)
    rc=0
    "stage_$s" || rc=$?
    pack "gpu-$s"
    local result=ok
    case $rc in 0) ;; 77) result=skip ;; *) result=fail ;; esac
    results+=("$result")
    # The stage's own row goes above its detail rows.
    summary=("${summary[@]:0:$n}" "$(printf '%-30s %-6s %6s  %s' "$s" "$result" "$(( $(date +%s) - t0 )) s" "-> \$OUT/gpu-$s.tar.gz")" "${summary[@]:$n}")
  done
  echo
  echo "== summary: $(sed -n 's/^revision: *//p' "$bundle/MANIFEST.txt"); $(nvidia-smi --query-gpu=name,driver_version \
        --format=csv,noheader 2>/dev/null | head -1 || echo 'no GPU'); $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  printf '%-30s %-6s %6s  %s\n' stage result wall detail
  printf '%s\n' "${summary[@]}"
  echo "files: $(cd "$out" && ls | tr '\n' ' ')"
  # Any failure: 1; else any stage skipped for want of a device: 77; else 0.
  [[ " ${results[*]} " == *" fail "* ]] && return 1
  [[ " ${results[*]} " == *" skip "* ]] && return 77
  return 0
}

set -o pipefail
rc=0
main "$@" 2>&1 | tee "$out/session.txt" || rc=$?
rm -rf "$work"
exit "$rc"
