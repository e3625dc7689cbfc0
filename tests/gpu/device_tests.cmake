# Device tests: the GPU pieces against the CPU emulator. Plain C++ (the gpu/
# headers name no CUDA type); every test case skips (exit 77) without a device.
add_executable(test_gpu_device ${CMAKE_CURRENT_SOURCE_DIR}/test_device.cpp)
target_link_libraries(test_gpu_device PRIVATE mpsim_test_support mpsim::gpu)
target_compile_options(test_gpu_device PRIVATE -Wall -Wextra)
catch_discover_tests(test_gpu_device TEST_PREFIX "gpu: "
  PROPERTIES SKIP_RETURN_CODE ${MPSIM_SKIP_CODE} LABELS "gpu")
