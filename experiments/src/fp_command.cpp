#include "fp_command.hpp"

#include <fmt/core.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <array>
#include <cctype>
#include <charconv>
#include <cstdint>
#include <iostream>
#include <iterator>
#include <limits>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "mpsim/emulation/block_format.hpp"
#include "mpsim/emulation/quantize.hpp"
#include "mpsim/emulation/scale_format.hpp"
#include "mpsim/emulation/testfloat.hpp"
#include "usage_error.hpp"
#include "value_text.hpp"

namespace mpsim::cli {
namespace {

constexpr std::string_view all_formats[] = {"binary16", "bfloat16", "tf32", "e4m3", "e5m2", "binary32"};

// A format to round into: a Format, or a block scale's format (OCP MX's E8M0,
// NVFP4's UE4M3: no sign, E8M0 no zero; scale_format.hpp), which `fp round`
// and `fp info` take by those names ("e8m0" is the scale, not an eXmY format
// with a sign bit and no mantissa).
struct Target {
  Format format;
  std::optional<ScaleFormat> scale;
  bool saturate = true;  // scales: overflow gives the largest scale (":nosat": NaN, as neither has an infinity)
  std::string name() const {
    return scale ? std::string(to_string(*scale)) + (saturate ? "" : ":nosat") : format.name();
  }
};

std::optional<Target> scale_target(std::string token) {
  std::transform(token.begin(), token.end(), token.begin(), [](unsigned char ch) { return std::tolower(ch); });
  Target t;
  if (token.size() > 6 && token.ends_with(":nosat")) {
    token.resize(token.size() - 6);
    t.saturate = false;
  }
  if (token != "e8m0" && token != "ue4m3") return std::nullopt;
  t.scale = parse_scale_format(token);
  return t.scale ? std::optional<Target>(t) : std::nullopt;
}

Target format_from(const std::string& token) {
  if (auto t = scale_target(token)) return *t;
  if (auto f = parse_format(token)) return Target{*f};
  throw UsageError(fmt::format("unknown format '{}'. Accepted: {}; the block scales e8m0 and ue4m3 (add :nosat "
                               "for NaN on overflow)",
                               token, format_names()));
}

std::vector<Target> formats_from(const std::string& list) {
  std::vector<Target> result;
  if (list == "all") {
    for (auto name : all_formats) result.push_back(Target{*parse_format(name)});
    return result;
  }
  std::size_t start = 0;
  while (start <= list.size()) {
    const auto comma = list.find(',', start);
    result.push_back(format_from(list.substr(start, comma == std::string::npos ? std::string::npos : comma - start)));
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return result;
}

// Prints rows (the first a header) as columns as wide as their widest cell.
template <std::size_t N>
void print_table(const std::vector<std::array<std::string, N>>& rows) {
  std::array<std::size_t, N> width{};
  for (const auto& row : rows)
    for (std::size_t c = 0; c < N; ++c) width[c] = std::max(width[c], row[c].size());
  for (const auto& row : rows) {
    std::string line;
    for (std::size_t c = 0; c + 1 < N; ++c) line += fmt::format("{:<{}}  ", row[c], width[c]);
    fmt::print("{}{}\n", line, row.back());
  }
}

RoundingMode mode_from(const std::string& token) {
  if (auto m = parse_rounding_mode(token)) return *m;
  throw UsageError(fmt::format("unknown rounding mode '{}'. Accepted: {}", token, rounding_mode_names()));
}

// --seed's text (a leading space trimmed: main() spaces out "-.5"): a whole
// decimal number from 0 to 2^64 - 1, and only with stochastic rounding, the one mode that
// draws: a seed that changes nothing would hide that the run is deterministic.
std::uint64_t seed_from(const std::optional<std::string>& given, RoundingMode mode) {
  if (!given) return 0;
  std::string text = *given;
  text.erase(0, text.find_first_not_of(' '));
  std::uint64_t seed = 0;
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), seed);
  if (error != std::errc{} || end != text.data() + text.size())
    throw UsageError(fmt::format("--seed '{}' is not a seed: give a whole number from 0 to {}", text,
                                 std::numeric_limits<std::uint64_t>::max()));
  if (mode != RoundingMode::stochastic)
    throw UsageError(fmt::format("--seed {} changes nothing: only stochastic rounding draws random numbers. Add "
                                 "--rounding stochastic, or leave --seed out",
                                 text));
  return seed;
}

struct RoundArgs {
  std::string formats = "all";
  std::string mode = "nearest-even";
  std::optional<std::string> seed;
  int random_bits = 32;
  std::vector<std::string> values;
};

int run_round(const RoundArgs& args) {
  const auto formats = formats_from(args.formats);
  const Rounding rounding{mode_from(args.mode), args.random_bits};
  if (args.random_bits < 1 || args.random_bits > 32)
    throw UsageError(fmt::format("--random-bits {} is outside 1..32", args.random_bits));
  const std::uint64_t seed = seed_from(args.seed, rounding.mode);
  std::vector<std::string> values = args.values;
  if (values.empty())  // values on standard input, separated by white space
    values.assign(std::istream_iterator<std::string>(std::cin), std::istream_iterator<std::string>());
  for (std::string& v : values) v.erase(0, v.find_first_not_of(' '));  // " -inf": see main.cpp
  if (values.empty())
    throw UsageError("no values to round: give them as arguments (mpsim fp round -f e4m3 0.3 -1e-5) or on stdin, "
                     "separated by spaces or newlines");
  std::vector<ParsedNumber> numbers;
  for (const auto& v : values) numbers.push_back(parse_number(v));  // all checked before any output

  const DrawKey key = make_draw_key({seed, 0});
  fmt::print("rounding: {}{}\n", to_string(rounding.mode),
             rounding.mode == RoundingMode::stochastic
                 ? fmt::format(" (seed {}, {} random bits; value i draws index i)", seed, rounding.random_bits)
                 : "");
  // Rows first, then print_table.
  std::vector<std::array<std::string, 7>> rows{{"input", "format", "value (exact)", "hex", "bits", "class", "flags"}};
  for (std::size_t i = 0; i < numbers.size(); ++i) {
    for (const auto& target : formats) {
      if (target.scale) {
        // Scales have at most 4 significant bits: rounding the text's round-to-odd binary64 neighbour is the
        // text rounded once, in every deterministic mode (Boldo and Melquiond 2008).
        const ScaleFormat s = *target.scale;
        const Rounded r = round_to_scale(s, rounding, numbers[i].odd, target.saturate, random_draw(key, i));
        const auto code = static_cast<std::uint32_t>(r.bits.value);
        const double value = scale_value(s, code);
        const bool e8m0 = s == ScaleFormat::e8m0;
        const std::string bits = e8m0 ? fmt::format("{:08b}", code)
                                      : fmt::format("{:04b} {:03b}", code >> 3, code & 7);
        const char* kind = std::isnan(value)               ? "nan"
                           : value == 0                    ? "zero"
                           : !e8m0 && (code >> 3) == 0     ? "subnormal"
                                                           : "normal";
        rows.push_back({values[i], target.name(), exact_scientific(value), hex_float(value),
                        fmt::format("0x{:02x} {}", code, bits), kind, flags_to_string(r.flags)});
        continue;
      }
      const Format& f = target.format;
      const Rounded r = round_text(f, rounding, numbers[i], random_draw(key, i));
      const double value = to_double(f, r.bits);
      rows.push_back({values[i], f.name(), exact_scientific(value), hex_float(value),
                      fmt::format("0x{:0{}x} {}", r.bits.value, (f.total_bits() + 3) / 4, bit_string(f, r.bits)),
                      std::string(class_name(classify(f, r.bits))),
                      flags_to_string(r.flags)});
    }
  }
  print_table(rows);
  return 0;
}

int run_info(const std::string& format_text) {
  for (const auto& target : formats_from(format_text)) {
    auto line = [](std::string_view key, const std::string& value) { fmt::print("  {:<20} {}\n", key, value); };
    auto number = [](double v) { return fmt::format("{}  ({})", hex_float(v), exact_scientific(v)); };
    if (target.scale) {
      const bool e8m0 = *target.scale == ScaleFormat::e8m0;
      fmt::print("{}\n", target.name());
      line("layout", e8m0 ? "no sign, 8 exponent bits, no mantissa (OCP MX v1.0 block scale)"
                          : "no sign, 4 exponent, 3 mantissa bits (NVFP4's block scale: E4M3 without its sign)");
      line("bias", e8m0 ? "127" : "7");
      line("zero", e8m0 ? "none: below 2^-127 rounds to 2^-127 (underflow)" : "code 0x00");
      line("smallest", number(scale_value(*target.scale, e8m0 ? 0x00 : 0x01)));
      line("largest finite", number(scale_value(*target.scale, e8m0 ? 0xFE : kUe4m3Largest)));
      line("NaN encodings", e8m0 ? "0xFF" : "0x7F");
      line("infinity", "no");
      line("negative values", "NaN (invalid); UE4M3 takes -0 as +0");
      line("overflow", target.saturate ? "saturates to the largest scale" : "NaN (:nosat)");
      continue;
    }
    const Format& f = target.format;
    fmt::print("{}\n", f.name());
    line("layout", fmt::format("1 sign, {} exponent, {} mantissa bits ({} in all)", f.exponent_bits,
                               f.mantissa_bits, f.total_bits()));
    line("precision", fmt::format("{} bits", f.precision()));
    line("bias", std::to_string(f.bias()));
    line("emin, emax", fmt::format("{}, {}", f.emin(), f.emax()));
    line("smallest subnormal", f.subnormals == Subnormals::gradual ? number(f.smallest_subnormal()) : "none (flushed to zero)");
    line("smallest normal", number(f.smallest_normal()));
    line("largest finite", number(f.largest_finite()));
    line("unit roundoff", number(f.unit_roundoff()));
    line("machine epsilon", number(f.machine_epsilon()));
    line("infinity", f.has_infinity() ? "yes" : "no");
    line("NaN encodings", f.has_infinity() ? "all-ones exponent, nonzero mantissa"
                          : f.has_nan()    ? "all-ones exponent and mantissa only"
                                           : "none (every encoding is finite; a NaN converts to +largest, invalid)");
    line("subnormals", f.subnormals == Subnormals::gradual ? "gradual underflow" : "flushed to zero (read as zero)");
    line("overflow", f.overflow == Overflow::saturate ? "saturates to the largest finite"
                                                      : "IEEE 754: infinity or largest finite by rounding direction"
                                                        " (NaN where there is no infinity)");
  }
  return 0;
}

int run_testfloat(const std::vector<std::string>& words) {
  std::string function_name, mode_name;
  for (const auto& w : words) {
    if (!w.empty() && w[0] == '-') mode_name = w.substr(1);
    else function_name = w;
  }
  std::string functions;
  for (auto fn : testfloat_functions()) functions += std::string(functions.empty() ? "" : ", ") + std::string(to_string(fn));
  const auto function = parse_testfloat_function(function_name);
  if (!function)
    throw UsageError(fmt::format("unknown TestFloat function '{}'. Accepted: {}", function_name, functions));
  const auto mode = mode_name.empty() ? std::optional{RoundingMode::nearest_even} : parse_testfloat_rounding(mode_name);
  if (!mode)
    throw UsageError(fmt::format("unknown TestFloat rounding '-{}'. Accepted: -rnear_even, -rnear_maxMag, -rminMag, "
                                 "-rmin, -rmax, -rodd",
                                 mode_name));
  TestFloatReport report;
  try {
    report = check_testfloat(std::cin, *function, *mode);
  } catch (const std::invalid_argument& e) {
    throw UsageError(e.what());
  }
  // No vectors checks nothing: an empty pipe (a generator that failed, a wrong
  // file) must not read as a pass.
  if (report.passed + report.failed == 0)
    throw UsageError(fmt::format("no TestFloat lines on stdin, nothing was checked; pipe the generator's output in, "
                                 "e.g. testfloat_gen {} -{} | mpsim fp testfloat {} -{}",
                                 function_name, mode_name.empty() ? "rnear_even" : mode_name, function_name,
                                 mode_name.empty() ? "rnear_even" : mode_name));
  for (const auto& line : report.first_mismatches) fmt::print("{}\n", line);
  fmt::print("{} passed, {} failed\n", report.passed, report.failed);
  return report.failed == 0 ? 0 : 1;
}

struct QuantizeArgs {
  std::string format;
  std::string scale_rounding;
  std::optional<std::string> block;
  std::string mode = "nearest-even";
  std::optional<std::string> seed;
  bool values_only = false;
  bool scales = false;
  std::vector<std::string> values;
};

// Block-scaled quantization of one 1-D tensor: the values (binary32, rounded
// to nearest from the text) split into consecutive blocks.
int run_quantize(const QuantizeArgs& args) {
  auto format = parse_block_format(args.format);
  if (!format) throw UsageError(fmt::format("unknown block format '{}'. Accepted: {}", args.format, block_format_names()));
  if (!args.scale_rounding.empty()) {
    if (format->scale != ScaleFormat::e8m0)
      throw UsageError(fmt::format("--scale-rounding applies to the MX formats (E8M0 scales), not to {}", args.format));
    if (args.scale_rounding == "floor") format->rule = ScaleRule::ocp_floor;
    else if (args.scale_rounding == "ceil") format->rule = ScaleRule::ceil;
    else throw UsageError(fmt::format("unknown --scale-rounding '{}'. Accepted: floor (OCP MX v1.0), ceil (never saturates)",
                                      args.scale_rounding));
  }
  if (args.block) {
    std::string text = *args.block;
    text.erase(0, text.find_first_not_of(' '));  // main() spaces out arguments that start with '-'
    std::int32_t block = 0;
    const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), block);
    if (error != std::errc{} || end != text.data() + text.size() || block < 1)
      throw UsageError(fmt::format("--block '{}' is not a block size: give a whole number from 1 to {} (values per "
                                   "block), or leave --block out for the format's own ({})",
                                   text, std::numeric_limits<std::int32_t>::max(), format->block_cols));
    format->block_rows = 1, format->block_cols = block;
  }
  if (args.values_only && args.scales) throw UsageError("--values-only and --scales print different things: give one");
  const RoundingMode mode = mode_from(args.mode);
  if (mode != RoundingMode::nearest_even && mode != RoundingMode::stochastic)
    throw UsageError(fmt::format("block formats round elements to nearest-even or stochastic, not {}", args.mode));
  const std::uint64_t seed = seed_from(args.seed, mode);
  std::vector<std::string> values = args.values;
  if (values.empty()) values.assign(std::istream_iterator<std::string>(std::cin), std::istream_iterator<std::string>());
  for (std::string& v : values) v.erase(0, v.find_first_not_of(' '));
  if (values.empty())
    throw UsageError("no values to quantize: give them as arguments (mpsim fp quantize --format mxfp4 1 2.5 -0.1) "
                     "or on stdin, separated by spaces or newlines");
  std::vector<float> x;
  for (const auto& v : values) {  // all checked before any output
    const ParsedNumber number = parse_number(v);
    const Rounded r = round_to_format(formats::binary32, Rounding{}, number.odd);
    x.push_back(std::bit_cast<float>(static_cast<std::uint32_t>(r.bits.value)));
    // A finite number past binary32's range would become an infinity and make its block NaN: say so instead.
    // (Only "inf" parses exactly to an infinity; 1e400 lies between DBL_MAX and it.)
    if (std::isinf(x.back()) && !(number.exact && std::isinf(number.odd)))
      throw UsageError(fmt::format("'{}' is beyond binary32's range (largest finite 0x1.fffffep+127, about "
                                   "3.4028235e38), and the tensor quantized is binary32: give a smaller value, or inf "
                                   "for an infinity",
                                   v));
  }
  BlockQuantizeOptions options;
  options.rounding = Rounding{mode};
  options.key = {seed, 0};
  const BlockQuantized q = quantize_blocks(*format, x, 1, static_cast<std::int64_t>(x.size()), options);
  const std::string name = format->name();
  *format = format->for_shape(1, static_cast<std::int64_t>(x.size()));  // a whole-tensor block: its shape here
  const auto text = [](double v) { return std::isnan(v) ? std::string("nan") : hex_float(v); };
  const bool two_level = format->rule == ScaleRule::nvfp4 || format->rule == ScaleRule::nvfp4_te;
  if (args.values_only) {
    for (double v : q.values) fmt::print("{}\n", text(v));
    return 0;
  }
  if (args.scales) {
    if (two_level) fmt::print("tensor_scale {}\n", text(q.tensor_scale));
    for (double s : q.scales) fmt::print("{}\n", text(s));
    return 0;
  }
  fmt::print("format: {} ({}, {}x{} blocks, {} scales, rule {}); elements rounded {}{}\n", name,
             format->element.name(), format->block_rows, format->block_cols, to_string(format->scale),
             to_string(format->rule), to_string(mode), mode == RoundingMode::stochastic ? fmt::format(", seed {}", seed) : "");
  if (two_level) fmt::print("tensor scale: {}\n", text(q.tensor_scale));
  std::vector<std::array<std::string, 6>> rows{{"input", "value (exact)", "hex", "element", "block", "scale"}};
  const int element_digits = ((format->element.floating ? format->element.floating->total_bits() : format->element.integer_bits) + 3) / 4;
  for (std::size_t i = 0; i < x.size(); ++i) {
    const std::size_t block = i / static_cast<std::size_t>(format->block_cols);
    rows.push_back({values[i], std::isnan(q.values[i]) ? "nan" : exact_scientific(q.values[i]), text(q.values[i]),
                    fmt::format("0x{:0{}x}", q.elements[i], element_digits), std::to_string(block),
                    fmt::format("{} (0x{:x})", text(q.scales[block]), q.scale_codes[block])});
  }
  print_table(rows);
  const BlockCounts& c = q.counts;
  fmt::print("{} values in {} blocks: {} saturated, {} flushed to zero inside their block, {} NaN; {} blocks' scales at "
             "their range's limit\n",
             c.elements, q.scales.size(), c.saturated, c.flushed, c.nan, c.scale_clamped);
  return 0;
}

}  // namespace

