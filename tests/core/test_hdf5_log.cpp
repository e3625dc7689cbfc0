// The HDF5 experiment log (core/src/hdf5_log.cpp, docs/hdf5-schema.md):
// written through create_hdf5_log(), read back with the raw HDF5 C API (no
// code shared with the writer). A round trip of two arms checks every value,
// shape, attribute, dimension scale and filter; creation refuses an existing
// file and names unwritable paths; forked children check what survives
// SIGKILL after a flush, SIGKILL after flush_all_logs(), and SIGTERM with
// install_flush_on_signals(). Everything is written under a fresh temporary
// folder that is removed afterwards.
#include <catch2/catch.hpp>

#include <hdf5.h>
#include <hdf5_hl.h>  // after hdf5.h: H5DSpublic.h needs its types
#include <signal.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <functional>
#include <limits>
#include <set>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "mpsim/core/agreement.hpp"
#include "mpsim/core/policy.hpp"
#include "mpsim/core/run_log.hpp"
#include "mpsim/core/stats.hpp"

namespace mpsim::core {
namespace {

namespace fs = std::filesystem;

// --- Test scaffolding ------------------------------------------------------------

class TempDir {
 public:
  TempDir() {
    std::string pattern = (fs::temp_directory_path() / "mpsim_h5_XXXXXX").string();
    if (::mkdtemp(pattern.data()) == nullptr) throw std::runtime_error("mkdtemp failed");
    path_ = pattern;
  }
  ~TempDir() {
    std::error_code ec;
    fs::permissions(path_, fs::perms::owner_all, fs::perm_options::add, ec);
    fs::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const fs::path& path() const { return path_; }

 private:
  fs::path path_;
};

// Closes an HDF5 identifier with the given H5?close.
class Id {
 public:
  Id(hid_t id, herr_t (*close)(hid_t)) : id_(id), close_(close) { REQUIRE(id >= 0); }
  Id(const Id&) = delete;
  Id& operator=(const Id&) = delete;
  ~Id() { close_(id_); }
  operator hid_t() const { return id_; }

