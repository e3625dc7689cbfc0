// Checks a tensor-core model against outputs measured on a GPU: the folder
// layout of shared/tensor-core-vectors/ (Khattak and Mikaitis's
// model_validation data): DIR/GPU/FORMAT/{a,b}_GPU_FORMAT.txt.gz (K hex
// binary32 encodings a line), c_GPU_fp32.txt.gz and d_GPU_{fp32,fp16}.txt.gz
// (one 32-character binary string a line). See docs/tensor_cores.md.
#pragma once

#include <cstddef>
#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

#include "mpsim/emulation/accumulation.hpp"

namespace mpsim {

struct VectorCheck {
  std::size_t passed = 0, failed = 0;
  std::vector<std::string> first_failures;  // up to 10, each naming the case, its inputs and both results
};

// The folder names the vectors use: "fp16", "bf16", "tf32", "E4M3", "E5M2"
// for inputs, "fp32", "fp16" for outputs; empty for other formats.
std::string tensor_core_vector_name(const Format& format, bool output);

// DIR's folder for a GPU, its name matched in any case ("V100", "Ada");
// empty when DIR has none.
std::string tensor_core_vector_folder(const std::filesystem::path& dir, std::string_view gpu);

// Runs tensor_core_preset(gpu, input, output) on every case of
// DIR/GPU/FORMAT/ (the GPU folder in any case; .txt.gz files, or plain .txt)
// and compares the bits of d. H100 (and H200) FP8 inputs with binary32
// output were measured with c = 0 (wgmma), so c is 0 there. Throws
// std::invalid_argument when there is no preset, and std::runtime_error when a
// file is missing, unreadable or malformed, or the files disagree in length.
VectorCheck validate_tensor_core_vectors(const std::filesystem::path& dir, std::string_view gpu, const Format& input,
                                         const Format& output);
// The same cases through another model (a variant to test against the measurements).
VectorCheck validate_tensor_core_vectors(const std::filesystem::path& dir, std::string_view gpu, const Format& input,
                                         const Format& output, const TensorCoreModel& model);

}  // namespace mpsim
