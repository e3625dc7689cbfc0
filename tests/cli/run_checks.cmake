# mpsim run refuses, before any work, configs it could not finish (mpsim_cli_test from CMakeLists.txt;
# keeps_user_data.sh checks that the refusals leave a user's files alone).
mpsim_cli_test("run: an empty -o is refused, not replaced by the config's output" 2 "-o is empty: give the HDF5 file"
  bash -c "\"$0\" run \"$1\" -o ''" ${mpsim} ${config})
mpsim_cli_test("run: an empty output is refused" 2 "the output path is empty: set output"
  ${mpsim} run ${config} ${small} "output=''")
mpsim_cli_test("run: a test set of no samples is refused" 2 "data\\.synthetic_test must be >= 1 \\(got 0\\)"
  ${mpsim} run ${config} ${small} data.synthetic_test=0 -o ${run_dir}/checks.h5)
mpsim_cli_test("run: a non-finite init_scale is refused" 2 "model\\.init_scale must be a finite number > 0 \\(got nan\\)"
  ${mpsim} run ${config} ${small} model.init_scale=nan -o ${run_dir}/checks.h5)
mpsim_cli_test("run: an override into [smoke] is refused" 2 "the \\[smoke\\] table is read from the config file only"
  ${mpsim} run ${config} ${small} smoke.train.epochs=0 -o ${run_dir}/checks.h5)
file(WRITE ${run_dir}/bad_smoke.toml "arms = [\"fp32\"]\n[smoke]\ntrain.epoch = 1\n")
mpsim_cli_test("run: [smoke] is checked without --smoke" 2 "\\[smoke\\] \\(checked without --smoke too\\): .*train\\.epoch"
  ${mpsim} run ${run_dir}/bad_smoke.toml -o ${run_dir}/checks.h5)
# ... but after the file itself, and as --smoke would read it: the command line wins.
file(WRITE ${run_dir}/typo_outside_smoke.toml "arms = [\"fp32\"]\n[train]\nepoch = 8\n[smoke]\ntrain.epochs = 1\n")
mpsim_cli_test("run: a typo outside [smoke] is not blamed on it" 2 "^mpsim: config: unknown config key 'train\\.epoch'"
  ${mpsim} run ${run_dir}/typo_outside_smoke.toml -o ${run_dir}/checks.h5)
file(WRITE ${run_dir}/smoke_with_overrides.toml "arms = [\"fp32\"]\n[train]\nepochs = 0\n[smoke]\ntrain.batch_size = 8\n")
mpsim_cli_test("run: [smoke] is checked with the command line's overrides" 2 "output '.*' is a folder"
  ${mpsim} run ${run_dir}/smoke_with_overrides.toml train.epochs=2 -o ${run_dir})