 private:
  hid_t id_;
  herr_t (*close_)(hid_t);
};

void quiet_hdf5() { H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr); }

Id open_file(const fs::path& path) {
  quiet_hdf5();
  return Id(H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT), H5Fclose);
}
Id open_dataset(hid_t loc, const std::string& name) {
  INFO("dataset " << name);
  return Id(H5Dopen2(loc, name.c_str(), H5P_DEFAULT), H5Dclose);
}
Id open_group(hid_t loc, const std::string& name) {
  INFO("group " << name);
  return Id(H5Gopen2(loc, name.c_str(), H5P_DEFAULT), H5Gclose);
}

std::string string_attribute(hid_t object, const char* name) {
  INFO("attribute " << name);
  Id attribute(H5Aopen(object, name, H5P_DEFAULT), H5Aclose);
  Id type(H5Aget_type(attribute), H5Tclose);
  REQUIRE(H5Tget_class(type) == H5T_STRING);
  REQUIRE(H5Tis_variable_str(type) > 0);
  REQUIRE(H5Tget_cset(type) == H5T_CSET_UTF8);
  Id space(H5Aget_space(attribute), H5Sclose);
  REQUIRE(H5Sget_simple_extent_type(space) == H5S_SCALAR);
  char* value = nullptr;
  REQUIRE(H5Aread(attribute, type, &value) >= 0);
  std::string result = value != nullptr ? value : "";
  H5free_memory(value);
  return result;
}

template <typename T>
T scalar_attribute(hid_t object, const char* name, hid_t mem_type, H5T_class_t type_class, std::size_t size) {
  INFO("attribute " << name);
  Id attribute(H5Aopen(object, name, H5P_DEFAULT), H5Aclose);
  Id type(H5Aget_type(attribute), H5Tclose);
  REQUIRE(H5Tget_class(type) == type_class);
  REQUIRE(H5Tget_size(type) == size);
  T value{};
  REQUIRE(H5Aread(attribute, mem_type, &value) >= 0);
  return value;
}

// A 1-D attribute of variable-length UTF-8 strings.
std::vector<std::string> string_array_attribute(hid_t object, const char* name) {
  INFO("attribute " << name);
  Id attribute(H5Aopen(object, name, H5P_DEFAULT), H5Aclose);
  Id type(H5Aget_type(attribute), H5Tclose);
  REQUIRE(H5Tget_class(type) == H5T_STRING);
  REQUIRE(H5Tis_variable_str(type) > 0);
  REQUIRE(H5Tget_cset(type) == H5T_CSET_UTF8);
  Id space(H5Aget_space(attribute), H5Sclose);
  REQUIRE(H5Sget_simple_extent_type(space) == H5S_SIMPLE);
  REQUIRE(H5Sget_simple_extent_ndims(space) == 1);
  hsize_t n = 0;
  H5Sget_simple_extent_dims(space, &n, nullptr);
  std::vector<char*> values(n, nullptr);
  if (n > 0) REQUIRE(H5Aread(attribute, type, values.data()) >= 0);
  std::vector<std::string> result;
  for (char* value : values) {
    result.emplace_back(value != nullptr ? value : "");
    H5free_memory(value);
  }
  return result;
}

std::vector<hsize_t> shape(hid_t dataset) {
  Id space(H5Dget_space(dataset), H5Sclose);
  const int rank = H5Sget_simple_extent_ndims(space);
  REQUIRE(rank >= 0);
  std::vector<hsize_t> dims(static_cast<std::size_t>(rank));
  H5Sget_simple_extent_dims(space, dims.data(), nullptr);
  return dims;
}

// Reads a whole dataset, checking its stored type class, size and sign.
template <typename T>
std::vector<T> read(hid_t loc, const std::string& name, hid_t mem_type, std::vector<hsize_t> expected_shape) {
  INFO("dataset " << name);
  Id dataset = open_dataset(loc, name);
  REQUIRE(shape(dataset) == expected_shape);
  Id type(H5Dget_type(dataset), H5Tclose);
  Id native(H5Tget_native_type(type, H5T_DIR_ASCEND), H5Tclose);
  REQUIRE(H5Tequal(native, mem_type) > 0);
  hsize_t n = 1;
  for (const hsize_t d : expected_shape) n *= d;
  std::vector<T> values(n);
  if (n > 0) REQUIRE(H5Dread(dataset, mem_type, H5S_ALL, H5S_ALL, H5P_DEFAULT, values.data()) >= 0);
  return values;
}

std::vector<std::string> read_strings(hid_t loc, const std::string& name) {
  INFO("dataset " << name);
  Id dataset = open_dataset(loc, name);
  Id type(H5Dget_type(dataset), H5Tclose);
  REQUIRE(H5Tget_class(type) == H5T_STRING);
  REQUIRE(H5Tis_variable_str(type) == 0);
  const std::size_t width = H5Tget_size(type);
  const std::vector<hsize_t> dims = shape(dataset);
  REQUIRE(dims.size() == 1);
  std::vector<char> buffer(dims[0] * width + 1, '\0');
  if (dims[0] > 0) REQUIRE(H5Dread(dataset, type, H5S_ALL, H5S_ALL, H5P_DEFAULT, buffer.data()) >= 0);
  std::vector<std::string> values;
  for (hsize_t i = 0; i < dims[0]; ++i) {
    const char* begin = &buffer[i * width];
    values.emplace_back(begin, strnlen(begin, width));
  }
  return values;
}

bool is_scale(hid_t loc, const std::string& name) {
  Id dataset = open_dataset(loc, name);
  return H5DSis_scale(dataset) > 0;
}

bool attached(hid_t loc, const std::string& dataset_name, const std::string& scale_name, unsigned axis) {
  Id dataset = open_dataset(loc, dataset_name);
  Id scale = open_dataset(loc, scale_name);
  return H5DSis_attached(dataset, scale, axis) > 0;
}

// Chunked, shuffled and deflated at level 1; returns the chunk dimensions.
std::vector<hsize_t> check_compressed(hid_t loc, const std::string& name) {
  INFO("dataset " << name);
  Id dataset = open_dataset(loc, name);
  Id create(H5Dget_create_plist(dataset), H5Pclose);
  REQUIRE(H5Pget_layout(create) == H5D_CHUNKED);
  std::set<H5Z_filter_t> filters;
  const int count = H5Pget_nfilters(create);
  for (int i = 0; i < count; ++i) {
    unsigned flags = 0, values[4] = {};
    std::size_t value_count = 4;
    char filter_name[64];
    const H5Z_filter_t filter =
        H5Pget_filter2(create, static_cast<unsigned>(i), &flags, &value_count, values, sizeof filter_name, filter_name,
                       nullptr);
    filters.insert(filter);
    if (filter == H5Z_FILTER_DEFLATE) CHECK(values[0] == 1);
  }
  CHECK(filters == std::set<H5Z_filter_t>{H5Z_FILTER_SHUFFLE, H5Z_FILTER_DEFLATE});
  const std::vector<hsize_t> dims = shape(dataset);
  std::vector<hsize_t> chunk(dims.size());
  REQUIRE(H5Pget_chunk(create, static_cast<int>(chunk.size()), chunk.data()) == static_cast<int>(chunk.size()));
  // The step axis is unlimited.
  Id space(H5Dget_space(dataset), H5Sclose);
  std::vector<hsize_t> max_dims(dims.size());
  H5Sget_simple_extent_dims(space, nullptr, max_dims.data());
  CHECK(max_dims[0] == H5S_UNLIMITED);
  return chunk;
}

bool same(double a, double b) { return (std::isnan(a) && std::isnan(b)) || a == b; }

// --- The data written: a function of arm and step ------------------------------------

StepRecord step_record(int arm, std::int64_t s) {
  StepRecord r;
  r.step = s;
  r.loss = 2.5 / static_cast<double>(s + 1) + arm;
  r.loss_scale = std::ldexp(1.0, 16 - static_cast<int>(s % 4));
  r.found_inf = s % 7 == 3;
  r.skipped = r.found_inf || s % 11 == 5;
  r.learning_rate = 1e-3 * static_cast<double>(arm + 1) / static_cast<double>(s + 1);
  r.grad_norm = r.found_inf ? (s % 2 ? std::numeric_limits<double>::quiet_NaN()
                                     : std::numeric_limits<double>::infinity())
                            : std::sqrt(static_cast<double>(s)) + 0.125 * arm;
  return r;
}

EvalRecord eval_record(int arm, std::int64_t s) {
  EvalRecord r;
  r.step = s;
  r.epoch = static_cast<double>(s) / 7.0;
  r.train_loss = 1.0 / static_cast<double>(s + 2) + arm;
  r.train_accuracy = 0.5 + 0.001 * static_cast<double>(s);
  r.test_loss = 1.5 / static_cast<double>(s + 2) + arm;
  r.test_accuracy = 0.4 + 0.001 * static_cast<double>(s) + 0.01 * arm;
  return r;
}

std::uint64_t histogram_value(int arm, std::int64_t s, std::size_t l, std::size_t k, std::size_t b) {
  const std::uint64_t key = static_cast<std::uint64_t>(s) * 31 + l * 7 + k * 3 + b + static_cast<std::uint64_t>(arm);
  if (b == 5 && k == 1) return 4'000'000'000u + static_cast<std::uint64_t>(s);  // near the top of uint32
  return key % 5 == 0 ? key : 0;
}

std::uint64_t counter_value(int arm, std::int64_t s, std::size_t l, std::size_t k, std::size_t c) {
  return (std::uint64_t{1} << 40) + static_cast<std::uint64_t>(s) * 1000 + l * 100 + k * 10 + c +
         static_cast<std::uint64_t>(arm) * 7;
}

LayerStats layer_stats(int arm, std::int64_t s, std::size_t layers) {
  LayerStats stats(layers);
  for (std::size_t l = 0; l < layers; ++l) {
    for (std::size_t k = 0; k < tensor_kind_count; ++k) {
      for (std::size_t b = 0; b < Binades::bin_count; ++b) stats[l][k].histogram[b] = histogram_value(arm, s, l, k, b);
      for (std::size_t c = 0; c < counter_count; ++c) stats[l][k].counters[c] = counter_value(arm, s, l, k, c);
    }
  }
  return stats;
}

ExperimentInfo experiment_info() {
  ExperimentInfo info;
  info.config_toml = "[experiment]\nname = \"round trip\"\nsteps = 25\n# \xce\xbb: UTF-8\n";
  info.mpsim_version = "0.1.0";
  info.git_revision = "0123456789abcdef";
  info.start_time = "2024-05-01T12:00:00Z";
  info.host = "testhost";
  info.cpu = "Test CPU 9000";
  info.seed = 0xfedcba9876543210ull;
  return info;
}

// Arm 1's policy sets every kind of field away from its default.
Policy arm_policy(int arm) {
  Policy p;
  p.name = arm == 0 ? "fp32" : "amp_fp16";
  if (arm == 0) return p;
  p.weights.format = formats::e4m3;
  p.weights.delayed_scaling = true;
  p.activation_grads.format = formats::binary16;
  p.activation_grads.rounding = {RoundingMode::stochastic, 8};
  p.weight_storage.format = Format{6, 9, Subnormals::flush_to_zero, Overflow::saturate};
  p.optimizer_state.rounding.mode = RoundingMode::toward_zero;
  p.master_weights = false;
  p.gemm = "h100";
  p.fp32_ops = {"layer_norm", "softmax_cross_entropy"};
  p.loss_scaling = {LossScaleMode::dynamic, 1048577.0, 4.0, 0.25, 500, 2, 1.0, 16777216.0};
  p.delayed_scaling = {32, 1};
  return p;
}

ArmInfo arm_info(int arm) {
  ArmInfo info;
  info.name = arm == 0 ? "fp32" : "fp16 amp";
  info.backend = arm == 0 ? "cpu" : "cuda";
  info.policy = arm == 0 ? "fp32" : "amp_fp16";
  info.policy_description = arm == 0 ? "everything in binary32" : "FP16 storage, FP32 master weights";
  info.seed = 1000 + static_cast<std::uint64_t>(arm);
  info.layers = arm == 0 ? std::vector<std::string>{"fc1", "fc2", "output"}
                         : std::vector<std::string>{"conv1", "a much longer layer name"};
  info.resolved_policy = arm_policy(arm);
  info.threads = 1 + arm;
  info.gemm = arm == 0 ? "ordered (AVX2)" : "cuBLAS";
  return info;
}

// The logit maxima of a stats step: NaN for layer 0 (a layer without
// logits), distinct values for the others.
std::vector<double> logit_maxima(int arm, std::int64_t step, std::size_t layers) {
  std::vector<double> v(layers, std::numeric_limits<double>::quiet_NaN());
  for (std::size_t l = 1; l < layers; ++l) v[l] = 1000.0 * arm + static_cast<double>(step) + 0.25 * static_cast<double>(l);
  return v;
}

// Which records a check expects.
struct Expected {
  std::vector<std::int64_t> steps, stat_steps, eval_steps;
  std::string status = "running";
};

// /arms/<arm>/policy/ against arm_policy(arm), spelled out: the names below
// are the schema's (docs/hdf5-schema.md), not taken from the writer's table.
void check_policy(hid_t arm_group, int arm) {
  Id g = open_group(arm_group, "policy");
  const auto u8 = [&](const std::string& name) {
    return scalar_attribute<std::uint8_t>(g, name.c_str(), H5T_NATIVE_UINT8, H5T_INTEGER, 1);
  };
  const auto i32 = [&](const std::string& name) {
    return scalar_attribute<std::int32_t>(g, name.c_str(), H5T_NATIVE_INT32, H5T_INTEGER, 4);
  };
  const auto f64 = [&](const std::string& name) {
    return scalar_attribute<double>(g, name.c_str(), H5T_NATIVE_DOUBLE, H5T_FLOAT, 8);
  };
  const auto text = [&](const std::string& name) { return string_attribute(g, name.c_str()); };
  CHECK(text("name") == (arm == 0 ? "fp32" : "amp_fp16"));
  const std::vector<std::string> points{"weights",           "activations",      "accumulation",
                                        "gemm_output",       "elementwise",      "softmax_internals",
                                        "norm_statistics",   "loss_internals",   "gradient_operands",
                                        "activation_grads",  "weight_grads",     "weight_storage",
                                        "optimizer_state"};
  CHECK(string_array_attribute(g, "points") == points);
  struct Point {
    std::string format = "binary32";
    std::int32_t exponent_bits = 8, mantissa_bits = 23;
    std::string rounding = "nearest-even";
    std::int32_t random_bits = 32;
    std::uint8_t scaled = 0;
  };
  for (const auto& name : points) {
    INFO("point " << name);
    Point want;
    if (arm == 1 && name == "weights") want = {"e4m3", 4, 3, "nearest-even", 32, 1};
    if (arm == 1 && name == "activation_grads") want = {"binary16", 5, 10, "stochastic", 8, 0};
    if (arm == 1 && name == "weight_storage") want = {"e6m9:ftz:sat", 6, 9, "nearest-even", 32, 0};
    if (arm == 1 && name == "optimizer_state") want.rounding = "toward-zero";
    CHECK(text(name + ".format") == want.format);
    CHECK(i32(name + ".exponent_bits") == want.exponent_bits);
    CHECK(i32(name + ".mantissa_bits") == want.mantissa_bits);
    CHECK(text(name + ".rounding") == want.rounding);
    CHECK(i32(name + ".random_bits") == want.random_bits);
    CHECK(u8(name + ".scaled") == want.scaled);
  }
  CHECK(u8("master_weights") == (arm == 0 ? 1 : 0));
  CHECK(text("gemm") == (arm == 0 ? "ieee" : "h100"));
  CHECK(string_array_attribute(g, "fp32_ops") ==
        (arm == 0 ? std::vector<std::string>{} : std::vector<std::string>{"layer_norm", "softmax_cross_entropy"}));
  CHECK(text("loss_scale.mode") == (arm == 0 ? "none" : "dynamic"));
  CHECK(f64("loss_scale.initial") == (arm == 0 ? 65536.0 : 1048577.0));
  CHECK(f64("loss_scale.growth_factor") == (arm == 0 ? 2.0 : 4.0));
  CHECK(f64("loss_scale.backoff_factor") == (arm == 0 ? 0.5 : 0.25));
  CHECK(i32("loss_scale.growth_interval") == (arm == 0 ? 2000 : 500));
  CHECK(i32("loss_scale.hysteresis") == (arm == 0 ? 1 : 2));
  CHECK(f64("loss_scale.min") == (arm == 0 ? 0.0 : 1.0));
  CHECK(f64("loss_scale.max") == (arm == 0 ? 0.0 : 16777216.0));
  CHECK(i32("delayed_scaling.history") == (arm == 0 ? 16 : 32));
  CHECK(i32("delayed_scaling.margin") == (arm == 0 ? 0 : 1));
  // Nothing else: every attribute is one of the above.
  hsize_t count = 0;
  const auto counted = [](hid_t, const char*, const H5A_info_t*, void* n) -> herr_t {
    ++*static_cast<hsize_t*>(n);
    return 0;
  };
  REQUIRE(H5Aiterate2(g, H5_INDEX_NAME, H5_ITER_NATIVE, nullptr, counted, &count) >= 0);
  for (const auto& b : block_points) CHECK(text(std::string(b.name)) == "none");
  CHECK(i32("high_precision_last") == 0);
  CHECK(i32("block_promotion_interval") == 0);
  CHECK(count == 2 + 6 * points.size() + 3 + block_points.size() + 2 + 8 + 2);
}

// Checks one arm's group against `expected`, value by value.
void check_arm(hid_t file, int arm, const Expected& expected) {
  const ArmInfo info = arm_info(arm);
  INFO("arm " << info.name);
  Id group = open_group(file, "/arms/" + info.name);
  CHECK(string_attribute(group, "name") == info.name);
  CHECK(string_attribute(group, "backend") == info.backend);
  CHECK(string_attribute(group, "policy") == info.policy);
  CHECK(string_attribute(group, "policy_description") == info.policy_description);
  CHECK(scalar_attribute<std::uint64_t>(group, "seed", H5T_NATIVE_UINT64, H5T_INTEGER, 8) == info.seed);
  CHECK(string_attribute(group, "status") == expected.status);
  CHECK(scalar_attribute<std::int32_t>(group, "threads", H5T_NATIVE_INT32, H5T_INTEGER, 4) == info.threads);
  CHECK(string_attribute(group, "gemm") == info.gemm);
  check_policy(group, arm);

  // Coordinates.
  const std::size_t layers = info.layers.size();
  CHECK(read_strings(group, "layer") == info.layers);
  CHECK(read_strings(group, "kind") == std::vector<std::string>{"weights", "activations", "activation_grads",
                                                                "weight_grads", "updates", "gemm_inputs",
                                                                "attention_logits", "attention_probs"});
  CHECK(read_strings(group, "counter") ==
        std::vector<std::string>{"elements", "nonzero", "rounded_to_zero", "below_2^-24", "subnormal", "overflow", "nan",
                                 "infinite", "swallowed", "inexact"});
  const auto binade = read<std::int32_t>(group, "binade", H5T_NATIVE_INT32, {280});
  for (int i = 0; i < 277; ++i) REQUIRE(binade[i] == i - 149);
  CHECK(binade[277] == 1000);
  CHECK(binade[278] == 1001);
  CHECK(binade[279] == 1002);
  const auto labels = read_strings(group, "bin_label");
  REQUIRE(labels.size() == 280);
  CHECK(labels[0] == "2^-149");
  CHECK(labels[149] == "2^0");
  CHECK(labels[276] == "2^127");
  CHECK(labels[277] == "zero");
  CHECK(labels[278] == "inf");
  CHECK(labels[279] == "nan");
  for (const char* scale : {"layer", "kind", "binade", "counter", "steps/step", "stats/step", "eval/step"}) {
    INFO(scale);
    CHECK(is_scale(group, scale));
  }
  {
    Id dataset = open_dataset(group, "binade");
    char name[32] = {};
    CHECK(H5DSget_scale_name(dataset, name, sizeof name) > 0);
    CHECK(std::string(name) == "binade");
  }

  // Steps.
  const hsize_t n = expected.steps.size();
  const auto step = read<std::int64_t>(group, "steps/step", H5T_NATIVE_INT64, {n});
  const auto loss = read<double>(group, "steps/loss", H5T_NATIVE_DOUBLE, {n});
  const auto loss_scale = read<double>(group, "steps/loss_scale", H5T_NATIVE_DOUBLE, {n});
  const auto found_inf = read<std::uint8_t>(group, "steps/found_inf", H5T_NATIVE_UINT8, {n});
  const auto skipped = read<std::uint8_t>(group, "steps/skipped", H5T_NATIVE_UINT8, {n});
  const auto learning_rate = read<double>(group, "steps/learning_rate", H5T_NATIVE_DOUBLE, {n});
  const auto grad_norm = read<double>(group, "steps/grad_norm", H5T_NATIVE_DOUBLE, {n});
  for (hsize_t i = 0; i < n; ++i) {
    const StepRecord r = step_record(arm, expected.steps[i]);
    INFO("step " << r.step);
    REQUIRE(step[i] == r.step);
    REQUIRE(loss[i] == r.loss);
    REQUIRE(loss_scale[i] == r.loss_scale);
    REQUIRE(found_inf[i] == (r.found_inf ? 1 : 0));
    REQUIRE(skipped[i] == (r.skipped ? 1 : 0));
    REQUIRE(learning_rate[i] == r.learning_rate);
    REQUIRE(same(grad_norm[i], r.grad_norm));
  }
  for (const char* name : {"loss", "loss_scale", "found_inf", "skipped", "learning_rate", "grad_norm"}) {
    INFO(name);
    CHECK(attached(group, std::string("steps/") + name, "steps/step", 0));
    CHECK(check_compressed(group, std::string("steps/") + name) == std::vector<hsize_t>{256});
  }
  CHECK(check_compressed(group, "steps/step") == std::vector<hsize_t>{256});

  // Stats.
  const hsize_t m = expected.stat_steps.size(), kinds = tensor_kind_count;
  CHECK(read<std::int64_t>(group, "stats/step", H5T_NATIVE_INT64, {m}) == expected.stat_steps);
  const auto histogram = read<std::uint32_t>(group, "stats/histogram", H5T_NATIVE_UINT32, {m, layers, kinds, 280});
  const auto counters = read<std::uint64_t>(group, "stats/counters", H5T_NATIVE_UINT64, {m, layers, kinds, 10});
  std::size_t h = 0, c = 0;
  for (hsize_t i = 0; i < m; ++i) {
    for (std::size_t l = 0; l < layers; ++l) {
      for (std::size_t k = 0; k < kinds; ++k) {
        INFO("stats step " << expected.stat_steps[i] << " layer " << l << " kind " << k);
        for (std::size_t b = 0; b < 280; ++b) {
          REQUIRE(histogram[h++] == histogram_value(arm, expected.stat_steps[i], l, k, b));
        }
        for (std::size_t j = 0; j < 10; ++j) {
          REQUIRE(counters[c++] == counter_value(arm, expected.stat_steps[i], l, k, j));
        }
      }
    }
  }
  for (const char* name : {"stats/histogram", "stats/counters"}) {
    INFO(name);
    CHECK(attached(group, name, "stats/step", 0));
    CHECK(attached(group, name, "layer", 1));
    CHECK(attached(group, name, "kind", 2));
    CHECK_FALSE(attached(group, name, "steps/step", 0));
  }
  CHECK(attached(group, "stats/histogram", "binade", 3));
  CHECK(attached(group, "stats/counters", "counter", 3));
  CHECK(check_compressed(group, "stats/histogram") == std::vector<hsize_t>{16, 1, kinds, 280});
  CHECK(check_compressed(group, "stats/counters") == std::vector<hsize_t>{16, layers, kinds, 10});
  const auto maxima = read<double>(group, "stats/logit_max", H5T_NATIVE_DOUBLE, {m, layers});
  for (hsize_t i = 0; i < m; ++i) {
    const std::vector<double> want = logit_maxima(arm, expected.stat_steps[i], layers);
    for (std::size_t l = 0; l < layers; ++l) {
      INFO("logit_max step " << expected.stat_steps[i] << " layer " << l);
      if (std::isnan(want[l])) CHECK(std::isnan(maxima[i * layers + l]));
      else CHECK(maxima[i * layers + l] == want[l]);
    }
  }
  CHECK(attached(group, "stats/logit_max", "stats/step", 0));
  CHECK(attached(group, "stats/logit_max", "layer", 1));

  // Evaluations.
  const hsize_t e = expected.eval_steps.size();
  CHECK(read<std::int64_t>(group, "eval/step", H5T_NATIVE_INT64, {e}) == expected.eval_steps);
  const auto epoch = read<double>(group, "eval/epoch", H5T_NATIVE_DOUBLE, {e});
  const auto train_loss = read<double>(group, "eval/train_loss", H5T_NATIVE_DOUBLE, {e});
  const auto train_accuracy = read<double>(group, "eval/train_accuracy", H5T_NATIVE_DOUBLE, {e});
  const auto test_loss = read<double>(group, "eval/test_loss", H5T_NATIVE_DOUBLE, {e});
  const auto test_accuracy = read<double>(group, "eval/test_accuracy", H5T_NATIVE_DOUBLE, {e});
  for (hsize_t i = 0; i < e; ++i) {
    const EvalRecord r = eval_record(arm, expected.eval_steps[i]);
    INFO("eval at step " << r.step);
    REQUIRE(epoch[i] == r.epoch);
    REQUIRE(train_loss[i] == r.train_loss);
    REQUIRE(train_accuracy[i] == r.train_accuracy);
    REQUIRE(test_loss[i] == r.test_loss);
    REQUIRE(test_accuracy[i] == r.test_accuracy);
  }
  for (const char* name : {"epoch", "train_loss", "train_accuracy", "test_loss", "test_accuracy"}) {
    INFO(name);
    CHECK(attached(group, std::string("eval/") + name, "eval/step", 0));
    CHECK(check_compressed(group, std::string("eval/") + name) == std::vector<hsize_t>{64});
  }
}

void check_root(hid_t file) {
  const ExperimentInfo info = experiment_info();
  CHECK(string_attribute(file, "config") == info.config_toml);
  CHECK(string_attribute(file, "mpsim_version") == info.mpsim_version);
  CHECK(string_attribute(file, "git_revision") == info.git_revision);
  CHECK(string_attribute(file, "start_time") == info.start_time);
  CHECK(string_attribute(file, "host") == info.host);
  CHECK(string_attribute(file, "cpu") == info.cpu);
  CHECK(scalar_attribute<std::uint64_t>(file, "seed", H5T_NATIVE_UINT64, H5T_INTEGER, 8) == info.seed);
  CHECK(scalar_attribute<std::int32_t>(file, "schema_version", H5T_NATIVE_INT32, H5T_INTEGER, 4) == 9);
}

// Writes arm `arm` for steps [first, last): stats every 5 steps and an eval
// every 10 (at steps ending in 9), each before that step's step() call.
void write_steps(ArmLog& log, int arm, std::int64_t first, std::int64_t last, Expected& expected) {
  const std::size_t layers = arm_info(arm).layers.size();
  for (std::int64_t s = first; s < last; ++s) {
    if (s % 5 == 0) {
      log.stats(s, layer_stats(arm, s, layers), logit_maxima(arm, s, layers));
      expected.stat_steps.push_back(s);
    }
    if (s % 10 == 9) {
      log.eval(eval_record(arm, s));
      expected.eval_steps.push_back(s);
    }
    log.step(step_record(arm, s));
    expected.steps.push_back(s);
  }
}

// Runs `child` in a forked process that must not return normally; returns the wait status.
int run_child(const std::function<void()>& child) {
  std::fflush(nullptr);
  const pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    ::alarm(60);  // a hung child dies by SIGALRM, which the parent reports
    try {
      child();
    } catch (const std::exception& e) {
      std::fprintf(stderr, "child: %s\n", e.what());
      ::_exit(2);
    } catch (...) {
      ::_exit(2);
    }
    ::_exit(3);
  }
  int status = 0;
  REQUIRE(::waitpid(pid, &status, 0) == pid);
  return status;
}

