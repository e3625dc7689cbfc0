// fuzz_parsers: a seeded, bounded mutation fuzzer for every parser that reads
// a user's input (issue 18 §2): the config and sweep reader (TOML text and
// KEY=VALUE overrides), the IDX data reader, TestFloat lines, the command
// line's number text, format and accumulation-model names.
//
// Each target starts from valid inputs (its seed corpus) and mutates them
// (bit flips, byte edits, insertions and deletions, splices, tokens from a
// dictionary that the parser knows), the way libFuzzer's default mutators do,
// but from an explicit seed and for a fixed number of inputs, so a CI run is
// reproducible and bounded. A parser passes when every input either parses or
// is refused with the error type it documents (ConfigError, DataError,
// std::invalid_argument, UsageError, an empty optional). Anything else, an
// unexpected exception type, a crash, or (under the `sanitize` preset's
// AddressSanitizer and UndefinedBehaviorSanitizer) a memory or UB error, is a
// finding: the input is printed as hex, with the seed that replays it.
//
// Usage: fuzz_parsers [--runs N] [--seed S] [--only TARGET]
#include <fmt/core.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <fstream>
#include <functional>
#include <random>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include "mpsim/core/config.hpp"
#include "mpsim/core/data.hpp"
#include "mpsim/core/sweep.hpp"
#include "mpsim/emulation/accumulation.hpp"
#include "mpsim/emulation/format.hpp"
#include "mpsim/emulation/testfloat.hpp"
#include "usage_error.hpp"
#include "value_text.hpp"

