// The experiment engine (core/src/experiment.cpp) and the arm result file
// (core/src/arm_result_file.cpp): every field of the table survives a round
// trip bit for bit; a short, foreign or mismatched file is refused with a
// message naming the file and the field; the plan's order; a small serial
// experiment run through the same call `mpsim run` makes.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <numbers>
#include <type_traits>
#include <unistd.h>

#include "mpsim/core/arm_result_file.hpp"
#include "mpsim/core/experiment.hpp"

using namespace mpsim::core;
namespace fs = std::filesystem;

namespace {

fs::path scratch(const std::string& name) {
  const fs::path dir = fs::temp_directory_path() / ("mpsim-test-experiment-" + std::to_string(getpid()));
  fs::create_directories(dir);
  return dir / name;
}

// A value for field i that no other field has, and that a byte swap, a lost
// sign or a rounding through float would change.
void set_distinct(std::string& v, std::size_t i) { v = "stopped: field " + std::to_string(i) + " \xce\xb5"; }
void set_distinct(std::int64_t& v, std::size_t i) { v = -(std::int64_t{0x0102030405060708} + static_cast<std::int64_t>(i)); }
void set_distinct(double& v, std::size_t i) { v = std::ldexp(1.0 + std::ldexp(static_cast<double>(i + 1), -50), -30); }
void set_distinct(std::vector<double>& v, std::size_t i) {
  v = {static_cast<double>(i), -0.0, std::numeric_limits<double>::infinity(), std::nan("0x5"),
       std::numeric_limits<double>::denorm_min(), 0.1 * static_cast<double>(i)};
}
void set_distinct(LayerStats& v, std::size_t i) {
  v.assign(3, {});
  for (std::size_t layer = 0; layer < v.size(); ++layer)
    for (int kind = 0; kind < tensor_kind_count; ++kind) {
      TensorStats& s = v[layer][static_cast<std::size_t>(kind)];
      for (std::size_t bin = 0; bin < s.histogram.size(); ++bin) s.histogram[bin] = (i << 40) + layer * 100000 + bin;
      for (std::size_t c = 0; c < s.counters.size(); ++c) s.counters[c] = ~std::uint64_t{0} - c - 7 * layer;
    }
}

// Bit for bit (NaN payloads and -0.0 included).
template <typename T>
bool same_bits(const T& a, const T& b) {
  if constexpr (std::is_trivially_copyable_v<T>) {
    return std::memcmp(&a, &b, sizeof(T)) == 0;
  } else {
    return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(*a.data())) == 0;
  }
}

ArmResult distinctive_result() {
  ArmResult r;
  for (std::size_t i = 0; i < arm_result_fields.size(); ++i)
    std::visit([&](auto member) { set_distinct(r.*member, i); }, arm_result_fields[i].member);
  return r;
}

std::string read_error(const fs::path& path) {
  try {
    read_arm_result(path);
  } catch (const std::runtime_error& e) {
    return e.what();
  }
  return "no error";
}

void patch(const fs::path& path, std::streamoff offset, const std::string& bytes) {
  std::fstream f(path, std::ios::binary | std::ios::in | std::ios::out);
  f.seekp(offset);
  f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

const std::string tiny =
    "name = \"tiny\"\narms = [\"fp32\", \"fp16-naive\"]\n"
    "[data]\ndataset = \"synthetic\"\nsynthetic_train = 256\nsynthetic_test = 64\n"
    "[model]\nhidden = [16]\n[train]\nbatch_size = 64\nthreads = 1\nstats_interval = 2\n";

}  // namespace

TEST_CASE("arm result file: every field of the table round-trips bit for bit", "[experiment][result-file]") {
  const ArmResult written = distinctive_result();
  // Not the defaults: every field was set.
  CHECK(written.status != ArmResult{}.status);
  CHECK(written.stat_totals.size() == 3);
  const fs::path path = scratch("round-trip.result");
  write_arm_result(path, written);
  const ArmResult read = read_arm_result(path);
  for (const ArmResultField& f : arm_result_fields) {
    INFO("field " << f.name);
    CHECK(!f.doc.empty());
    std::visit([&](auto member) { CHECK(same_bits(read.*member, written.*member)); }, f.member);
  }
  fs::remove_all(path.parent_path());
}