// --- Tests --------------------------------------------------------------------------

TEST_CASE("hdf5 log: round trip of two arms", "[hdf5]") {
  TempDir dir;
  const fs::path path = dir.path() / "run.h5";
  Expected expected[2];
  {
    auto log = create_hdf5_log(path, experiment_info(), 10);
    ArmLog& a = log->add_arm(arm_info(0));
    ArmLog& b = log->add_arm(arm_info(1));
    // Interleaved, with an explicit flush in the middle; the last records
    // reach the file in the destructor.
    write_steps(a, 0, 0, 12, expected[0]);
    write_steps(b, 1, 0, 7, expected[1]);
    log->flush();
    write_steps(a, 0, 12, 25, expected[0]);
    write_steps(b, 1, 7, 33, expected[1]);
    a.eval(eval_record(0, 25));  // after the last step
    expected[0].eval_steps.push_back(25);
    a.finish("completed");
    b.finish("stopped: loss is NaN");
    expected[0].status = "completed";
    expected[1].status = "stopped: loss is NaN";
  }
  Id file = open_file(path);
  check_root(file);
  {
    Id arms = open_group(file, "arms");
    H5G_info_t info;
    REQUIRE(H5Gget_info(arms, &info) >= 0);
    CHECK(info.nlinks == 2);
  }
  check_arm(file, 0, expected[0]);
  check_arm(file, 1, expected[1]);
}