namespace {

namespace fs = std::filesystem;
using Bytes = std::string;  // inputs are byte strings; std::string keeps them printable in the report

// A refusal the parser documents: the input is bad, and the parser said so.
struct Refused {};

struct Target {
  std::string name;
  std::vector<Bytes> corpus;
  std::vector<std::string> dictionary;  // tokens the parser knows
  std::function<void(const Bytes&)> run;  // throws Refused for a documented refusal
};

// --- Mutations (libFuzzer's default set, simplified) -------------------------------------

Bytes mutate(Bytes input, const Target& t, std::mt19937_64& rng) {
  auto pick = [&](std::size_t n) { return n == 0 ? 0 : static_cast<std::size_t>(rng() % n); };
  const int rounds = 1 + static_cast<int>(rng() % 4);
  for (int r = 0; r < rounds; ++r) {
    switch (rng() % 7) {
      case 0:  // flip a bit
        if (!input.empty()) input[pick(input.size())] ^= static_cast<char>(1u << (rng() % 8));
        break;
      case 1:  // set a byte to an interesting value
        if (!input.empty()) {
          static constexpr unsigned char interesting[] = {0, 1, 0x7f, 0x80, 0xff, '\n', '"', '[', '=', '-', '.', '9'};
          input[pick(input.size())] = static_cast<char>(interesting[pick(sizeof interesting)]);
        }
        break;
      case 2:  // delete a run
        if (!input.empty()) {
          const std::size_t at = pick(input.size());
          input.erase(at, 1 + pick(std::min<std::size_t>(16, input.size() - at)));
        }
        break;
      case 3:  // duplicate a run
        if (!input.empty()) {
          const std::size_t at = pick(input.size());
          const std::size_t n = 1 + pick(std::min<std::size_t>(32, input.size() - at));
          input.insert(pick(input.size() + 1), input.substr(at, n));
        }
        break;
      case 4:  // insert a dictionary token
        if (!t.dictionary.empty()) input.insert(pick(input.size() + 1), t.dictionary[pick(t.dictionary.size())]);
        break;
      case 5: {  // splice with another corpus entry
        const Bytes& other = t.corpus[pick(t.corpus.size())];
        input = input.substr(0, pick(input.size() + 1)) + other.substr(pick(other.size() + 1));
        break;
      }
      case 6:  // random bytes
        input.insert(pick(input.size() + 1), 1 + pick(8), static_cast<char>(rng()));
        break;
    }
  }
  if (input.size() > 4096) input.resize(4096);
  return input;
}

std::string hex(const Bytes& b) {
  std::string out;
  for (unsigned char c : b) out += fmt::format("{:02x}", c);
  return out;
}

// --- Targets ---------------------------------------------------------------------------

Target config_target() {
  Target t;
  t.name = "config";
  t.corpus = {
      "name = \"x\"\narms = [\"fp16-mixed\"]\n[data]\ndataset = \"synthetic\"\n[train]\nepochs = 1\nbatch_size = 64\n",
      "arms = [\"fp32\", \"fp8\"]\n[optimizer]\nkind = \"adamw\"\nlr = 0.001\nweight_decay = 0.01\n",
      "arms = [\"x\"]\n[policies.x]\nbase = \"fp8\"\nweights = \"e4m3\"\ngradient_operands = \"e5m2\"\n[policies.x.loss_scale]\ninitial = 1024.0\n",
      "[sweep]\n\"optimizer.lr\" = [0.01, 0.1]\n\"train.epochs+optimizer.lr\" = [[1, 0.1], [2, 0.2]]\n[smoke]\ntrain.epochs = 1\n",
      "[model]\nkind = \"cnn\"\nhidden = [32, 16]\nactivation = \"gelu\"\nlayer_norm = true\n",
  };
  t.dictionary = {"[", "]", "\"", "=", "\n", "[[", "]]", "{", "}", ".", ",", "1e308", "-1", "nan", "inf", "0x10",
                  "true", "\"\"", "arms", "sweep", "smoke", "policies", "train", "epochs", "model", "hidden",
                  "optimizer", "lr", "loss_scale", "seeds", "backends", "data", "+", "\\u0000", "#"};
  t.run = [](const Bytes& text) {
    try {
      // --smoke where the text has a [smoke] table to apply.
      const bool smoke = text.find("[smoke]") != Bytes::npos;
      const mpsim::core::Sweep s = mpsim::core::parse_sweep(text, "fuzz.toml", {}, smoke);
      static_cast<void>(s);
    } catch (const mpsim::core::ConfigError&) {
      throw Refused{};
    }
  };
  return t;
}

Target override_target() {
  Target t;
  t.name = "overrides";
  t.corpus = {"train.epochs=2", "arms=[\"fp32\",\"fp8\"]", "optimizer.lr=0.01,0.1", "policies.x.weights=e4m3",
              "model.hidden=[32]", "seeds=[1,2]", "policies.fp16-mixed.loss_scale.initial=1,128"};
  t.dictionary = {"=", ",", "[", "]", "\"", ".", "+", "nan", "-inf", "1e999", "policies.", "train.", "0x"};
  t.run = [](const Bytes& override_text) {
    try {
      mpsim::core::parse_sweep("arms = [\"fp32\"]\n[data]\ndataset = \"synthetic\"\n", "fuzz.toml", {override_text},
                               false);
    } catch (const mpsim::core::ConfigError&) {
      throw Refused{};
    }
  };
  return t;
}

// An IDX pair (images, labels) as one input: the first byte splits it.
Bytes idx_pair(std::uint32_t count, std::uint32_t rows, std::uint32_t cols) {
  auto be32 = [](Bytes& b, std::uint32_t v) {
    for (int s = 24; s >= 0; s -= 8) b += static_cast<char>((v >> s) & 0xff);
  };
  Bytes images = {0, 0, 8, 3};
  be32(images, count), be32(images, rows), be32(images, cols);
  images.append(static_cast<std::size_t>(count) * rows * cols, '\x40');
  Bytes labels = {0, 0, 8, 1};
  be32(labels, count);
  labels.append(count, '\x03');
  return std::string{static_cast<char>(images.size() >> 8), static_cast<char>(images.size() & 0xff)} + images + labels;
}

Target idx_target(const fs::path& scratch) {
  Target t;
  t.name = "idx";
  t.corpus = {idx_pair(2, 3, 3), idx_pair(1, 28, 28), idx_pair(3, 1, 1), idx_pair(4, 2, 5)};
  t.dictionary = {std::string("\x00\x00\x08\x03", 4), std::string("\x00\x00\x08\x01", 4),
                  std::string("\xff\xff\xff\xff", 4), std::string("\x00\x00\x00\x00", 4), std::string("\x1f\x8b", 2)};
  t.run = [scratch](const Bytes& input) {
    // The first two bytes give the images file's length; the labels file is the rest.
    const std::size_t head = std::min<std::size_t>(2, input.size());
    std::size_t length = 0;
    for (std::size_t i = 0; i < head; ++i) length = length << 8 | static_cast<unsigned char>(input[i]);
    const Bytes body = input.substr(head);
    length = std::min(length, body.size());
    const fs::path images = scratch / "images.idx", labels = scratch / "labels.idx";
    std::ofstream(images, std::ios::binary) << body.substr(0, length);
    std::ofstream(labels, std::ios::binary) << body.substr(length);
    try {
      const mpsim::core::Dataset d = mpsim::core::read_idx_images(images, labels);
      static_cast<void>(d);
    } catch (const mpsim::core::DataError&) {
      throw Refused{};
    }
  };
  return t;
}

Target testfloat_target() {
  Target t;
  t.name = "testfloat";
  t.corpus = {"3C00 3C00 4000 00\n", "7BFF 7BFF 7C00 05\nFC00 7C00 7E00 10\n", "0001 8001 0000 00\n",
              "3C00 4000 4200 00\n"};
  t.dictionary = {" ", "\n", "7C00", "FFFF", "00", "10", "01", "0x", "-", "\t", "\r\n", "3C00 3C00"};
  t.run = [](const Bytes& lines) {
    std::istringstream in(lines);
    try {
      mpsim::check_testfloat(in, mpsim::TestFloatFunction::f16_add, mpsim::RoundingMode::nearest_even);
    } catch (const std::invalid_argument&) {
      throw Refused{};
    }
  };
  return t;
}

Target number_target() {
  Target t;
  t.name = "number text";
  t.corpus = {"0.1", "-1e-8", "0x1.8p-3", "inf", "-nan", "1.00048828125000000000001", "3e-5", "70000",
              "4.9406564584124654e-324"};
  t.dictionary = {"e", "p", "0x", ".", "-", "+", "inf", "nan", "999999999", "e-99999", "0000000000"};
  t.run = [](const Bytes& text) {
    try {
      const mpsim::cli::ParsedNumber n = mpsim::cli::parse_number(text);
      for (const mpsim::Format& f : {mpsim::formats::binary16, mpsim::formats::e4m3, mpsim::formats::binary32})
        mpsim::cli::round_text(f, mpsim::Rounding{mpsim::RoundingMode::nearest_even}, n, 0);
    } catch (const mpsim::cli::UsageError&) {
      throw Refused{};
    }
  };
  return t;
}

Target names_target() {
  Target t;
  t.name = "format and model names";
  t.corpus = {"binary16", "e4m3", "e6m9:ftz:sat", "bf16", "h100:e4m3:fp16", "pairwise-fp32", "blocked-fp16-32",
              "exact-fp32:toward-zero", "fp32"};
  t.dictionary = {":", "-", "e", "m", "ftz", "sat", "fn", "inf", "nosat", "999", "h100", "v100", "fp16", "blocked"};
  t.run = [](const Bytes& text) {
    const bool format = mpsim::parse_format(text).has_value();
    bool model = false;
    try {
      model = mpsim::parse_accumulation_model(text).has_value();
    } catch (const std::invalid_argument&) {
    }
    if (!format && !model) throw Refused{};
  };
  return t;
}

}  // namespace

