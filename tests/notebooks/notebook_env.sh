# Sourced by the notebook tests: Debian's /usr/bin/python3 with the modules the
# notebooks need (else exit 77, Skipped), a scratch folder $work (removed on
# success, kept and named on failure), fail(), and Jupyter state inside $work
# with a kernel "python3" that runs /usr/bin/python3.
# require_scipy: exit 77 (Skipped) when the studies' statistics (scipy) are missing.
# execute_notebook NOTEBOOK OUT_NAME MIN_IMAGES: runs it headless, checks that
# no cell failed, that it drew MIN_IMAGES figures, and that the committed
# notebook carries no outputs.
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

require_scipy() {
  if ! "$py" -c "import scipy.stats, scipy.integrate" 2>/dev/null; then
    echo "SKIP: $py lacks scipy (Debian: apt install python3-scipy)"
    status=0
    exit $skip
  fi
}

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


execute_notebook() {
  local notebook=$1 out=$2 min_images=$3
  "$py" -m nbconvert --to notebook --execute \
    --ExecutePreprocessor.kernel_name=python3 --ExecutePreprocessor.timeout=300 \
    --output-dir "$work" --output "$out" "$notebook" \
    || fail "$notebook did not run to the end (nbconvert exited with an error)"
  "$py" - "$work/$out" "$notebook" "$min_images" <<'PYEOF' || fail "executed notebook check"
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
if images < int(sys.argv[3]):
    sys.exit(f"expected at least {sys.argv[3]} figures in the executed notebook, found {images}")
kernel = executed.metadata.get("language_info", {}).get("version")
if kernel != platform.python_version():
    sys.exit(f"the kernel ran Python {kernel}, not {sys.executable}'s {platform.python_version()}")

# The committed notebook carries no outputs.
source = nbformat.read(sys.argv[2], as_version=4)
dirty = [i for i, c in enumerate(source.cells)
         if c.cell_type == "code" and (c.outputs or c.execution_count is not None)]
if dirty:
    sys.exit(f"{sys.argv[2]} is committed with outputs in cells {dirty}; clear them")
PYEOF
}

# require_pngs PREFIX NAME...: each PREFIXNAME.png exists and starts with the
# PNG signature, else fail.
require_pngs() {
  local prefix=$1 name png
  shift
  for name in "$@"; do
    png="$prefix$name.png"
    [ "$(head -c 8 "$png" 2>/dev/null | od -An -tx1 | tr -d ' \n')" = 89504e470d0a1a0a ] || fail "$png is not a PNG"
  done
}

# smoke_run STUDY [OVERRIDE...]: `mpsim run experiments/configs/STUDY.toml
# --smoke` into $work/STUDY.h5, its path left in $log. Needs $mpsim and $src.
smoke_run() {
  local study=$1
  shift
  echo "== mpsim run $study.toml --smoke $*"
  log="$work/$study.h5"
  "$mpsim" run "$src/experiments/configs/$study.toml" --smoke "$@" --quiet -o "$log" --force > "$work/run.txt" 2>&1 \
    || { cat "$work/run.txt"; fail "mpsim run exited with an error"; }
  tail -n 4 "$work/run.txt"
  [ -s "$log" ] || fail "no log at $log"
}

# study_module STUDY: notebooks/STUDY.py on $log, figures and findings into
# $work/figures, its output in $work/figures.txt.
study_module() {
  echo "== $1.py"
  "$py" "$src/notebooks/$1.py" "$log" --out "$work/figures" > "$work/figures.txt" \
    || { cat "$work/figures.txt"; fail "$1.py exited with an error"; }
}