TEST_CASE("hdf5 log: copy_arm copies finished arms whole, policy included", "[hdf5]") {
  // As `mpsim run --jobs N` does: each arm in a child's file, copied into the experiment's.
  TempDir dir;
  Expected expected[2];
  for (int arm = 0; arm < 2; ++arm) {
    auto child = create_hdf5_log(dir.path() / ("child" + std::to_string(arm) + ".h5"), experiment_info(), 10);
    ArmLog& a = child->add_arm(arm_info(arm));
    write_steps(a, arm, 0, 17 + 4 * arm, expected[arm]);
    a.finish("completed");
    expected[arm].status = "completed";
  }
  const fs::path path = dir.path() / "run.h5";
  {
    auto log = create_hdf5_log(path, experiment_info(), 10);
    for (int arm = 0; arm < 2; ++arm)
      log->copy_arm(dir.path() / ("child" + std::to_string(arm) + ".h5"), arm_info(arm).name);
  }
  Id file = open_file(path);
  check_root(file);
  check_arm(file, 0, expected[0]);
  check_arm(file, 1, expected[1]);
}

TEST_CASE("hdf5 log: an agreement is kept under /agreement", "[hdf5][agreement]") {
  TempDir dir;
  const fs::path path = dir.path() / "run.h5";
  Agreement a;
  a.reference = "cpu.fp16-mixed";
  a.other = "cuda.fp16-mixed";
  a.layers = {"fc1", "fc2"};
  a.max_loss_relative_difference = 3.5e-7;
  a.test_accuracy_difference = -0.0025;
  a.histogram_distance.resize(2);
  for (int l = 0; l < 2; ++l)
    for (int k = 0; k < tensor_kind_count; ++k) a.histogram_distance[l][k] = l * 10 + k + 0.25;
  a.histogram_distance[1][3] = std::numeric_limits<double>::quiet_NaN();
  {
    auto log = create_hdf5_log(path, experiment_info(), 10);
    log->add_arm(arm_info(0));
    log->add_agreement(a);
  }
  Id file = open_file(path);
  Id group = open_group(file, "agreement/cuda.fp16-mixed");
  CHECK(string_attribute(group, "reference") == "cpu.fp16-mixed");
  CHECK(string_attribute(group, "other") == "cuda.fp16-mixed");
  CHECK(scalar_attribute<double>(group, "max_loss_relative_difference", H5T_NATIVE_DOUBLE, H5T_FLOAT, 8) == 3.5e-7);
  CHECK(scalar_attribute<double>(group, "test_accuracy_difference", H5T_NATIVE_DOUBLE, H5T_FLOAT, 8) == -0.0025);
  CHECK(read_strings(group, "layer") == a.layers);
  const auto d = read<double>(group, "histogram_distance", H5T_NATIVE_DOUBLE, {2, tensor_kind_count});
  for (int l = 0; l < 2; ++l)
    for (int k = 0; k < tensor_kind_count; ++k) {
      INFO("layer " << l << " kind " << k);
      if (l == 1 && k == 3) CHECK(std::isnan(d[l * tensor_kind_count + k]));
      else CHECK(d[l * tensor_kind_count + k] == l * 10 + k + 0.25);
    }
  CHECK(attached(group, "histogram_distance", "layer", 0));
  CHECK(attached(group, "histogram_distance", "kind", 1));
}

