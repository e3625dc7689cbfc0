#!/usr/bin/env bash
# tools/gpu_bundle.sh [BUILD_DIR] [BUNDLE_DIR]   (defaults: build/default .gpu)
#
# Packs what a lent GPU machine needs to run mpsim's GPU work without building:
# the device tests, bench_gpu and the mpsim program (debug info stripped), the
# shared libraries they load that the device image lacks, and the Fashion-MNIST
# files. The device machine has CUDA, PyTorch, cmake and ninja but none of the
# Debian packages mpsim links (HDF5, fmt, OpenBLAS, toml++, ...) and no network,
# so device time is never spent building. Run it here after
#   cmake --preset default && cmake --build --preset default
# then carry BUNDLE_DIR (".gpu") with each device call; tools/gpu_session.sh
# unpacks it there. docs/gpu-session.md is the runbook.
#
# BUNDLE_DIR holds:
#   bundle.tar.xz      build/{tests/gpu,bench,experiments}/... (the build tree's
#                      own relative paths, so scripts taking a BUILD_DIR work),
#                      lib/ (the libraries), fallback/ (libstdc++, libgcc_s:
#                      used only if the device's are too old)
#   data/fashion-mnist the dataset's four .gz files (already compressed)
#   data/fortunes      the fortunes collections the GPT reads (when installed here)
#   configs/           only configs that are not tracked (tracked ones travel)
#   MANIFEST.txt       revision, build, contents, sizes, checksum
# Why a tarball: the libraries alone are ~61 MB (OpenBLAS 37 MB) and the carry
# limit is 64 MiB for the working tree and carried paths together; xz makes
# them ~12 MB and unpacking takes about a second.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
build=${1:-build/default}
bundle=${2:-.gpu}
build=${build%/}
bundle=${bundle%/}
data_src=${MPSIM_FASHION_MNIST:-/usr/share/datasets/fashion-mnist}
MiB=$((1024 * 1024))
limit_bundle=$((56 * MiB))   # the bundle alone
limit_total=$((64 * MiB))    # the device tool's limit: working tree + carried paths

die() { echo "gpu_bundle.sh: $*" >&2; exit 1; }
mib() { awk -v b="$1" 'BEGIN { printf "%.1f MiB", b / 1048576 }'; }

# Libraries the device provides, never bundled:
# - the glibc family (libc, libm, libpthread, libdl, librt, libresolv, ld-linux):
#   a second C library cannot be mixed with the system's loader; ours needs
#   glibc <= 2.36 (Debian 12), the device image is newer (Python 3.12.3 there)
# - libstdc++ and libgcc_s: the device's compiler runtime (GCC >= 12 needed;
#   ours is also packed in fallback/ in case the device's is older)
# - libcuda (the driver's, must match the kernel module), libcudart, libcublas,
#   libcublasLt: part of the device's CUDA 13 (nvcc 13.0 there) and far too large
#   to carry (libcublasLt alone is several hundred MB); gpu_session.sh finds them
excluded='^(libc|libm|libmvec|libpthread|libdl|librt|libresolv|libutil|ld-linux-x86-64|linux-vdso|libstdc\+\+|libgcc_s|libcuda|libcudart|libcublas|libcublasLt)\.so'

[ -d "$build" ] || die "no build folder $build; build first: cmake --preset default && cmake --build --preset default"

# The executables, by their build-tree paths.
bins=()
for t in tests/gpu/test_gpu_device tests/gpu/test_gpu_backend_ops tests/gpu/test_gpu_tensor_core_check \
         bench/bench_gpu; do
  [ -x "$build/$t" ] && bins+=("$t")
done
mpsim=$(cd "$build" && find experiments -maxdepth 3 -type f -name mpsim -perm -u+x | head -1)
[ -n "$mpsim" ] && bins+=("$mpsim")
# The CUDA backend's plugin, which mpsim loads from ../gpu/ beside its build folder.
[ -f "$build/gpu/libmpsim_cuda.so" ] && bins+=("gpu/libmpsim_cuda.so")
if [ ! -x "$build/bench/bench_gpu" ] || [ -z "$mpsim" ]; then
  die "$build has no bench/bench_gpu or experiments/mpsim: was it configured with CUDA (nvcc found)? See docs/gpu.md"
fi
[ -x "$build/tests/gpu/test_gpu_device" ] || echo "gpu_bundle.sh: warning: no device tests in $build/tests/gpu" >&2

