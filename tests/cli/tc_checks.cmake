# tc input checks (mpsim_cli_test from CMakeLists.txt)
#
# tc_check(NAME EXIT REGEX COMMAND...): mpsim_cli_test with the two streams
# told apart: each output line is prefixed "stdout: " or "stderr: ", and exit 2
# after anything on stdout fails, since a refusal must come before any output.
# (The scripts below hold no ';': CMake would split them there.)
set(tc_streams [=[
err=$(mktemp) || exit 99
out=$("$@" 2>"$err")
rc=$?
if [ -n "$out" ]
then printf '%s\n' "$out" | sed 's/^/stdout: /'
fi
sed 's/^/stderr: /' "$err"
rm -f "$err"
if [ "$rc" -eq 2 ] && [ -n "$out" ]
then echo "FAIL: exit 2 after output on stdout"
exit 1
fi
exit "$rc"
]=])
function(tc_check name exit_code regex)
  mpsim_cli_test("${name}" ${exit_code} "${regex}" bash -c "${tc_streams}" tc-check ${ARGN})
endfunction()

set(tc_dir ${CMAKE_CURRENT_BINARY_DIR}/tc-checks)
file(MAKE_DIRECTORY ${tc_dir}/empty)
set(sweep_config ${PROJECT_SOURCE_DIR}/experiments/configs/accumulation.toml)
set(tiny_sweep k_min_log2=4 k_max_log2=4 trials=1 gemm_size=0 "distributions=[\"uniform\"]")

# --- tc dot ---------------------------------------------------------------------------
tc_check("tc dot: a bad model after good ones leaves no output" 2 "^stderr: mpsim: unknown accumulation model 'bogus'"
  ${mpsim} tc dot -m h100,bogus -a 1 2 -b 1 1)
tc_check("tc dot: an empty model name between commas" 2
  "^stderr: mpsim: -m 'h100,,fp32' has an empty model name between commas; remove the extra comma"
  ${mpsim} tc dot -m h100,,fp32 -a 1 2 -b 1 1)
tc_check("tc dot: an empty piece inside a custom model" 2 "-m 'tc:block=4,,bits=23' has an empty model name between commas"
  ${mpsim} tc dot -m tc:block=4,,bits=23 -a 1 -b 1)
tc_check("tc dot: an empty model name after the last comma" 2 "-m 'h100,' has an empty model name after its last comma"
  ${mpsim} tc dot -m h100, -a 1 -b 1)
tc_check("tc dot: a bad custom model after a good one leaves no output" 2
  "'tc:block=0': tensor-core model: block 0 is not in 1\\.\\.64"
  ${mpsim} tc dot -m fp32,tc:block=0 -a 1 -b 1)
# Notes go to stderr, the results alone to stdout.
tc_check("tc dot: a value rounded to --input is a note on stderr" 0
  "^stderr: note: -a value 0\\.1 is not a binary16 value; rounded to nearest-even: 0\\.0999755859375$"
  ${mpsim} tc dot -m fp32 -a 0.1 -b 1)
# h100:e4m3 rounds a and b to e4m3 itself (tensor_core_dot): 1.0625 is 1 there.
tc_check("tc dot: a model with its own input format notes what it rounds" 0
  "^stderr: note: h100:e4m3 takes e4m3 inputs: -a value 1\\.0625 is rounded to nearest-even: 1$"
  ${mpsim} tc dot -m h100:e4m3 -a 1.0625 -b 1)
# MI210's tensor core flushes subnormal inputs (MI210MC.m): 2^-20 is 0 there.
tc_check("tc dot: a model that flushes subnormal inputs notes it" 0
  "^stderr: note: mi210 takes e5m10:ftz inputs: -a value 9\\.5367431640625e-7 is flushed to zero"
  ${mpsim} tc dot -m mi210 -a 0x1p-20 -b 1)
# ... and c to its binary16 output: 1 + 2^-15 is 1 there, while the header shows the binary32 c.
tc_check("tc dot: a model with its own output format notes how it rounds c" 0
  "^stderr: note: h100:e4m3:fp16 takes c in its binary16 output format: c = 1\\.000030517578125 is rounded to nearest-even: 1$"
  ${mpsim} tc dot -m h100:e4m3:fp16 -a 1 -b 1 -c 0x1.0002p0)
