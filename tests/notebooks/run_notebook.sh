#!/bin/bash
# run_notebook.sh MPSIM SOURCE_DIR
#
# Makes a small synthetic run with MPSIM, then, with Debian's /usr/bin/python3:
#   1. notebooks/figures.py on the log: every PNG it names must exist, be a PNG and not be empty;
#   2. notebooks/quickstart.ipynb executed headless with nbconvert (MPSIM_LOG pointing at the
#      log): every cell must run, and the figures must come out as images.
# All output goes to a temporary directory (kept, and named, when the test fails).
# Exit 77 (CTest: Skipped) when /usr/bin/python3 or one of its modules is missing.
set -uo pipefail

mpsim=${1:?usage: run_notebook.sh MPSIM SOURCE_DIR}
src=${2:?usage: run_notebook.sh MPSIM SOURCE_DIR}
py=/usr/bin/python3
skip=77

if [ ! -x "$py" ]; then
  echo "SKIP: $py not found (the notebook tests use Debian's python3)"
  exit $skip
fi

# The kernel and every tool must be Debian's interpreter, not whatever python3
# comes first on PATH (pyenv, a virtual environment), and must not pick up
# another interpreter's modules.
export PATH=/usr/bin:/bin:$PATH
unset PYTHONPATH PYTHONHOME VIRTUAL_ENV PYTHONSTARTUP
export PYTHONDONTWRITEBYTECODE=1      # no __pycache__ in notebooks/
export PYTHONNOUSERSITE=1
export MPLBACKEND=Agg
export PYDEVD_DISABLE_FILE_VALIDATION=1

missing=$("$py" - <<'EOF'
import importlib.util
mods = ["numpy", "h5py", "matplotlib", "nbformat", "nbconvert", "nbclient", "ipykernel", "matplotlib_inline"]
print(" ".join(m for m in mods if importlib.util.find_spec(m) is None))
EOF
)
if [ -n "$missing" ]; then
  echo "SKIP: $py lacks the modules: $missing (Debian: apt install python3-numpy python3-h5py" \
       "python3-matplotlib python3-nbconvert python3-nbclient python3-ipykernel)"
  exit $skip
fi

work=$(mktemp -d "${TMPDIR:-/tmp}/mpsim-notebooks.XXXXXX") || exit 1
status=1
cleanup() {
  if [ "$status" -eq 0 ]; then rm -rf "$work"; else echo "(left for inspection: $work)"; fi
}
trap cleanup EXIT
fail() { echo "FAIL: $*"; status=1; exit 1; }

# Jupyter state in the temporary directory: a kernelspec "python3" that runs
# /usr/bin/python3 (JUPYTER_PATH comes before every other kernel directory, so a
# user's or pyenv's "python3" kernel cannot take its place), and no user config.
mkdir -p "$work/jupyter/kernels/python3" "$work/config" "$work/runtime" "$work/ipython"
cat > "$work/jupyter/kernels/python3/kernel.json" <<EOF
{"argv": ["$py", "-m", "ipykernel_launcher", "-f", "{connection_file}"],
 "display_name": "Python 3 (Debian)", "language": "python"}
EOF
export JUPYTER_PATH="$work/jupyter"
export JUPYTER_CONFIG_DIR="$work/config"
export JUPYTER_RUNTIME_DIR="$work/runtime"
export IPYTHONDIR="$work/ipython"

echo "== mpsim run (synthetic, 2 epochs)"
log="$work/small.h5"
"$mpsim" run "$src/experiments/configs/default.toml" data.dataset=synthetic train.epochs=2 \
  train.stats_interval=1 train.threads=2 -o "$log" --force > "$work/run.txt" 2>&1
rc=$?
[ $rc -eq 0 ] || { cat "$work/run.txt"; fail "mpsim run exited $rc"; }
tail -n 8 "$work/run.txt"
[ -s "$log" ] || fail "mpsim run wrote no log at $log"

echo "== figures.py"
"$py" "$src/notebooks/figures.py" "$log" --out "$work/figures" > "$work/figures.txt" \
  || { cat "$work/figures.txt"; fail "figures.py exited with an error"; }
cat "$work/figures.txt"
count=0
while IFS= read -r png; do
  [ -s "$png" ] || fail "figures.py named $png, which is missing or empty"
  [ "$(head -c 8 "$png" | od -An -tx1 | tr -d ' \n')" = 89504e470d0a1a0a ] || fail "$png is not a PNG"
  count=$((count + 1))
done < "$work/figures.txt"
for name in loss_accuracy loss_scale activation_grads_all underflow; do
  [ -s "$work/figures/small_$name.png" ] || fail "no small_$name.png"
done
[ "$count" -ge 5 ] || fail "figures.py wrote $count PNGs, expected 5"

echo "== quickstart.ipynb (nbconvert --execute)"
MPSIM_LOG="$log" "$py" -m nbconvert --to notebook --execute \
  --ExecutePreprocessor.kernel_name=python3 --ExecutePreprocessor.timeout=300 \
  --output-dir "$work" --output quickstart.executed.ipynb "$src/notebooks/quickstart.ipynb" \
  || fail "the notebook did not run to the end (nbconvert exited with an error)"

"$py" - "$work/quickstart.executed.ipynb" "$src/notebooks/quickstart.ipynb" <<'EOF' || fail "executed notebook check"
import platform
import sys

import nbformat

executed = nbformat.read(sys.argv[1], as_version=4)
code = [c for c in executed.cells if c.cell_type == "code"]
errors = [o for c in code for o in c.outputs if o.output_type == "error"]
images = sum("image/png" in o.get("data", {}) for c in code for o in c.outputs)
print(f"{len(code)} code cells, {images} images, {len(errors)} errors")
if errors:
    sys.exit(f"cell error: {errors[0].ename}: {errors[0].evalue}")
if images < 5:
    sys.exit(f"expected at least 5 figures in the executed notebook, found {images}")
kernel = executed.metadata.get("language_info", {}).get("version")
if kernel != platform.python_version():
    sys.exit(f"the kernel ran Python {kernel}, not {sys.executable}'s {platform.python_version()}")

# The committed notebook carries no outputs.
source = nbformat.read(sys.argv[2], as_version=4)
dirty = [i for i, c in enumerate(source.cells)
         if c.cell_type == "code" and (c.outputs or c.execution_count is not None)]
if dirty:
    sys.exit(f"notebooks/quickstart.ipynb is committed with outputs in cells {dirty}; clear them")
EOF

status=0
echo "PASS"