TEST_CASE("arm result file: a short file says it is truncated and where", "[experiment][result-file]") {
  const fs::path whole = scratch("whole.result"), cut = scratch("cut.result");
  write_arm_result(whole, distinctive_result());
  const auto size = fs::file_size(whole);
  for (std::uintmax_t length = 0; length < size; length += (length < 400 ? 1 : 997)) {
    fs::copy_file(whole, cut, fs::copy_options::overwrite_existing);
    fs::resize_file(cut, length);
    const std::string message = read_error(cut);
    INFO("cut to " << length << " of " << size << " bytes: " << message);
    CHECK(message.find("result file '" + cut.string() + "' is truncated in ") == 0);
  }
  fs::copy_file(whole, cut, fs::copy_options::overwrite_existing);
  fs::resize_file(cut, size - 1);
  CHECK(read_error(cut) == "result file '" + cut.string() + "' is truncated in field 'stat_totals'");
  fs::resize_file(cut, 0);
  CHECK(read_error(cut) == "result file '" + cut.string() + "' is truncated in its header");
  fs::remove_all(whole.parent_path());
}

TEST_CASE("arm result file: another file, version, field or tail is refused", "[experiment][result-file]") {
  const fs::path path = scratch("mismatch.result");
  const auto fresh = [&] { write_arm_result(path, distinctive_result()); };
  const std::string prefix = "result file '" + path.string() + "' ";

  fresh();
  patch(path, 0, "HDF");
  CHECK(read_error(path) == prefix + "is not an mpsim arm result");

  fresh();
  const std::uint32_t version = arm_result_file_version + 1;
  patch(path, 8, std::string(reinterpret_cast<const char*>(&version), sizeof version));
  CHECK(read_error(path) == prefix + "has version " + std::to_string(version) + "; this build reads version " +
                                std::to_string(arm_result_file_version));

  fresh();
  patch(path, 16 + 8, "X");  // the first letter of the first field's name
  CHECK(read_error(path) == prefix + "has field 'Xtatus' where this build has 'status'");

  fresh();
  std::ofstream(path, std::ios::binary | std::ios::app) << "extra";
  CHECK(read_error(path) == prefix + "has 5 bytes after its last field");

  CHECK(read_error(scratch("absent.result")).find("cannot read result file") == 0);
  fs::remove_all(path.parent_path());
}

TEST_CASE("experiment: the plan goes points, backends, seeds, then policies", "[experiment]") {
  const Sweep sweep = parse_sweep(tiny, "tiny.toml", {"seeds=[1,2]", "optimizer.lr=0.01,0.1"});
  const std::vector<PlannedArm> plan = plan_arms(sweep);
  REQUIRE(plan.size() == 8);
  CHECK(plan[0].point == 0);
  CHECK(plan[0].seed == 1);
  CHECK(plan[0].policy == "fp32");
  CHECK(plan[1].policy == "fp16-naive");
  CHECK(plan[2].seed == 2);
  CHECK(plan[4].point == 1);
  CHECK(plan[7].backend == "cpu");
}

TEST_CASE("experiment: a serial run through the engine", "[experiment]") {
  const fs::path output = scratch("serial.h5");
  fs::remove(output);
  fs::remove(fs::path(output).replace_extension(".toml"));
  ExperimentOptions options;
  options.output = output.string();
  options.handle_signals = false;

  struct Counting : ExperimentObserver {
    int starts = 0, steps = 0, finished = 0;
    void started(const ExperimentStart& s) override {
      ++starts;
      CHECK(s.arms == 2);
      CHECK(s.jobs == 1);  // no child_command: one arm after another
    }
    void progress(const ArmInfo&, const Progress&) override { ++steps; }
    void arm_finished(const ArmRow&, std::size_t n, std::size_t total) override {
      ++finished;
      CHECK(n == static_cast<std::size_t>(finished));
      CHECK(total == 2);
    }
  } observer;
  options.jobs = 4;
  const ExperimentResult result = run_experiment(parse_sweep(tiny, "tiny.toml"), options, &observer);
  REQUIRE(result.rows.size() == 2);
  CHECK(result.rows[0].name == "fp32");
  CHECK(result.rows[1].name == "fp16-naive");
  CHECK(result.rows[0].result.status == "completed");
  CHECK(result.rows[0].result.steps == 4);
  CHECK(result.agreements.empty());
  CHECK(observer.starts == 1);
  CHECK(observer.steps == 8);
  CHECK(observer.finished == 2);
  CHECK(fs::exists(result.log));
  CHECK(result.config == fs::path(output).replace_extension(".toml"));
  const std::string summary = format_summary(result);
  CHECK(summary.find("\narm               test acc test loss") == 0);
  CHECK(summary.find("\nfp16-naive  ") != std::string::npos);
  CHECK(summary.find("\nlog: " + output.string() + "\nconfig: ") != std::string::npos);

  // Again without force: refused before anything is written.
  try {
    run_experiment(parse_sweep(tiny, "tiny.toml"), options);
    FAIL("no SetupError");
  } catch (const SetupError& e) {
    CHECK(std::string(e.what()).find("exists; pass --force") != std::string::npos);
  }
  fs::remove_all(output.parent_path());
}