TEST_CASE("hdf5 log: every dataset exists before training, empty", "[hdf5]") {
  TempDir dir;
  const fs::path path = dir.path() / "empty.h5";
  {
    auto log = create_hdf5_log(path, experiment_info(), 5);
    log->add_arm(arm_info(0));
  }
  Id file = open_file(path);
  check_root(file);
  check_arm(file, 0, Expected{});
}

TEST_CASE("hdf5 log: rejects bad arguments and counts", "[hdf5]") {
  TempDir dir;
  const fs::path path = dir.path() / "bad.h5";
  CHECK_THROWS_AS(create_hdf5_log(path, experiment_info(), 0), std::invalid_argument);
  CHECK_FALSE(fs::exists(path));
  auto log = create_hdf5_log(path, experiment_info(), 5);
  ArmLog& arm = log->add_arm(arm_info(0));
  CHECK_THROWS_AS(log->add_arm(arm_info(0)), std::invalid_argument);  // same name
  ArmInfo slash = arm_info(1);
  slash.name = "a/b";
  CHECK_THROWS_AS(log->add_arm(slash), std::invalid_argument);
  CHECK_THROWS_AS(arm.stats(0, layer_stats(0, 0, 2), logit_maxima(0, 0, 2)), std::invalid_argument);  // 2 layers, not 3
  CHECK_THROWS_AS(arm.stats(0, layer_stats(0, 0, 3), logit_maxima(0, 0, 2)), std::invalid_argument);
  LayerStats too_many = layer_stats(0, 0, 3);
  too_many[1][2].histogram[100] = std::uint64_t{1} << 32;
  CHECK_THROWS_AS(arm.stats(0, too_many, logit_maxima(0, 0, 3)), std::overflow_error);
  // The log stays usable, without the rejected records.
  Expected expected;
  write_steps(arm, 0, 0, 6, expected);
  log.reset();
  Id file = open_file(path);
  check_arm(file, 0, expected);
}