tc_check("tc dot: a recursive model notes the c it starts from" 0
  "^stderr: note: fp16:rtz starts its sum from c rounded into binary16 \\(toward-zero\\): c = 1\\.000030517578125 becomes 1$"
  ${mpsim} tc dot -m fp16:rtz -a 1 -b 1 -c 0x1.0002p0)
tc_check("tc dot: format names in any case" 0 "^stdout: h100 +2 +0x1p\\+1$"
  ${mpsim} tc dot -m h100 --input E4M3 --output FP16 -a 1 -b 1 -c 1)

# Why a model name is refused, not only that it is.
function(tc_model_refusal model regex)
  tc_check("tc dot: model ${model} is refused with its reason" 2 "${regex}" ${mpsim} tc dot -m ${model} -a 1 -b 1)
endfunction()
tc_model_refusal(v100:bf16
  "'v100:bf16': no model for v100 bfloat16 -> binary32: the GPU has no such instruction.*v100's models: binary16 -> binary32, binary16 -> binary16$")
tc_model_refusal(a100:bf16:fp16 "'a100:bf16:fp16': no model for a100 bfloat16 -> binary16: the GPU has no such instruction")
tc_model_refusal(mi100:fp16:fp16 "'mi100:fp16:fp16': no model for mi100 binary16 -> binary16: .*mi100's models: binary16 -> binary32, bfloat16 -> binary32$")
tc_model_refusal(h100:e2m1 "'h100:e2m1': no model for h100 e2m1 -> binary32")
tc_model_refusal(h100:fp64 "'h100:fp64': binary64 is not a tensor-core input format \\(the GPUs take binary16, bfloat16, tf32, e4m3, e5m2")
tc_model_refusal(h100:e4m3:bf16 "'h100:e4m3:bf16': a tensor core's output is binary32 or binary16, not bfloat16$")
tc_model_refusal(h100:rtz "'h100:rtz': a tensor core takes no :MODE: the GPU fixes its rounding")
tc_model_refusal(fp32:stochastic "'fp32:stochastic': stochastic rounding is not an accumulation mode.*nearest-even, nearest-away, toward-zero")
tc_model_refusal(fp64 "'fp64': binary64 does not fit in binary32: an accumulation format needs a precision of at most 24 bits")
tc_model_refusal(exact-fp64 "'exact-fp64': binary64 does not fit in binary32")
tc_model_refusal(blocked-fp32-0 "'blocked-fp32-0': block size 0: a block holds at least 1 product")
tc_model_refusal(blocked-fp32 "'blocked-fp32': give the block size: blocked-FORMAT-B")
# A bare GPU takes --input and --output: its refusal names them.
tc_check("tc dot: a bare GPU without the instruction for --input and --output" 2
  "'mi100': no model for mi100 binary16 -> binary16"
  ${mpsim} tc dot -m fp32,mi100 --output binary16 -a 1 -b 1)

# --- tc sweep ---------------------------------------------------------------------------
tc_check("tc sweep: a model gets the reason tc dot gives" 2 "^stderr: mpsim: models: 'tc:block=0': tensor-core model: block 0 is not in 1\\.\\.64$"
  ${mpsim} tc sweep ${sweep_config} "models=[\"tc:block=0\"]" -o ${tc_dir}/never.csv)
foreach(key models inputs distributions)
  tc_check("tc sweep: empty ${key} is refused" 2 "^stderr: mpsim: ${key} is empty: nothing to sweep"
    ${mpsim} tc sweep ${sweep_config} "${key}=[]" -o ${tc_dir}/never.csv)
endforeach()
tc_check("tc sweep: a model twice under two names" 2
  "models: 'fp16' and 'binary16' are the same model on binary16 data \\(binary16\\); give each once"
  ${mpsim} tc sweep ${sweep_config} "models=[\"fp16\",\"binary16\"]" "inputs=[\"binary16\"]" -o ${tc_dir}/never.csv)
tc_check("tc sweep: an input twice under two names" 2 "inputs: 'fp16' and 'binary16' are the same \\(binary16\\)"
  ${mpsim} tc sweep ${sweep_config} "inputs=[\"fp16\",\"binary16\"]" -o ${tc_dir}/never.csv)
tc_check("tc sweep: a distribution twice" 2 "distributions: 'uniform' is given twice"
  ${mpsim} tc sweep ${sweep_config} "distributions=[\"uniform\",\"uniform\"]" -o ${tc_dir}/never.csv)
