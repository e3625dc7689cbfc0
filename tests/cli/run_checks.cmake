# run config checks (mpsim_cli_test from CMakeLists.txt)