TEST_CASE("hdf5 log: refuses to overwrite an existing file", "[hdf5]") {
  TempDir dir;
  const fs::path path = dir.path() / "exists.h5";
  { std::ofstream(path) << "keep me"; }
  try {
    create_hdf5_log(path, experiment_info(), 10);
    FAIL("no exception");
  } catch (const std::runtime_error& e) {
    const std::string message = e.what();
    INFO(message);
    CHECK(message.find(path.string()) != std::string::npos);
    CHECK(message.find("exists; pass --force to overwrite") != std::string::npos);
  }
  std::ifstream in(path);
  std::stringstream content;
  content << in.rdbuf();
  CHECK(content.str() == "keep me");

  // An existing HDF5 log too.
  const fs::path log_path = dir.path() / "log.h5";
  create_hdf5_log(log_path, experiment_info(), 10)->add_arm(arm_info(0));
  CHECK_THROWS_WITH(create_hdf5_log(log_path, experiment_info(), 10),
                    Catch::Contains(log_path.string()) && Catch::Contains("exists; pass --force to overwrite"));
  Id file = open_file(log_path);
  check_arm(file, 0, Expected{});
}

TEST_CASE("hdf5 log: unwritable paths are named in the error", "[hdf5]") {
  TempDir dir;
  std::vector<fs::path> paths = {dir.path() / "no such folder" / "run.h5"};
  { std::ofstream(dir.path() / "a file") << "x"; }
  paths.push_back(dir.path() / "a file" / "run.h5");
  if (::geteuid() != 0) {  // root writes anywhere
    fs::create_directory(dir.path() / "read-only");
    fs::permissions(dir.path() / "read-only", fs::perms::owner_read | fs::perms::owner_exec);
    paths.push_back(dir.path() / "read-only" / "run.h5");
  }
  for (const fs::path& path : paths) {
    try {
      create_hdf5_log(path, experiment_info(), 10);
      FAIL("no exception for " << path);
    } catch (const std::runtime_error& e) {
      const std::string message = e.what();
      INFO(message);
      CHECK(message.find(path.string()) != std::string::npos);
      CHECK(message.find("pass --force") == std::string::npos);
    }
    CHECK_FALSE(fs::exists(path));
  }
}