tc_check("tc sweep: an empty -o" 2 "^stderr: mpsim: -o is empty; give the CSV file to write, or leave -o out"
  bash -c "\"$0\" tc sweep \"$1\" -o ''" ${mpsim} ${sweep_config})
tc_check("tc sweep: binary64 inputs would break the exact reference" 2
  "inputs: binary64 would break the exact reference.*accepted: the tensor-core input formats"
  ${mpsim} tc sweep ${sweep_config} "inputs=[\"fp64\"]" -o ${tc_dir}/never.csv)
# A model that rounds its inputs to another format would count that rounding as accumulation error.
tc_check("tc sweep: a model with other inputs than the data is skipped, and says why" 0
  "^stdout: # skipped: h100:e4m3 on binary16 \\(its inputs are e4m3; the sweep's data is binary16\\)$"
  bash -c "\"$0\" tc sweep \"$1\" 'models=[\"fp32\",\"h100:e4m3\"]' 'inputs=[\"binary16\"]' $2 $3 $4 $5 \"$6\" -o \"$7\" --force >/dev/null && cat \"$7\""
  ${mpsim} ${sweep_config} ${tiny_sweep} ${tc_dir}/skip.csv)
tc_check("tc sweep: every model skipped is nothing to sweep" 2
  "nothing to sweep: every model was skipped \\(v100 on e4m3 \\(no such instruction\\)\\)"
  ${mpsim} tc sweep ${sweep_config} "models=[\"v100\"]" "inputs=[\"e4m3\"]" -o ${tc_dir}/never.csv)
tc_check("tc sweep: input names in any case" 0 "^stdout: fp32,e4m3,uniform,16,dot,0,"
  bash -c "\"$0\" tc sweep \"$1\" 'models=[\"fp32\"]' 'inputs=[\"E4M3\"]' $2 $3 $4 $5 \"$6\" -o \"$7\" --force >/dev/null && cat \"$7\""
  ${mpsim} ${sweep_config} ${tiny_sweep} ${tc_dir}/any-case.csv)

# --- tc validate: the options ----------------------------------------------------------------
foreach(option gpu input output)
  tc_check("tc validate: an empty --${option} is refused" 2 "^stderr: mpsim: --${option} is empty; give "
    bash -c "\"$0\" tc validate --${option} '' \"$1\"" ${mpsim} ${tc_dir}/empty)
endforeach()
# The model is checked before the files: these hold for any DIR.
tc_check("tc validate: a GPU without the input's instruction" 2
  "^stderr: mpsim: v100 has no model for bf16 -> any output: the GPU has no such instruction.*its models: fp16 -> fp32, fp16 -> fp16\\. Nothing validated$"
  ${mpsim} tc validate --gpu v100 --input bf16 ${tc_dir}/empty)
tc_check("tc validate: a GPU without the instruction asked" 2 "h100 has no model for bf16 -> fp16: the GPU has no such instruction"
  ${mpsim} tc validate --gpu h100 --input bf16 --output fp16 ${tc_dir}/empty)
tc_check("tc validate: an AMD GPU without a binary16 output" 2 "MI250 has no model for any input -> fp16.*its models: fp16 -> fp32, bf16 -> fp32"
  ${mpsim} tc validate --gpu MI250 --output fp16 ${tc_dir}/empty)
tc_check("tc validate: an output no vectors hold" 2 "--output fp64: no measured tensor-core vectors hold binary64 outputs; accepted: fp32, fp16$"
  ${mpsim} tc validate --gpu h100 --output fp64 ${tc_dir}/empty)
tc_check("tc validate: the hint lists the GPU folders DIR has" 2 "it has no B200/ folder \\(nothing validated; .*/only-v100 holds V100/\\)$"
  bash -c "mkdir -p \"$1/only-v100/V100\" && \"$0\" tc validate --gpu B200 \"$1/only-v100\"" ${mpsim} ${tc_dir})