int main(int argc, char** argv) {
  long runs = 20000;
  std::uint64_t seed = 1;
  std::string only;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string_view flag = argv[i];
    if (flag == "--runs") runs = std::atol(argv[i + 1]);
    else if (flag == "--seed") seed = std::strtoull(argv[i + 1], nullptr, 10);
    else if (flag == "--only") only = argv[i + 1];
    else {
      fmt::print(stderr, "usage: fuzz_parsers [--runs N] [--seed S] [--only TARGET]\n");
      return 2;
    }
  }
  const fs::path scratch = fs::temp_directory_path() / fmt::format("mpsim-fuzz-{}", getpid());
  fs::create_directories(scratch);
  const std::vector<Target> targets = {config_target(),    override_target(), idx_target(scratch),
                                       testfloat_target(), number_target(),   names_target()};
  int findings = 0;
  for (const Target& t : targets) {
    if (!only.empty() && t.name != only) continue;
    std::mt19937_64 rng(seed);
    long parsed = 0, refused = 0;
    for (long i = 0; i < runs; ++i) {
      const Bytes& start = t.corpus[rng() % t.corpus.size()];
      const Bytes input = i < static_cast<long>(t.corpus.size()) ? t.corpus[i] : mutate(start, t, rng);
      try {
        t.run(input);
        ++parsed;
      } catch (const Refused&) {
        ++refused;
        // The seeds are valid inputs: a fuzzer whose seeds are refused tests only the first error path.
        if (i < static_cast<long>(t.corpus.size())) {
          ++findings;
          fmt::print("FINDING {}: corpus entry {} is refused: {}\n", t.name, i, t.corpus[i]);
        }
      } catch (const std::exception& e) {
        ++findings;
        fmt::print("FINDING {}: input {} of seed {} threw {}: {}\n  input (hex): {}\n", t.name, i, seed,
                   typeid(e).name(), e.what(), hex(input));
      }
    }
    fmt::print("{:<24} {} inputs: {} parsed, {} refused as documented\n", t.name, runs, parsed, refused);
  }
  fs::remove_all(scratch);
  fmt::print("{} findings\n", findings);
  return findings == 0 ? 0 : 1;
}