TEST_CASE("hdf5 log: SIGKILL after a flush leaves every flushed record", "[hdf5][fork]") {
  TempDir dir;
  const fs::path path = dir.path() / "killed.h5";
  // flush_interval 10: the 10th, 20th and 30th step() flush; steps 30..36 and
  // their stats and eval stay in memory.
  const int status = run_child([&] {
    auto log = create_hdf5_log(path, experiment_info(), 10);
    ArmLog& arm = log->add_arm(arm_info(0));
    Expected ignored;
    write_steps(arm, 0, 0, 37, ignored);
    ::raise(SIGKILL);
  });
  REQUIRE(WIFSIGNALED(status));
  REQUIRE(WTERMSIG(status) == SIGKILL);
  Expected expected;
  for (std::int64_t s = 0; s < 30; ++s) expected.steps.push_back(s);
  expected.stat_steps = {0, 5, 10, 15, 20, 25};
  expected.eval_steps = {9, 19, 29};
  Id file = open_file(path);
  check_root(file);
  check_arm(file, 0, expected);
}

TEST_CASE("hdf5 log: SIGKILL after flush_all_logs() leaves every record", "[hdf5][fork]") {
  TempDir dir;
  const fs::path path = dir.path() / "flushed.h5";
  const int status = run_child([&] {
    auto log = create_hdf5_log(path, experiment_info(), 1000);
    ArmLog& a = log->add_arm(arm_info(0));
    ArmLog& b = log->add_arm(arm_info(1));
    Expected ignored;
    write_steps(a, 0, 0, 23, ignored);
    write_steps(b, 1, 0, 11, ignored);
    flush_all_logs();
    ::raise(SIGKILL);
  });
  REQUIRE(WIFSIGNALED(status));
  REQUIRE(WTERMSIG(status) == SIGKILL);
  Expected expected[2];
  {
    // The same records, computed without a log.
    std::int64_t last[2] = {23, 11};
    for (int arm = 0; arm < 2; ++arm) {
      for (std::int64_t s = 0; s < last[arm]; ++s) {
        if (s % 5 == 0) expected[arm].stat_steps.push_back(s);
        if (s % 10 == 9) expected[arm].eval_steps.push_back(s);
        expected[arm].steps.push_back(s);
      }
    }
  }
  Id file = open_file(path);
  check_arm(file, 0, expected[0]);
  check_arm(file, 1, expected[1]);
}