# --- tc validate: damaged and partial copies of the measured vectors --------------------------
# Each case copies shared/'s V100 folder (K = 4, 5,000 cases) and changes it;
# skipped, and said so, without shared/.
set(tc_vectors "${MPSIM_SHARED_DIR}/tensor-core-vectors")
set(tc_copy_v100 [=[
S=$1 D=$2 M=$3
if [ ! -d "$S/V100/fp16" ]
then echo "SKIPPED: $S/V100 is absent (shared/ is not beside the project)"
exit 77
fi
chmod -R u+w "$D" 2>/dev/null
rm -rf "$D" && mkdir -p "$D" && cp -r "$S/V100" "$D/" && chmod -R u+w "$D" && cd "$D/V100/fp16" || exit 99
]=])
function(tc_damaged name regex change)
  string(MAKE_C_IDENTIFIER "${name}" copy)  # a folder of its own: ctest -j runs cases side by side
  tc_check("tc validate: ${name}" 2 "${regex}"
    bash -c "${tc_copy_v100}${change} || exit 99\n\"$M\" tc validate \"$D\"" tc ${tc_vectors} ${tc_dir}/${copy} ${mpsim})
endfunction()
# d_V100_fp16 is the second folder validated: its damage must stop the command before the first one's line.
tc_damaged("a truncated gzip is damaged data, its path said once"
  "^stderr: mpsim: measured vectors damaged: [^ :]*/d_V100_fp16\\.txt\\.gz: unexpected end of file; restore the folder from its source"
  "head -c 8000 d_V100_fp16.txt.gz > t && mv t d_V100_fp16.txt.gz")
tc_damaged("a CRC error is damaged data"
  "^stderr: mpsim: measured vectors damaged: [^ :]*/d_V100_fp16\\.txt\\.gz: incorrect data check"
  "n=$(stat -c %s d_V100_fp16.txt.gz) && printf '\\377\\377\\377\\377' | dd of=d_V100_fp16.txt.gz bs=1 seek=$((n - 8)) conv=notrunc 2>/dev/null")
tc_damaged("a value that is not hex is damaged data"
  "^stderr: mpsim: measured vectors damaged: [^ :]*/a_V100_fp16\\.txt\\.gz:3: '3f8zz000' is not 8 hex digits"
  "gzip -dc a_V100_fp16.txt.gz | sed '3s/^[0-9a-f]*/3f8zz000/' | gzip > t && mv t a_V100_fp16.txt.gz")
tc_damaged("a binary string that is not 32 digits is damaged data"
  "/d_V100_fp16\\.txt\\.gz:2: '0101' is not 32 binary digits"
  "gzip -dc d_V100_fp16.txt.gz | sed '2s/.*/0101/' | gzip > t && mv t d_V100_fp16.txt.gz")
tc_damaged("files of different lengths are damaged data, each named with its count"
  "hold different numbers of cases: a_V100_fp16\\.txt\\.gz 5000, b_V100_fp16\\.txt\\.gz 5000, c_V100_fp32\\.txt\\.gz 4999, d_V100_fp32\\.txt\\.gz 5000"
  "gzip -dc c_V100_fp32.txt.gz | sed '$d' | gzip > t && mv t c_V100_fp32.txt.gz")
tc_damaged("a line of a with a value more than b's blames a, naming both counts"
  "/a_V100_fp16\\.txt\\.gz:3 holds 5 values but b_V100_fp16\\.txt\\.gz:3 holds 4"
  "gzip -dc a_V100_fp16.txt.gz | sed '3s/$/ 3f800000/' | gzip > t && mv t a_V100_fp16.txt.gz")
tc_damaged("a value outside the input format is damaged data, not rounded"
  "/b_V100_fp16\\.txt\\.gz:1: 3f800001 is not a binary16 value"
  "gzip -dc b_V100_fp16.txt.gz | sed '1s/^[0-9a-f]*/3f800001/' | gzip > t && mv t b_V100_fp16.txt.gz")
tc_damaged("a missing a file next to a d file is incomplete data"
  "measured vectors incomplete: [^ :]*/a_V100_fp16\\.txt\\.gz is missing \\(nor a_V100_fp16\\.txt\\)"
  "rm a_V100_fp16.txt.gz")
tc_damaged("two folders for one GPU in different case are refused"
  "holds both (V100 and v100|v100 and V100), which differ only in case; keep one of them"
  "mkdir -p ../../v100")

# Names in any case: the GPU folder, the format folder and the file names inside.
tc_check("tc validate: file and folder names in any case" 0 "^stdout: v100 fp16 -> fp32: 5000 passed, 0 failed$"
  bash -c "${tc_copy_v100}mv \"$D/V100\" \"$D/v100\" && mv \"$D/v100/fp16\" \"$D/v100/FP16\" && \"$M\" tc validate --input fp16 \"$D\""
  tc ${tc_vectors} ${tc_dir}/any-case ${mpsim})