# A stale bundle wastes device time: refuse binaries older than the sources
# they are built from (mtime heuristic; MPSIM_BUNDLE_ALLOW_STALE=1 overrides).
oldest=$(cd "$build" && stat -c %Y "${bins[@]}" | sort -n | head -1)
newer=$(git ls-files -z -- core emulation gpu experiments/src experiments/CMakeLists.txt bench tests/gpu \
          tests/support tests/CMakeLists.txt cmake CMakeLists.txt |
        xargs -0 stat -c '%Y %n' 2>/dev/null | awk -v t="$oldest" '$1 > t { print $2 }' | head -5)
if [ -n "$newer" ]; then
  echo "gpu_bundle.sh: sources newer than the binaries in $build:" >&2
  sed 's/^/  /' <<< "$newer" >&2
  [ "${MPSIM_BUNDLE_ALLOW_STALE:-0}" = 1 ] ||
    die "rebuild first (cmake --build --preset default), or set MPSIM_BUNDLE_ALLOW_STALE=1"
fi

# Never wipe a folder this script did not make.
if [ -e "$bundle" ]; then
  [ -z "$(ls -A "$bundle")" ] || [ -f "$bundle/MANIFEST.txt" ] ||
    die "$bundle exists and is not a bundle (no MANIFEST.txt); choose another BUNDLE_DIR"
fi
stage=$(mktemp -d /tmp/gpu_bundle.XXXXXX)
trap 'rm -rf "$stage"' EXIT

# 1. Executables: stripped copies (the build tree keeps its debug info).
for b in "${bins[@]}"; do
  mkdir -p "$stage/build/$(dirname "$b")"
  strip --strip-debug -o "$stage/build/$b" "$build/$b"
done

# 2. Their libraries, per ldd (transitive), saved under their sonames, which is
#    what the loader looks for.
mkdir -p "$stage/lib" "$stage/fallback"
declare -A seen=()
while read -r name path; do
  [[ -n ${seen[$name]:-} ]] && continue
  seen[$name]=$path
  if [[ $name =~ $excluded ]]; then
    case $name in libstdc++.so.*|libgcc_s.so.*) cp -L "$path" "$stage/fallback/$name" ;; esac
    continue
  fi
  [ "$path" = "not" ] && die "$name: not found by ldd here; the build cannot run even on this machine"
  cp -L "$path" "$stage/lib/$name"
done < <(for b in "${bins[@]}"; do ldd "$build/$b"; done | awk '$2 == "=>" { print $1, $3 }' | sort -u)

# 3. Check: with LD_LIBRARY_PATH=lib every dependency of the stripped copies
#    resolves inside the bundle, or is on the exclusion list.
problems=0
for b in "${bins[@]}"; do
  while read -r name arrow path _; do
    [ "$arrow" = "=>" ] || continue
    if [ "$path" = "not" ]; then
      echo "  $b: $name not found" >&2; problems=$((problems + 1))
    elif [[ ! $name =~ $excluded ]] && [[ $path != "$stage/lib/"* ]]; then
      echo "  $b: $name resolves outside the bundle ($path)" >&2; problems=$((problems + 1))
    fi
  done < <(LD_LIBRARY_PATH="$stage/lib" ldd "$stage/build/$b")
done
[ "$problems" -eq 0 ] || die "$problems unresolved dependencies (above)"

# The newest glibc and libstdc++ symbol versions needed: the device must have them.
symbols=$(find "$stage/build" "$stage/lib" -type f -print0 | xargs -0 objdump -T 2>/dev/null)
need_glibc=$(grep -o 'GLIBC_2\.[0-9]*' <<< "$symbols" | sort -uV | tail -1)
need_glibcxx=$(grep -o 'GLIBCXX_3\.4\.[0-9]*' <<< "$symbols" | sort -uV | tail -1)

# 4. Write the bundle.
rm -rf "$bundle"
mkdir -p "$bundle"
echo "gpu_bundle.sh: compressing (xz, about 30 s on 2 cores)..."
tar -C "$stage" -cf - build lib fallback | xz -T0 -6 > "$bundle/bundle.tar.xz"

# The dataset: the device has no Debian dataset-fashion-mnist package.
if [ "${MPSIM_BUNDLE_DATA:-1}" = 1 ]; then
  [ -f "$data_src/train-images-idx3-ubyte.gz" ] ||
    die "no Fashion-MNIST in $data_src (Debian's dataset-fashion-mnist); MPSIM_BUNDLE_DATA=0 leaves it out"
  mkdir -p "$bundle/data/fashion-mnist"
  cp "$data_src"/{train,t10k}-{images-idx3,labels-idx1}-ubyte.gz "$bundle/data/fashion-mnist/"
  # The GPT's text (Debian's fortunes): the collections only, as load_text reads them.
  text_src=${MPSIM_FORTUNES:-/usr/share/games/fortunes}
  if [ -d "$text_src" ]; then
    mkdir -p "$bundle/data/fortunes"
    find "$text_src" -maxdepth 1 -type f ! -name '*.dat' -exec cp {} "$bundle/data/fortunes/" \;
  fi