TEST_CASE("hdf5 log: SIGTERM with install_flush_on_signals() flushes and exits 143", "[hdf5][fork]") {
  TempDir dir;
  const fs::path path = dir.path() / "terminated.h5";
  const int status = run_child([&] {
    install_flush_on_signals();
    auto log = create_hdf5_log(path, experiment_info(), 1000);
    ArmLog& arm = log->add_arm(arm_info(0));
    Expected ignored;
    write_steps(arm, 0, 0, 52, ignored);  // nothing flushed yet
    ::raise(SIGTERM);
    for (;;) ::pause();  // the watcher thread flushes and exits
  });
  REQUIRE(WIFEXITED(status));
  REQUIRE(WEXITSTATUS(status) == 128 + SIGTERM);
  Expected expected;
  for (std::int64_t s = 0; s < 52; ++s) {
    if (s % 5 == 0) expected.stat_steps.push_back(s);
    if (s % 10 == 9) expected.eval_steps.push_back(s);
    expected.steps.push_back(s);
  }
  // The arm says why and where it stopped (issue 18: a killed run leaves a readable log that says so).
  expected.status = "stopped: terminated (SIGTERM) after step 51";
  Id file = open_file(path);
  check_arm(file, 0, expected);
}

TEST_CASE("hdf5 log: SIGINT with install_flush_on_signals() flushes and exits 130", "[hdf5][fork]") {
  TempDir dir;
  const fs::path path = dir.path() / "interrupted.h5";
  const int status = run_child([&] {
    install_flush_on_signals();
    auto log = create_hdf5_log(path, experiment_info(), 1000);
    ArmLog& arm = log->add_arm(arm_info(1));
    Expected ignored;
    write_steps(arm, 1, 0, 8, ignored);
    ::kill(::getpid(), SIGINT);  // process-directed, as from a terminal
    for (;;) ::pause();
  });
  REQUIRE(WIFEXITED(status));
  REQUIRE(WEXITSTATUS(status) == 128 + SIGINT);
  Expected expected;
  for (std::int64_t s = 0; s < 8; ++s) {
    if (s % 5 == 0) expected.stat_steps.push_back(s);
    expected.steps.push_back(s);
  }
  expected.status = "stopped: interrupted (SIGINT) after step 7";
  Id file = open_file(path);
  check_arm(file, 1, expected);
}

TEST_CASE("hdf5 log: a stopped parallel run names its copied arms and the arms in files of their own",
          "[hdf5][fork]") {
  // mpsim run --jobs N: finished arms are copied in whole; an arm under way trains into a child's file, which the
  // message must point to (it once said "complete arms: none" beside two complete arms).
  TempDir dir;
  {
    auto child = create_hdf5_log(dir.path() / "child0.h5", experiment_info(), 10);
    ArmLog& a = child->add_arm(arm_info(0));
    Expected ignored;
    write_steps(a, 0, 0, 5, ignored);
    a.finish("completed");
  }
  const fs::path path = dir.path() / "run.h5", messages = dir.path() / "stderr.txt";
  const int status = run_child([&] {
    REQUIRE(std::freopen(messages.c_str(), "w", stderr) != nullptr);
    std::setvbuf(stderr, nullptr, _IONBF, 0);  // as at start-up: the exit path _exits, flushing nothing
    install_flush_on_signals();
    auto log = create_hdf5_log(path, experiment_info(), 1000);
    log->copy_arm(dir.path() / "child0.h5", arm_info(0).name);
    log->set_arms_elsewhere("Arms under way are not in it: see parts/arm-1.h5");
    ::kill(::getpid(), SIGINT);
    for (;;) ::pause();
  });
  REQUIRE(WIFEXITED(status));
  REQUIRE(WEXITSTATUS(status) == 128 + SIGINT);
  std::ifstream in(messages);
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  CHECK_THAT(text, Catch::Matchers::Contains("complete arms: " + arm_info(0).name + "; stopped: none"));
  CHECK_THAT(text, Catch::Matchers::Contains("Arms under way are not in it: see parts/arm-1.h5."));
  Id file = open_file(path);
  check_root(file);
}

}  // namespace
}  // namespace mpsim::core