TEST_CASE("experiment: child processes that fail are named and their output kept", "[experiment]") {
  const fs::path output = scratch("failing.h5");
  fs::remove(output);
  fs::remove(fs::path(output).replace_extension(".toml"));
  ExperimentOptions options;
  options.output = output.string();
  options.handle_signals = false;
  options.jobs = 2;
  std::vector<ChildArm> asked;
  options.child_command = [&](const ChildArm& child) {
    asked.push_back(child);
    return std::vector<std::string>{"/bin/sh", "-c", "echo arm " + std::to_string(child.index) + " says no; exit 3"};
  };
  std::string message;
  try {
    run_experiment(parse_sweep(tiny, "tiny.toml"), options);
  } catch (const std::runtime_error& e) {
    message = e.what();
  }
  // Both started at once (jobs 2), so both ran and failed.
  REQUIRE(asked.size() == 2);
  CHECK(asked[0].index == 0);
  CHECK(asked[1].index == 1);
  CHECK(asked[0].overrides.empty());  // train.threads is 1, not 0 ("all cores")
  CHECK(message.find("2 arm(s) failed; the log keeps the arms that finished:") == 0);
  CHECK(message.find("arm fp32 failed (exit 3); its output: ") != std::string::npos);
  const fs::path child_log = fs::path(asked[1].output).replace_extension(".log");
  CHECK(message.find(child_log.string()) != std::string::npos);
  std::ifstream in(child_log);
  std::string said;
  std::getline(in, said);
  CHECK(said == "arm 1 says no");
  CHECK(fs::exists(output));  // the log, with no arm
  fs::remove_all(output.parent_path());
}

TEST_CASE("experiment: the summary table's layout", "[experiment]") {
  ExperimentResult result;
  ArmRow row;
  row.name = "fp16-mixed";
  row.result.test_accuracy = 0.8123;
  row.result.test_loss = 0.51234;
  row.result.activation_grad_flushed = 0.000123;
  row.result.weight_grad_below_2_24 = 0.5;
  row.result.skipped_steps = 3;
  row.result.final_loss_scale = 65536;
  row.result.wall_seconds = 12.34;
  row.result.stat_totals.resize(1);  // one instrumented layer
  result.rows.push_back(row);
  row.name = "fp32";
  row.result.stat_totals.clear();  // stats_interval = 0: nothing was measured
  result.rows.push_back(row);
  result.log = "runs/x.h5";
  result.config = "runs/x.toml";
  const std::string footnote =
      "(act-g, w-g: activation and weight gradients, summed over the instrumented steps. to 0: nonzero values that\n"
      " rounding to the arm's format made zero; <2^-24: nonzero values below binary16's smallest subnormal; both per "
      "nonzero value.\n skipped: steps skipped for an inf/NaN gradient. loss scale: after the last step.)\n";
  CHECK(format_summary(result) ==
        "\narm               test acc test loss  act-g to 0 act-g<2^-24    w-g to 0   w-g<2^-24  skipped loss scale"
        "   wall s  status\n"
        "fp16-mixed          81.23%    0.5123     0.0123%     0.0000%     0.0000%    50.0000%        3      65536"
        "     12.3  completed\n"
        "fp32                81.23%    0.5123         n/a         n/a         n/a         n/a        3      65536"
        "     12.3  completed\n" +
            footnote + "(n/a: no step was instrumented; set train.stats_interval > 0 to measure these)\n" +
            "\nlog: runs/x.h5\nconfig: runs/x.toml\n");
}

TEST_CASE("format_summary gives a text model's test loss in bits per character", "[experiment]") {
  ExperimentResult result;
  ArmRow row;
  row.name = "fp32";
  row.result.test_loss = 3.0 * std::numbers::ln2;  // 3 bits
  result.rows.push_back(row);
  row.name = "bf16-mixed";
  row.result.test_loss = 2.3613;  // charlm's fp32 arm at full size on the CPU: 3.4066 bits
  result.rows.push_back(row);
  CHECK(format_summary(result).find("bits per character") == std::string::npos);  // not text: nothing
  result.text = true;
  const std::string summary = format_summary(result);
  CHECK(summary.find("\ntest bits per character (test loss / ln 2):\n"
                     "fp32                3.0000\n"
                     "bf16-mixed          3.4066\n") != std::string::npos);
}

TEST_CASE("data.path: empty means the dataset's Debian directory, anything else is taken as given", "[experiment]") {
  DataSpec d;
  CHECK(d.path.empty());
  CHECK(data_directory(d) == default_fashion_mnist_dir);
  d.dataset = "fortunes";
  CHECK(data_directory(d) == default_fortunes_dir);
  d.path = "/srv/text";
  CHECK(data_directory(d) == "/srv/text");
}
