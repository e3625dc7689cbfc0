// Reads the measured tensor-core vectors (gzip text, through zlib) and runs
// the model on every case.
#include "mpsim/emulation/tensor_core_vectors.hpp"

#include <zlib.h>

#include <bit>
#include <cctype>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <stdexcept>

#include "mpsim/emulation/accumulation.hpp"

namespace mpsim {
namespace {

namespace fs = std::filesystem;

struct GzCloser {
  void operator()(gzFile file) const { gzclose(file); }
};

// Every line of a gzip text file (a plain file reads the same through zlib).
std::vector<std::string> read_lines(const fs::path& path) {
  std::unique_ptr<gzFile_s, GzCloser> file(gzopen(path.c_str(), "rb"));
  if (!file) throw std::runtime_error("cannot open " + path.string());
  std::vector<std::string> lines;
  std::string line;
  char buffer[4096];
  while (gzgets(file.get(), buffer, sizeof buffer) != nullptr) {
    line += buffer;
    if (!line.empty() && line.back() == '\n') {
      while (!line.empty() && (line.back() == '\n' || line.back() == '\r')) line.pop_back();
      lines.push_back(std::move(line));
      line.clear();
    }
  }
  int code = Z_OK;
  const char* message = gzerror(file.get(), &code);
  if (code != Z_OK && code != Z_STREAM_END) throw std::runtime_error(path.string() + ": " + message);
  if (!line.empty()) lines.push_back(std::move(line));
  return lines;
}

[[noreturn]] void malformed(const fs::path& path, std::size_t line) {
  throw std::runtime_error(path.string() + ":" + std::to_string(line + 1) + ": malformed line");
}

// "3f7aa000 3f87c000 ..." -> floats.
std::vector<float> parse_hex_line(const std::string& text, const fs::path& path, std::size_t line) {
  std::vector<float> values;
  std::size_t pos = 0;
  while (pos < text.size()) {
    while (pos < text.size() && (text[pos] == ' ' || text[pos] == '\t')) ++pos;
    if (pos >= text.size()) break;
    std::uint32_t bits = 0;
    int digits = 0;
    for (; pos < text.size() && text[pos] != ' ' && text[pos] != '\t'; ++pos, ++digits) {
      const char ch = text[pos];
      int v = -1;
      if (ch >= '0' && ch <= '9')
        v = ch - '0';
      else if (ch >= 'a' && ch <= 'f')
        v = ch - 'a' + 10;
      else if (ch >= 'A' && ch <= 'F')
        v = ch - 'A' + 10;
      if (v < 0 || digits >= 8) malformed(path, line);
      bits = (bits << 4) | static_cast<std::uint32_t>(v);
    }
    if (digits != 8) malformed(path, line);
    values.push_back(std::bit_cast<float>(bits));
  }
  return values;
}

// "00111110100011100000011010101101" -> float.
float parse_binary_line(const std::string& text, const fs::path& path, std::size_t line) {
  std::string_view t = text;
  while (!t.empty() && t.back() == ' ') t.remove_suffix(1);
  if (t.size() != 32) malformed(path, line);
  std::uint32_t bits = 0;
  for (char ch : t) {
    if (ch != '0' && ch != '1') malformed(path, line);
    bits = (bits << 1) | static_cast<std::uint32_t>(ch - '0');
  }
  return std::bit_cast<float>(bits);
}

// DIR's folder for this GPU: its name in any case (shared/ spells V100,
// Khattak and Mikaitis's repository also Ada, L40S); empty when there is none.
std::string gpu_folder(const fs::path& dir, std::string_view gpu) {
  auto upper = [](std::string_view text) {
    std::string s(text);
    for (char& ch : s) ch = static_cast<char>(std::toupper(static_cast<unsigned char>(ch)));
    return s;
  };
  std::error_code error;
  if (fs::is_directory(dir / std::string(gpu), error)) return std::string(gpu);
  for (const auto& entry : fs::directory_iterator(dir, error))
    if (entry.is_directory(error) && upper(entry.path().filename().string()) == upper(gpu))
      return entry.path().filename().string();
  return "";
}

// NAME.txt.gz, or NAME.txt where only the plain file is there.
fs::path data_file(const fs::path& folder, const std::string& name) {
  const fs::path gz = folder / (name + ".txt.gz"), plain = folder / (name + ".txt");
  return !fs::exists(gz) && fs::exists(plain) ? plain : gz;
}

std::string hex(float x) {
  char text[16];
  std::snprintf(text, sizeof text, "%08x", std::bit_cast<std::uint32_t>(x));
  return text;
}

}  // namespace

std::string tensor_core_vector_folder(const fs::path& dir, std::string_view gpu) { return gpu_folder(dir, gpu); }

std::string tensor_core_vector_name(const Format& f, bool output) {
  if (output) {
    if (f == formats::binary32) return "fp32";
    if (f == formats::binary16) return "fp16";
    return "";
  }
  if (f == formats::binary16) return "fp16";
  if (f == formats::bfloat16) return "bf16";
  if (f == formats::tf32) return "tf32";
  if (f == formats::e4m3) return "E4M3";
  if (f == formats::e5m2) return "E5M2";
  return "";
}

VectorCheck validate_tensor_core_vectors(const fs::path& dir, std::string_view gpu, const Format& input,
                                         const Format& output) {
  const auto model = tensor_core_preset(gpu, input, output);
  if (!model)
    throw std::invalid_argument("no tensor-core model for " + std::string(gpu) + " " + input.name() + " -> " +
                                output.name());
  return validate_tensor_core_vectors(dir, gpu, input, output, *model);
}

VectorCheck validate_tensor_core_vectors(const fs::path& dir, std::string_view gpu, const Format& input,
                                         const Format& output, const TensorCoreModel& model) {
  const std::string in = tensor_core_vector_name(input, false), out = tensor_core_vector_name(output, true);
  if (in.empty() || out.empty())
    throw std::invalid_argument("no tensor-core vectors for " + input.name() + " -> " + output.name());
  const std::string g = tensor_core_vector_folder(dir, gpu);
  if (g.empty()) throw std::runtime_error("no folder for " + std::string(gpu) + " in " + dir.string());
  const fs::path folder = dir / g / in;
  const fs::path a_path = data_file(folder, "a_" + g + "_" + in), b_path = data_file(folder, "b_" + g + "_" + in),
                 c_path = data_file(folder, "c_" + g + "_fp32"), d_path = data_file(folder, "d_" + g + "_" + out);
  const auto a = read_lines(a_path), b = read_lines(b_path), c = read_lines(c_path), d = read_lines(d_path);
  if (a.size() != b.size() || a.size() != c.size() || a.size() != d.size())
    throw std::runtime_error(folder.string() + ": the files hold different numbers of cases");
  // wgmma with FP8 inputs and binary32 output was measured with c = 0 (H100,
  // and H200, whose model is H100's: H200TC.m).
  const bool c_is_zero = (input == formats::e4m3 || input == formats::e5m2) && output == formats::binary32 &&
                         tensor_core_preset(gpu, input, output) == tensor_core_preset("h100", input, output);

  VectorCheck check;
  for (std::size_t i = 0; i < a.size(); ++i) {
    const auto x = parse_hex_line(a[i], a_path, i), y = parse_hex_line(b[i], b_path, i);
    if (x.size() != y.size() || x.empty()) malformed(b_path, i);
    const float z = c_is_zero ? 0.0f : parse_binary_line(c[i], c_path, i);
    const float expected = parse_binary_line(d[i], d_path, i);
    const float got = tensor_core_dot(model, x, y, z);
    if (std::bit_cast<std::uint32_t>(got) == std::bit_cast<std::uint32_t>(expected)) {
      ++check.passed;
      continue;
    }
    ++check.failed;
    if (check.first_failures.size() < 10) {
      std::string text = "case " + std::to_string(i + 1) + ": a =";
      // Appended piece by piece (GCC 12 warns wrongly about "literal" + string here).
      for (float v : x) text.append(" ").append(hex(v));
      text.append("; b =");
      for (float v : y) text.append(" ").append(hex(v));
      text.append("; c = ")
          .append(hex(z))
          .append("; expected ")
          .append(hex(expected))
          .append(", got ")
          .append(hex(got));
      check.first_failures.push_back(std::move(text));
    }
  }
  return check;
}

}  // namespace mpsim