void add_fp_command(CLI::App& app, std::function<int()>& run) {
  auto* fp = app.add_subcommand("fp", "The low-precision emulator: round values, show formats, check TestFloat vectors");
  fp->require_subcommand(1);

  auto round_args = std::make_shared<RoundArgs>();
  auto* round = fp->add_subcommand("round", "Round values into formats once, with the result's bits, class and flags");
  round->add_option("--format,-f", round_args->formats,
                    "Format, comma-separated formats, or 'all' (the presets): " + std::string(format_names()) +
                        "; the block scales e8m0 (OCP MX) and ue4m3 (NVFP4), :nosat for NaN on overflow")
      ->capture_default_str();
  round->add_option("--rounding,-r", round_args->mode, "Rounding mode: " + std::string(rounding_mode_names()))
      ->capture_default_str();
  round->add_option("--seed", round_args->seed,
                    "Seed of stochastic rounding's draws, 0 to 2^64-1 (value i draws index i); default 0");
  round->add_option("--random-bits", round_args->random_bits, "Random bits of stochastic rounding, 1..32")
      ->capture_default_str();
  round->add_option("values", round_args->values, "Values (decimal, 0x1.8p-3, inf, nan); read from stdin if none");
  round->callback([&run, round_args] { run = [round_args] { return run_round(*round_args); }; });

  auto info_format = std::make_shared<std::string>("all");
  auto* info = fp->add_subcommand("info", "A format's parameters");
  info->add_option("--format,-f", *info_format, "Format, comma-separated formats, or 'all'")->capture_default_str();
  info->callback([&run, info_format] { run = [info_format] { return run_info(*info_format); }; });

  auto quantize_args = std::make_shared<QuantizeArgs>();
  auto* quantize = fp->add_subcommand(
      "quantize", "Quantize values into a block-scaled format (one 1-D tensor in consecutive blocks)");
  quantize->add_option("--format,-f", quantize_args->format, "Block format: " + std::string(block_format_names()))
      ->required();
  quantize->add_option("--scale-rounding", quantize_args->scale_rounding,
                       "MX scales: floor (OCP MX v1.0, elements may saturate) or ceil (never saturates)");
  quantize->add_option("--block", quantize_args->block, "Block size N (1xN blocks) instead of the format's");
  quantize->add_option("--rounding,-r", quantize_args->mode, "Element rounding: nearest-even or stochastic")
      ->capture_default_str();
  quantize->add_option("--seed", quantize_args->seed,
                       "Seed of stochastic rounding, 0 to 2^64-1 (value i draws index i); default 0");
  quantize->add_flag("--values-only", quantize_args->values_only,
                     "One line per input: the dequantized value as a C99 hex float (or inf, -inf, nan)");
  quantize->add_flag("--scales", quantize_args->scales,
                     "One line per block: its decoded scale (nvfp4: a first line 'tensor_scale X')");
  quantize->add_option("values", quantize_args->values, "Values (decimal, 0x1.8p-3, inf, nan); read from stdin if none");
  quantize->callback([&run, quantize_args] { run = [quantize_args] { return run_quantize(*quantize_args); }; });

  auto* testfloat = fp->add_subcommand(
      "testfloat", "Check the emulator against TestFloat lines on stdin: FUNCTION -MODE (e.g. f16_add -rnear_even)");
  testfloat->allow_extras();
  testfloat->callback([&run, testfloat] {
    const auto words = testfloat->remaining();
    run = [words] { return run_testfloat(words); };
  });
}

}  // namespace mpsim::cli
