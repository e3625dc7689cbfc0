// Reads the measured tensor-core vectors (gzip text, through zlib), refuses
// damaged ones, and runs the model on every case.
#include "mpsim/emulation/tensor_core_vectors.hpp"

#include <zlib.h>

#include <bit>
#include <cctype>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <stdexcept>

#include "mpsim/emulation/accumulation.hpp"
#include "mpsim/emulation/rounding.hpp"

namespace mpsim {
namespace {

namespace fs = std::filesystem;

std::string lower(std::string_view text) {
  std::string s(text);
  for (char& ch : s) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  return s;
}

// The entry of `dir` named `name` in any case (a folder, or a regular file);
// empty when there is none. Two that differ only in case are refused: which
// one holds the vectors is not ours to guess.
std::string entry_any_case(const fs::path& dir, std::string_view name, bool folder) {
  std::error_code error;
  std::string found;
  for (const auto& entry : fs::directory_iterator(dir, error)) {
    const std::string candidate = entry.path().filename().string();
    if (lower(candidate) != lower(name) || (folder ? !entry.is_directory(error) : !entry.is_regular_file(error)))
      continue;
    if (!found.empty())
      throw std::runtime_error(dir.string() + " holds both " + found + " and " + candidate +
                               ", which differ only in case; keep one of them");
    found = candidate;
  }
  return found;
}

[[noreturn]] void unusable(std::string_view kind, const std::string& what) {
  throw std::runtime_error("measured vectors " + std::string(kind) + ": " + what +
                           "; restore the folder from its source (a fresh copy of shared/tensor-core-vectors, or "
                           "Khattak and Mikaitis's model_validation/)");
}

struct GzCloser {
  void operator()(gzFile file) const { gzclose(file); }
};

// Every line of a gzip text file (a plain file reads the same through zlib).
std::vector<std::string> read_lines(const fs::path& path) {
  std::unique_ptr<gzFile_s, GzCloser> file(gzopen(path.c_str(), "rb"));
  if (!file) unusable("unreadable", path.string() + ": cannot be opened");
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
  const std::string message = gzerror(file.get(), &code);
  if (code != Z_OK && code != Z_STREAM_END)  // zlib's message starts with the path, but for "out of memory"
    unusable("damaged", message.rfind(path.string(), 0) == 0 ? message : path.string() + ": " + message);
  if (!line.empty()) lines.push_back(std::move(line));
  return lines;
}

std::string hex(float x) {
  char text[16];
  std::snprintf(text, sizeof text, "%08x", std::bit_cast<std::uint32_t>(x));
  return text;
}

std::string where(const fs::path& path, std::size_t line) { return path.string() + ":" + std::to_string(line + 1); }

// "3f7aa000 3f87c000 ..." -> floats.
std::vector<float> parse_hex_line(const std::string& text, const fs::path& path, std::size_t line) {
  std::vector<float> values;
  std::size_t pos = 0;
  while (pos < text.size()) {
    while (pos < text.size() && (text[pos] == ' ' || text[pos] == '\t')) ++pos;
    if (pos >= text.size()) break;
    const std::size_t start = pos;
    while (pos < text.size() && text[pos] != ' ' && text[pos] != '\t') ++pos;
    const std::string word = text.substr(start, pos - start);
    std::uint32_t bits = 0;
    bool hex = word.size() == 8;
    for (const char ch : word) {
      const int v = std::isxdigit(static_cast<unsigned char>(ch))
                        ? (std::isdigit(static_cast<unsigned char>(ch)) ? ch - '0' : std::tolower(ch) - 'a' + 10)
                        : -1;
      hex = hex && v >= 0;
      bits = (bits << 4) | static_cast<std::uint32_t>(v & 0xF);
    }
    if (!hex) unusable("damaged", where(path, line) + ": '" + word + "' is not 8 hex digits (a binary32 encoding)");
    values.push_back(std::bit_cast<float>(bits));
  }
  return values;
}

// "00111110100011100000011010101101" -> float.
float parse_binary_line(const std::string& text, const fs::path& path, std::size_t line) {
  std::string_view t = text;
  while (!t.empty() && t.back() == ' ') t.remove_suffix(1);
  std::uint32_t bits = 0;
  bool binary = t.size() == 32;
  for (const char ch : t) {
    binary = binary && (ch == '0' || ch == '1');
    bits = (bits << 1) | static_cast<std::uint32_t>(ch == '1');
  }
  if (!binary) unusable("damaged", where(path, line) + ": '" + std::string(t) + "' is not 32 binary digits");
  return std::bit_cast<float>(bits);
}

// Whether x is exactly a value of f: the vectors hold nothing else
// (shared/tensor-core-vectors/README.md), so anything else is damage that a
// model would silently round away.
bool is_value_of(const Format& f, float x) {
  if (std::isnan(x)) return f.has_nan();
  const float back = to_float(f, round_to_format(f, Rounding{RoundingMode::nearest_even}, x).bits);
  return std::bit_cast<std::uint32_t>(back) == std::bit_cast<std::uint32_t>(x);
}

void check_values(const std::vector<float>& values, const Format& f, const fs::path& path, std::size_t line) {
  for (const float x : values)
    if (!is_value_of(f, x))
      unusable("damaged", where(path, line) + ": " + hex(x) + " is not a " + f.name() +
                              " value (every value in the files is exact in its format)");
}

}  // namespace

std::string tensor_core_vector_folder(const fs::path& dir, std::string_view gpu) {
  return entry_any_case(dir, gpu, true);
}

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

MeasuredFiles find_measured_files(const fs::path& dir, std::string_view gpu, const Format& input,
                                  const Format& output) {
  const std::string in = tensor_core_vector_name(input, false), out = tensor_core_vector_name(output, true);
  if (in.empty() || out.empty())
    throw std::invalid_argument("no tensor-core vectors for " + input.name() + " -> " + output.name());
  MeasuredFiles files{std::string(gpu), input, output, {}, {}, {}, {}, {}};
  const std::string gpu_folder = tensor_core_vector_folder(dir, gpu);
  const std::string spelled_gpu = gpu_folder.empty() ? std::string(gpu) : gpu_folder;  // in the names looked for
  const std::string format_folder = entry_any_case(dir / spelled_gpu, in, true);
  files.folder = dir / spelled_gpu / (format_folder.empty() ? in : format_folder);
  auto file = [&](const std::string& stem) {
    for (const char* extension : {".txt.gz", ".txt"})
      if (const std::string name = entry_any_case(files.folder, stem + extension, false); !name.empty())
        return MeasuredFile{files.folder / name, true};
    return MeasuredFile{files.folder / (stem + ".txt.gz"), false};
  };
  files.a = file("a_" + spelled_gpu + "_" + in);
  files.b = file("b_" + spelled_gpu + "_" + in);
  files.c = file("c_" + spelled_gpu + "_fp32");
  files.d = file("d_" + spelled_gpu + "_" + out);
  return files;
}

std::vector<MeasuredCase> read_measured_cases(const MeasuredFiles& files) {
  for (const MeasuredFile* f : {&files.a, &files.b, &files.c, &files.d})
    if (!f->found)
      unusable("incomplete", f->path.string() + " is missing (nor " + f->path.stem().string() + ")");
  const auto a = read_lines(files.a.path), b = read_lines(files.b.path), c = read_lines(files.c.path),
             d = read_lines(files.d.path);
  auto name = [](const MeasuredFile& f) { return f.path.filename().string(); };
  if (a.size() != b.size() || a.size() != c.size() || a.size() != d.size())
    unusable("damaged", "the files in " + files.folder.string() + " hold different numbers of cases: " + name(files.a) +
                            " " + std::to_string(a.size()) + ", " + name(files.b) + " " + std::to_string(b.size()) +
                            ", " + name(files.c) + " " + std::to_string(c.size()) + ", " + name(files.d) + " " +
                            std::to_string(d.size()));
  if (a.empty()) unusable("damaged", "the files in " + files.folder.string() + " hold no cases");
  // wgmma with FP8 inputs and binary32 output was measured with c = 0 (H100,
  // and H200, whose model is H100's: H200TC.m).
  const bool c_is_zero = (files.input == formats::e4m3 || files.input == formats::e5m2) &&
                         files.output == formats::binary32 &&
                         tensor_core_preset(files.gpu, files.input, files.output) ==
                             tensor_core_preset("h100", files.input, files.output);
  std::vector<MeasuredCase> cases(a.size());
  for (std::size_t i = 0; i < a.size(); ++i) {
    MeasuredCase& one = cases[i];
    one.a = parse_hex_line(a[i], files.a.path, i);
    one.b = parse_hex_line(b[i], files.b.path, i);
    if (one.a.size() != one.b.size())
      unusable("damaged", where(files.a.path, i) + " holds " + std::to_string(one.a.size()) + " values but " +
                              name(files.b) + ":" + std::to_string(i + 1) + " holds " + std::to_string(one.b.size()));
    if (one.a.empty())
      unusable("damaged", where(files.a.path, i) + " and its line in " + name(files.b) + " hold no values");
    check_values(one.a, files.input, files.a.path, i);
    check_values(one.b, files.input, files.b.path, i);
    const float c_read = parse_binary_line(c[i], files.c.path, i);
    one.c = c_is_zero ? 0.0f : c_read;
    one.d = parse_binary_line(d[i], files.d.path, i);
    check_values({one.d}, files.output, files.d.path, i);
  }
  return cases;
}

VectorCheck check_measured_cases(std::span<const MeasuredCase> cases, const TensorCoreModel& model) {
  VectorCheck check;
  for (std::size_t i = 0; i < cases.size(); ++i) {
    const MeasuredCase& one = cases[i];
    const float got = tensor_core_dot(model, one.a, one.b, one.c);
    if (std::bit_cast<std::uint32_t>(got) == std::bit_cast<std::uint32_t>(one.d)) {
      ++check.passed;
      continue;
    }
    ++check.failed;
    if (check.first_failures.size() < 10) {
      std::string text = "case " + std::to_string(i + 1) + ": a =";
      // Appended piece by piece (GCC 12 warns wrongly about "literal" + string here).
      for (float v : one.a) text.append(" ").append(hex(v));
      text.append("; b =");
      for (float v : one.b) text.append(" ").append(hex(v));
      text.append("; c = ")
          .append(hex(one.c))
          .append("; expected ")
          .append(hex(one.d))
          .append(", got ")
          .append(hex(got));
      check.first_failures.push_back(std::move(text));
    }
  }
  return check;
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
  return check_measured_cases(read_measured_cases(find_measured_files(dir, gpu, input, output)), model);
}

}  // namespace mpsim
