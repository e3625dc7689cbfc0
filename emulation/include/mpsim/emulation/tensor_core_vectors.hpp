// Checks a tensor-core model against outputs measured on a GPU: the folder
// layout of shared/tensor-core-vectors/ (Khattak and Mikaitis's
// model_validation data): DIR/GPU/FORMAT/{a,b}_GPU_FORMAT.txt.gz (K hex
// binary32 encodings a line), c_GPU_fp32.txt.gz and d_GPU_{fp32,fp16}.txt.gz
// (one 32-character binary string a line). See docs/tensor_cores.md.
//
// Reading is apart from checking, so a caller can read (and refuse damaged
// files) before it reports anything: find_measured_files, then
// read_measured_cases, then check_measured_cases.
#pragma once

#include <cstddef>
#include <filesystem>
#include <span>
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
// empty when DIR has none. Throws std::runtime_error naming both when two
// folders differ only in case (V100/ and v100/): which one holds the GPU's
// vectors is not for us to guess.
std::string tensor_core_vector_folder(const std::filesystem::path& dir, std::string_view gpu);

// One file of a measured folder: where it is (its name in any case;
// NAME.txt.gz, or NAME.txt where only that is there), or, when not found,
// the NAME.txt.gz it was looked for as.
struct MeasuredFile {
  std::filesystem::path path;
  bool found = false;
};

// The files of one GPU, input and output: DIR/GPU/FORMAT/{a,b,c,d}_...
struct MeasuredFiles {
  std::string gpu;         // as asked ("h100"); its folder in any case
  Format input, output;    // what the files hold
  std::filesystem::path folder;  // DIR/GPU/FORMAT as spelled there (or as looked for)
  MeasuredFile a, b, c, d;
};

// One measured case: d as the GPU returned it for a·b + c.
struct MeasuredCase {
  std::vector<float> a, b;
  float c = 0.0f, d = 0.0f;
};

// Looks the files up; nothing is read. Throws std::invalid_argument for
// formats that have no vectors, std::runtime_error for names that differ only
// in case.
MeasuredFiles find_measured_files(const std::filesystem::path& dir, std::string_view gpu, const Format& input,
                                  const Format& output);
// Reads and checks every case. Throws std::runtime_error, whose message names
// the file and says to restore the folder, when a file is missing, unreadable
// (a damaged gzip stream), malformed, holds a value that is not exactly a value
// of its format (a, b: the input; d: the output), or the files disagree in
// length. H100 (and H200) FP8 inputs with binary32 output were measured with
// c = 0 (wgmma), so c is 0 there.
std::vector<MeasuredCase> read_measured_cases(const MeasuredFiles& files);
// Runs the model on every case and compares the bits of d.
VectorCheck check_measured_cases(std::span<const MeasuredCase> cases, const TensorCoreModel& model);

// The three steps for tensor_core_preset(gpu, input, output); throws
// std::invalid_argument when there is no preset, and what the steps throw.
VectorCheck validate_tensor_core_vectors(const std::filesystem::path& dir, std::string_view gpu, const Format& input,
                                         const Format& output);
// The same cases through another model (a variant to test against the measurements).
VectorCheck validate_tensor_core_vectors(const std::filesystem::path& dir, std::string_view gpu, const Format& input,
                                         const Format& output, const TensorCoreModel& model);

}  // namespace mpsim