fi

# The experiment configs travel with the working tree when git tracks them.
configs=(experiments/configs/default.toml experiments/configs/emulator_vs_gpu.toml)
config_note=()
for c in "${configs[@]}"; do
  if git ls-files --error-unmatch -- "$c" >/dev/null 2>&1; then
    config_note+=("$c (tracked: travels with the tree)")
  else
    mkdir -p "$bundle/configs"
    cp "$c" "$bundle/configs/"
    config_note+=("$c (untracked: copied to $bundle/configs/)")
  fi
done

# 5. Ignore the bundle (so it is carried, not sent as an untracked file).
rel=$(realpath --relative-to="$root" "$bundle")
if [[ $rel != ../* ]]; then
  exclude=$(git rev-parse --git-path info/exclude)
  mkdir -p "$(dirname "$exclude")"
  grep -qxF "/$rel/" "$exclude" 2>/dev/null || echo "/$rel/" >> "$exclude"
fi

# 6. Manifest and sizes.
sum() { xargs -0 -r stat -c %s 2>/dev/null | awk '{ s += $1 } END { print s + 0 }'; }
bundle_bytes=$(find "$bundle" -type f -print0 | sum)
tracked_bytes=$(git ls-files -z | sum)
untracked_bytes=$(git ls-files -z --others --exclude-standard | sum)
tree_bytes=$((tracked_bytes + untracked_bytes))
{
  echo "mpsim GPU bundle"
  echo "made:      $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(hostname) ($(. /etc/os-release && echo "$PRETTY_NAME"))"
  echo "revision:  $(git rev-parse HEAD)$( [ -n "$(git status --porcelain --untracked-files=no)" ] && echo ' + uncommitted changes')"
  echo "build:     $build ($(grep -h '^CMAKE_BUILD_TYPE:' "$build/CMakeCache.txt" | cut -d= -f2)," \
       "CUDA archs $(grep -h '^CMAKE_CUDA_ARCHITECTURES:' "$build/CMakeCache.txt" | cut -d= -f2)," \
       "nvcc $(nvcc --version 2>/dev/null | grep -o 'release [0-9.]*' || echo '?'))"
  echo "needs:     $need_glibc, $need_glibcxx, libcudart/libcublas/libcublasLt .so.13 on the device"
  echo "sha256:    $(sha256sum "$bundle/bundle.tar.xz" | cut -d' ' -f1)  bundle.tar.xz"
  echo "configs:   ${config_note[*]}"
  echo
  echo "executables (stripped, bytes):"
  (cd "$stage" && find build -type f -printf '  %-44p %10s\n' | sort)
  echo "libraries (bytes, from):"
  for f in "$stage"/lib/*; do printf '  %-28s %10s  %s\n' "${f##*/}" "$(stat -c %s "$f")" "${seen[${f##*/}]}"; done
  echo "fallback (used only if the device's are older): $(ls "$stage/fallback" | tr '\n' ' ')"
  echo "excluded (the device provides them): glibc family, libstdc++, libgcc_s, libcuda, libcudart, libcublas, libcublasLt"
  echo
  echo "bundle $(mib "$bundle_bytes"); working tree $(mib "$tree_bytes") (tracked $(mib "$tracked_bytes"), untracked $(mib "$untracked_bytes"))"
} > "$bundle/MANIFEST.txt"

echo "gpu_bundle.sh: $bundle: ${#bins[@]} executables, $(ls "$stage/lib" | wc -l) libraries, $(du -sh "$bundle/bundle.tar.xz" | cut -f1) compressed"
printf '  %-36s %s\n' "bundle ($bundle, carried)" "$(mib "$bundle_bytes")" \
  "tracked files" "$(mib "$tracked_bytes")" \
  "untracked, not ignored files" "$(mib "$untracked_bytes")" \
  "total sent per device call" "$(mib $((bundle_bytes + tree_bytes))) (limit 64 MiB)"
[ "$bundle_bytes" -le "$limit_bundle" ] || die "the bundle is over 56 MiB: too large to carry"
[ $((bundle_bytes + tree_bytes)) -le "$limit_total" ] ||
  die "bundle + working tree is over 64 MiB: the device tool would refuse the call"
echo "gpu_bundle.sh: done; carry [\"$rel\"] and run tools/gpu_session.sh STAGE (docs/gpu-session.md)"