tc_check("tc validate: format names in any case" 0 "^stdout: H100 E4M3 -> fp16: 5000 passed, 0 failed$"
  bash -c "if [ ! -d \"$1/H100/E4M3\" ]\nthen echo \"SKIPPED: $1/H100 is absent (shared/ is not beside the project)\"\nexit 77\nfi\n\"$0\" tc validate --gpu h100 --input E4M3 --output FP16 \"$1\""
  ${mpsim} ${tc_vectors})
# An output the GPU has a model for, but no d file: said, not skipped silently.
tc_check("tc validate: a modelled output without measurements is said so" 0
  "^stdout: V100 fp16 -> fp16: not measured \\(no [^ ]*/d_V100_fp16\\.txt\\.gz, nor \\.txt\\); skipped$"
  bash -c "${tc_copy_v100}rm d_V100_fp16.txt.gz && \"$M\" tc validate \"$D\"" tc ${tc_vectors} ${tc_dir}/no-d ${mpsim})
tc_check("tc validate: the one output asked, not measured" 2
  "no measured vectors with a model for fp16 -> fp16 .*V100 fp16 -> fp16: not measured \\(no [^ ]*/d_V100_fp16\\.txt\\.gz, nor \\.txt\\)"
  bash -c "${tc_copy_v100}rm d_V100_fp16.txt.gz && \"$M\" tc validate --gpu v100 --input fp16 --output fp16 \"$D\""
  tc ${tc_vectors} ${tc_dir}/no-d-asked ${mpsim})
# A GPU folder outside shared/ (values worked by hand: 1*1 + 1 = 2 on any model): the output with a model is
# validated, the measured one without a model (MI250 has no binary16 output) and the input not measured are said
# so, in this order (the lines joined with " | ").
tc_check("tc validate: measured without a model, and modelled without measurements, are listed" 0
  "^stdout: Mi250 fp16 -> fp32: 1 passed, 0 failed \\| Mi250 fp16 -> fp16: measured, but Mi250 has no model for it [^|]*; skipped \\| Mi250 bf16 -> fp32: not measured \\(no [^ ]*/Mi250/bf16/d_Mi250_fp32\\.txt\\.gz, nor \\.txt\\); skipped \\| 1 passed, 0 failed \\| $"
  bash -c "d=\"$1/mi250/Mi250/fp16\" && rm -rf \"$1/mi250\" && mkdir -p \"$d\" && cd \"$d\" && \
    printf '3f800000\\n' > a_Mi250_fp16.txt && printf '3f800000\\n' > b_Mi250_fp16.txt && \
    printf '00111111100000000000000000000000\\n' > c_Mi250_fp32.txt && \
    printf '01000000000000000000000000000000\\n' > d_Mi250_fp32.txt && cp d_Mi250_fp32.txt d_Mi250_fp16.txt && \
    set -o pipefail && \"$0\" tc validate \"$1/mi250\" | sed 's/$/ |/' | tr '\\n' ' '" ${mpsim} ${tc_dir})
# Two GPUs that share a model keep a row each (a sweep comparing GPUs names every one); one model twice does not.
mpsim_cli_test("tc sweep: two GPUs of one model keep a row each" 0 "^h200,binary16,uniform,16,dot,0,"
  bash -c "\"$0\" tc sweep \"$1\" 'models=[\"h100\",\"h200\"]' 'inputs=[\"binary16\"]' 'distributions=[\"uniform\"]' k_min_log2=4 k_max_log2=4 trials=1 gemm_size=0 -o \"$2/two-gpus.csv\" --force >/dev/null && cat \"$2/two-gpus.csv\""
  ${mpsim} ${PROJECT_SOURCE_DIR}/experiments/configs/accumulation.toml ${CMAKE_CURRENT_BINARY_DIR})
mpsim_cli_test("tc sweep: one GPU twice is refused" 2 "'h100' and 'H100' are the same"
  ${mpsim} tc sweep ${PROJECT_SOURCE_DIR}/experiments/configs/accumulation.toml "models=[\"h100\",\"H100\"]" -o ${CMAKE_CURRENT_BINARY_DIR}/never.csv)
