// The HDF5 experiment log: create_hdf5_log(), flush_all_logs() and
// install_flush_on_signals(). The file layout is docs/hdf5-schema.md.
//
// Locking: every public method of a log and of its arms holds the log's mutex,
// then h5::library_lock(). The registry of open logs has its own mutex, taken
// before any log's mutex (flush_all_logs) and never while holding one.

#include <fcntl.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <functional>
#include <cerrno>
#include <cstdio>
#include <limits>
#include <mutex>
#include <stdexcept>
#include <string>
#include <system_error>
#include <thread>
#include <variant>
#include <vector>

#include "h5.hpp"
#include "mpsim/core/agreement.hpp"
#include "mpsim/core/config.hpp"
#include "mpsim/core/run_log.hpp"
#include "mpsim/core/policy.hpp"

namespace mpsim::core {

namespace {

constexpr std::int32_t schema_version = 9;  // 2: /arms/<arm>/policy/; 3: cpu, arms' threads and gemm; 4: stats/logit_max;
                                            // 5: the policy points softmax_internals and norm_statistics;
                                            // 6: the policy point loss_internals; 7: ReLU's and max
                                            // pooling's input gradients counted once (their records empty
                                            // where they only select values already counted), and the
                                            // counter "flushed" renamed "rounded_to_zero"; 8: /arms/<arm>/shadow/;
                                            // 9: the kinds attention_logits and attention_probs
// Values of /arms/<arm>/binade for the bins that are not binades.
constexpr std::int32_t zero_bin_value = 1000;
constexpr std::int32_t infinity_bin_value = 1001;
constexpr std::int32_t nan_bin_value = 1002;
// Chunk lengths along the step axis.
constexpr hsize_t step_chunk = 256;
constexpr hsize_t stats_chunk = 16;
constexpr hsize_t eval_chunk = 64;

constexpr std::size_t kinds = tensor_kind_count;
constexpr std::size_t bins = Binades::bin_count;
constexpr std::size_t counters_per_kind = counter_count;

std::vector<std::string> kind_names() {
  std::vector<std::string> names;
  for (int k = 0; k < tensor_kind_count; ++k) names.emplace_back(to_string(static_cast<TensorKind>(k)));
  return names;
}

std::vector<std::string> counter_names() {
  std::vector<std::string> names;
  for (int c = 0; c < counter_count; ++c) names.emplace_back(to_string(static_cast<Counter>(c)));
  return names;
}

std::vector<std::int32_t> binade_values() {
  std::vector<std::int32_t> values;
  for (int e = Binades::min_exponent; e <= Binades::max_exponent; ++e) values.push_back(e);
  values.push_back(zero_bin_value);
  values.push_back(infinity_bin_value);
  values.push_back(nan_bin_value);
  return values;
}

std::vector<std::string> bin_labels() {
  std::vector<std::string> labels;
  for (int e = Binades::min_exponent; e <= Binades::max_exponent; ++e) labels.push_back("2^" + std::to_string(e));
  labels.emplace_back("zero");
  labels.emplace_back("inf");
  labels.emplace_back("nan");
  return labels;
}

// --- Records, from their field tables (run_log.hpp) --------------------------------

// A record field's types: in the file (little-endian) and in memory, as the
// column type T that its values are converted to.
template <typename T>
struct RecordType;
template <>
struct RecordType<std::int64_t> {
  using Column = std::int64_t;
  static hid_t file() { return H5T_STD_I64LE; }
  static hid_t memory() { return H5T_NATIVE_INT64; }
};
template <>
struct RecordType<double> {
  using Column = double;
  static hid_t file() { return H5T_IEEE_F64LE; }
  static hid_t memory() { return H5T_NATIVE_DOUBLE; }
};
template <>
struct RecordType<bool> {
  using Column = std::uint8_t;
  static hid_t file() { return H5T_STD_U8LE; }
  static hid_t memory() { return H5T_NATIVE_UINT8; }
};

// Creates one dataset per field of `table` in `group`, the first made the
// dimension scale `step` and attached to the others.
template <typename Record, std::size_t N>
void create_record_datasets(hid_t group, const std::array<RecordField<Record>, N>& table, hsize_t chunk,
                            std::array<h5::Handle, N>& datasets) {
  for (std::size_t i = 0; i < N; ++i) {
    std::visit(
        [&](auto member) {
          using T = std::remove_cvref_t<decltype(std::declval<Record&>().*member)>;
          datasets[i] = h5::create_extendible(group, std::string(table[i].name), RecordType<T>::file(), {}, {chunk});
        },
        table[i].member);
    if (i == 0)
      h5::make_scale(datasets[0].get(), "step");
    else
      h5::attach_scale(datasets[i].get(), datasets[0].get(), 0);
  }
}

// Appends `records` to their datasets, one column per field.
template <typename Record, std::size_t N>
void append_records(const std::vector<Record>& records, const std::array<RecordField<Record>, N>& table,
                    const std::array<h5::Handle, N>& datasets) {
  for (std::size_t i = 0; i < N; ++i) {
    std::visit(
        [&](auto member) {
          using T = std::remove_cvref_t<decltype(std::declval<Record&>().*member)>;
          using Column = typename RecordType<T>::Column;
          std::vector<Column> column;
          column.reserve(records.size());
          for (const Record& r : records) column.push_back(static_cast<Column>(r.*member));
          h5::append_rows(datasets[i].get(), RecordType<T>::memory(), records.size(), column.data());
        },
        table[i].member);
  }
}

// Reads the records of `group_name` ("steps", "eval") of an arm, one column per field.
template <typename Record, std::size_t N>
std::vector<Record> read_records(const std::filesystem::path& file, const std::string& arm,
                                 const std::string& group_name, const std::array<RecordField<Record>, N>& table) {
  auto library = h5::library_lock();
  const std::string where = file.string() + ": arm '" + arm + "'";
  const h5::Handle source =
      h5::take(H5Fopen(file.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT), "cannot open HDF5 log " + file.string());
  const std::string path = "arms/" + arm + "/" + group_name;
  const h5::Handle group = h5::take(H5Gopen2(source.get(), path.c_str(), H5P_DEFAULT), where + ": no group " + path);
  std::vector<Record> records;
  for (std::size_t i = 0; i < N; ++i) {
    const std::string name(table[i].name);
    const h5::Handle dataset =
        h5::take(H5Dopen2(group.get(), name.c_str(), H5P_DEFAULT), where + ": no dataset " + path + "/" + name);
    const std::vector<hsize_t> dims = h5::extent(dataset.get());
    if (dims.size() != 1) throw std::runtime_error(where + ": " + path + "/" + name + " is not 1-D");
    if (i == 0) records.resize(dims[0]);
    if (dims[0] != records.size())
      throw std::runtime_error(where + ": " + path + "/" + name + " has " + std::to_string(dims[0]) + " rows, " +
                               path + "/" + std::string(table[0].name) + " " + std::to_string(records.size()));
    if (records.empty()) continue;
    std::visit(
        [&](auto member) {
          using T = std::remove_cvref_t<decltype(std::declval<Record&>().*member)>;
          std::vector<typename RecordType<T>::Column> column(records.size());
          h5::read_all(dataset.get(), RecordType<T>::memory(), column.data());
          for (std::size_t r = 0; r < records.size(); ++r) records[r].*member = static_cast<T>(column[r]);
        },
        table[i].member);
  }
  return records;
}

class Hdf5Log;

class Hdf5Arm final : public ArmLog {
 public:
  Hdf5Arm(Hdf5Log& log, hid_t arms_group, const ArmInfo& info);

  void step(const StepRecord& record) override;
  void stats(std::int64_t step, const LayerStats& stats, std::span<const double> logit_max) override;
  void block_stats(std::int64_t step, const LayerBlockStats& stats) override;
  void eval(const EvalRecord& record) override;
  void shadow(std::span<const ShadowRecord> records) override;
  void finish(const std::string& status) override;

  const std::string& name() const { return name_; }
  bool finished() const { return finished_; }
  std::int64_t last_step() const { return last_step_; }  // -1 before the first step
  std::int64_t flushed_step() const { return flushed_step_; }  // the last step in the file on disk; -1: none
  void mark_flushed() { flushed_step_ = last_step_; }
  bool pending() const {
    return !steps_.empty() || !stat_steps_.empty() || !evals_.empty() || !shadows_.empty() ||
           !blocks_.steps.empty();
  }
  // An upper bound of what the next flush adds to the file: the buffered
  // records uncompressed, plus one whole chunk of every dataset, since a flush
  // rewrites each dataset's last, partly filled chunk (deflated: at most its
  // size, and HDF5 may put it in new space).
  std::uint64_t flush_bytes_bound() const {
    if (!pending()) return 0;
    return steps_.size() * sizeof(StepRecord) + stat_steps_.size() * sizeof(std::int64_t) +
           histograms_.size() * sizeof(std::uint32_t) + counters_.size() * sizeof(std::uint64_t) +
           logit_max_.size() * sizeof(double) + evals_.size() * sizeof(EvalRecord) +
           shadows_.size() * sizeof(ShadowRecord) + blocks_.buffered_bytes() +
           chunk_bytes_;
  }
  // Closes nothing: after a failed write (Hdf5Log::~Hdf5Log).
  void abandon() noexcept {
    for (auto& h : steps_ds_) h.abandon();
    for (auto& h : eval_ds_) h.abandon();
    for (auto& h : shadow_ds_) h.abandon();
    stats_ds_.step.abandon();
    stats_ds_.histogram.abandon();
    stats_ds_.counters.abandon();
    stats_ds_.logit_max.abandon();
    for (auto& h : blocks_.datasets) h.abandon();
    group_.abandon();
  }
  // Appends the buffered records; the caller holds the log's locks.
  void append_pending();
  void reset_step_count() { steps_since_flush_ = 0; }
  // The arm's group, for the status attribute.
  void write_status(const std::string& status) { h5::write_attribute(group_.get(), "status", status); }

 private:
  Hdf5Log& log_;
  std::string name_;
  std::size_t layers_;
  h5::Handle group_;
  std::array<h5::Handle, step_record_fields.size()> steps_ds_;  // in table order; [0] is the step scale
  struct {
    h5::Handle step, histogram, counters, logit_max;
  } stats_ds_;
  std::array<h5::Handle, eval_record_fields.size()> eval_ds_;
  std::array<h5::Handle, shadow_record_fields.size()> shadow_ds_;
  // /arms/<arm>/block_stats/, for policies with block points: step, then
  // scale_binades, scale_codes, counters, error ([n][layers][operands][bins]).
  struct BlockData {
    std::array<h5::Handle, 5> datasets;
    std::vector<std::int64_t> steps;
    std::array<std::vector<std::uint64_t>, 4> values;
    std::uint64_t buffered_bytes() const {
      std::uint64_t n = steps.size() * 8;
      for (const auto& v : values) n += v.size() * 8;
      return n;
    }
  } blocks_;

  std::vector<StepRecord> steps_;
  std::vector<std::int64_t> stat_steps_;
  std::vector<std::uint32_t> histograms_;  // [n][layers][kinds][bins]
  std::vector<std::uint64_t> counters_;    // [n][layers][kinds][counters]
  std::vector<double> logit_max_;          // [n][layers]
  std::vector<EvalRecord> evals_;
  std::vector<ShadowRecord> shadows_;
  int steps_since_flush_ = 0;
  bool finished_ = false;
  std::int64_t last_step_ = -1, flushed_step_ = -1;
  std::uint64_t chunk_bytes_ = 0;  // one chunk of each of its datasets
};

class Hdf5Log final : public ExperimentLog {
 public:
  Hdf5Log(const std::filesystem::path& path, const ExperimentInfo& info, int flush_interval);
  ~Hdf5Log() override;

  ArmLog& add_arm(const ArmInfo& info) override;
  void add_agreement(const Agreement& agreement) override;
  void copy_arm(const std::filesystem::path& file, const std::string& name) override;
  void set_arms_elsewhere(std::string note) override;
  void flush() override;

  // Both locks, in order; throws if an earlier write failed.
  struct Guard {
    std::unique_lock<std::mutex> log;
    std::unique_lock<std::recursive_mutex> library;
  };
  Guard lock();
  // Appends every arm's buffers and flushes the file; the caller holds the locks.
  void flush_locked();
  // flush(), reporting errors on stderr instead of throwing.
  void flush_noexcept();
  // For the exit path: locks the log's mutex and never unlocks it.
  void lock_forever() { mutex_.lock(); }
  void flush_locked_noexcept();
  // For the exit path, with the locks held: marks every unfinished arm
  // "stopped: <why> after step N" and says on stderr what the file holds.
  void report_stopped_locked(const std::string& why);
  std::string describe_write_failure(const std::string& what, bool before_writing) const;

  int flush_interval() const { return flush_interval_; }
  void mark_dirty() { dirty_ = true; }

 private:
  std::mutex mutex_;
  std::filesystem::path path_;
  int flush_interval_;
  std::string broken_;  // why the log stopped accepting writes; empty while usable
  bool write_failed_ = false;  // a write failed half-way: the file is left unclosed (~Hdf5Log)
  bool dirty_ = false;
  // Destroyed in reverse order: arms' datasets, then the group, then the file.
  h5::Handle file_;
  h5::Handle arms_group_;
  h5::Handle agreement_group_;  // made by the first add_agreement
  std::vector<std::unique_ptr<Hdf5Arm>> arms_;
  std::vector<std::string> copied_;  // finished arms copied in whole (copy_arm)
  std::string elsewhere_;            // set_arms_elsewhere's note
};

// --- Registry of open logs ---------------------------------------------------------
// Never destroyed, so the signal watcher may use them during static destruction.
std::mutex& registry_mutex() {
  static auto* mutex = new std::mutex;
  return *mutex;
}
std::vector<Hdf5Log*>& registry() {
  static auto* logs = new std::vector<Hdf5Log*>;
  return *logs;
}

// The bytes a file may still grow by: the space its file system has for us,
// and the process's file size limit (RLIMIT_FSIZE) less the file's size.
std::uint64_t room_for_writes(const std::filesystem::path& path) {
  std::uint64_t room = std::numeric_limits<std::uint64_t>::max();
  struct statvfs disk {};
  if (::statvfs(path.c_str(), &disk) == 0) room = std::uint64_t{disk.f_bavail} * disk.f_frsize;
  struct rlimit limit {};
  std::error_code ec;
  const std::uintmax_t size = std::filesystem::file_size(path, ec);
  if (::getrlimit(RLIMIT_FSIZE, &limit) == 0 && limit.rlim_cur != RLIM_INFINITY && !ec)
    room = std::min<std::uint64_t>(room, limit.rlim_cur > size ? limit.rlim_cur - size : 0);
  return room;
}

void register_log(Hdf5Log* log) {
  std::lock_guard lock(registry_mutex());
  registry().push_back(log);
}

void unregister_log(Hdf5Log* log) {
  std::lock_guard lock(registry_mutex());
  auto& logs = registry();
  logs.erase(std::remove(logs.begin(), logs.end(), log), logs.end());
}

// The attributes of an attribute table (run_log.hpp) on `object`; members
// stored otherwise (layer names, the policy) are written by their own code.
template <typename S, std::size_t N>
void write_attributes(hid_t object, const std::array<AttributeField<S>, N>& table, const S& values) {
  for (const auto& f : table)
    visit_field(f, values, [&](const auto& value) {
      using T = std::remove_cvref_t<decltype(value)>;
      if constexpr (std::is_same_v<T, int>) h5::write_attribute(object, std::string(f.name), std::int32_t{value});
      else if constexpr (std::is_same_v<T, std::string> || std::is_same_v<T, std::uint64_t>)
        h5::write_attribute(object, std::string(f.name), value);
    });
}

// /arms/<arm>/policy/: the policy field by field, named as the config names
// them (docs/configs.md), from config.hpp's policy_attributes.
void write_policy(hid_t arm_group, const Policy& p) {
  // Some 70 attributes, kept compact so that copy_arm can copy them (h5.hpp).
  h5::Handle group = h5::create_group(arm_group, "policy", 128);
  for (const PolicyAttribute& a : policy_attributes(p))
    std::visit(
        [&](const auto& value) {
          using T = std::remove_cvref_t<decltype(value)>;
          if constexpr (std::is_same_v<T, int>) h5::write_attribute(group.get(), a.name, std::int32_t{value});
          else h5::write_attribute(group.get(), a.name, value);
        },
        a.value);
}

// --- Hdf5Arm -------------------------------------------------------------------------

Hdf5Arm::Hdf5Arm(Hdf5Log& log, hid_t arms_group, const ArmInfo& info)
    : log_(log), name_(info.name), layers_(info.layers.size()) {
  group_ = h5::create_group(arms_group, info.name, 32);  // compact attributes, for copy_arm (h5.hpp)
  const hid_t g = group_.get();
  write_attributes(g, arm_attribute_fields, info);
  h5::write_attribute(g, "status", "running");
  write_policy(g, info.resolved_policy);

  // Coordinates, shared by the stats datasets.
  h5::Handle layer = h5::create_string_array(g, "layer", info.layers);
  h5::make_scale(layer.get(), "layer");
  h5::Handle kind = h5::create_string_array(g, "kind", kind_names());
  h5::make_scale(kind.get(), "kind");
  const std::vector<std::int32_t> binades = binade_values();
  h5::Handle binade = h5::create_array(g, "binade", H5T_STD_I32LE, H5T_NATIVE_INT32, {binades.size()}, binades.data());
  h5::make_scale(binade.get(), "binade");
  h5::create_string_array(g, "bin_label", bin_labels());
  h5::Handle counter = h5::create_string_array(g, "counter", counter_names());
  h5::make_scale(counter.get(), "counter");

  {
    h5::Handle steps = h5::create_group(g, "steps");
    create_record_datasets(steps.get(), step_record_fields, step_chunk, steps_ds_);
  }
  {
    h5::Handle stats = h5::create_group(g, "stats");
    const hid_t s = stats.get();
    auto& d = stats_ds_;
    d.step = h5::create_extendible(s, "step", H5T_STD_I64LE, {}, {step_chunk});
    h5::make_scale(d.step.get(), "step");
    // One layer per histogram chunk (16 x 6 x 280 x 4 bytes = 105 KiB).
    d.histogram = h5::create_extendible(s, "histogram", H5T_STD_U32LE, {layers_, kinds, bins},
                                        {stats_chunk, 1, kinds, bins});
    d.counters = h5::create_extendible(s, "counters", H5T_STD_U64LE, {layers_, kinds, counters_per_kind},
                                       {stats_chunk, 64, kinds, counters_per_kind});
    for (const hid_t dataset : {d.histogram.get(), d.counters.get()}) {
      h5::attach_scale(dataset, d.step.get(), 0);
      h5::attach_scale(dataset, layer.get(), 1);
      h5::attach_scale(dataset, kind.get(), 2);
    }
    h5::attach_scale(d.histogram.get(), binade.get(), 3);
    h5::attach_scale(d.counters.get(), counter.get(), 3);
    d.logit_max = h5::create_extendible(s, "logit_max", H5T_IEEE_F64LE, {layers_}, {stats_chunk, layers_});
    h5::attach_scale(d.logit_max.get(), d.step.get(), 0);
    h5::attach_scale(d.logit_max.get(), layer.get(), 1);
  }
  {
    h5::Handle eval = h5::create_group(g, "eval");
    create_record_datasets(eval.get(), eval_record_fields, eval_chunk, eval_ds_);
  }
  {  // empty unless train.shadow_interval > 0
    h5::Handle shadow = h5::create_group(g, "shadow");
    create_record_datasets(shadow.get(), shadow_record_fields, eval_chunk, shadow_ds_);
  }
  if (uses_block_formats(info.resolved_policy)) {
    h5::Handle group = h5::create_group(g, "block_stats");
    const hid_t s = group.get();
    std::vector<std::string> operands;
    for (const auto& b : block_points) operands.emplace_back(b.name);
    h5::Handle operand = h5::create_string_array(s, "operand", operands);
    h5::make_scale(operand.get(), "operand");
    std::vector<std::string> counters;
    for (const auto name : block_counter_names.names) counters.emplace_back(name);
    h5::Handle counter = h5::create_string_array(s, "counter", counters);
    h5::make_scale(counter.get(), "counter");
    std::vector<std::int32_t> codes(256);
    std::vector<double> errors(BlockStats::error_bins, 0.0);  // each bin's lower edge, log2; 0 for the last two
    for (int i = 0; i < 256; ++i) codes[static_cast<std::size_t>(i)] = i;
    for (int i = 0; i < BlockStats::error_finite_bins; ++i)
      errors[static_cast<std::size_t>(i)] =
          BlockStats::error_min_exponent + static_cast<double>(i) / BlockStats::error_bins_per_binade;
    h5::Handle code = h5::create_array(s, "scale_code", H5T_STD_I32LE, H5T_NATIVE_INT32, {codes.size()}, codes.data());
    h5::make_scale(code.get(), "scale_code");
    h5::Handle error = h5::create_array(s, "error_log2", H5T_IEEE_F64LE, H5T_NATIVE_DOUBLE, {errors.size()},
                                        errors.data());
    h5::make_scale(error.get(), "error_log2");
    auto& d = blocks_.datasets;
    d[0] = h5::create_extendible(s, "step", H5T_STD_I64LE, {}, {step_chunk});
    h5::make_scale(d[0].get(), "step");
    const std::size_t ops = gemm_operand_count;
    const std::array<std::size_t, 4> widths{bins, 256, static_cast<std::size_t>(block_counter_count),
                                            static_cast<std::size_t>(BlockStats::error_bins)};
    const std::array<const char*, 4> names{"scale_binades", "scale_codes", "counters", "error"};
    const std::array<hid_t, 4> last_scales{binade.get(), code.get(), counter.get(), error.get()};
    for (std::size_t i = 0; i < 4; ++i) {
      d[i + 1] = h5::create_extendible(s, names[i], H5T_STD_U64LE, {layers_, ops, widths[i]},
                                       {stats_chunk, 1, ops, widths[i]});
      h5::attach_scale(d[i + 1].get(), d[0].get(), 0);
      h5::attach_scale(d[i + 1].get(), layer.get(), 1);
      h5::attach_scale(d[i + 1].get(), operand.get(), 2);
      h5::attach_scale(d[i + 1].get(), last_scales[i], 3);
      chunk_bytes_ += layers_ * stats_chunk * ops * widths[i] * 8;
    }
    chunk_bytes_ += step_chunk * 8;
  }
  // Every record field is at most 8 bytes; one histogram chunk per layer, one counters chunk per 64 layers.
  chunk_bytes_ += (step_record_fields.size() + 1) * step_chunk * 8 +
                 (eval_record_fields.size() + shadow_record_fields.size()) * eval_chunk * 8 +
                 layers_ * stats_chunk * kinds * bins * 4 + layers_ * stats_chunk * 8 +
                 (layers_ + 63) / 64 * stats_chunk * 64 * kinds * counters_per_kind * 8;
}

void Hdf5Arm::step(const StepRecord& record) {
  auto guard = log_.lock();
  steps_.push_back(record);
  last_step_ = record.step;
  if (++steps_since_flush_ >= log_.flush_interval()) log_.flush_locked();
}

void Hdf5Arm::stats(std::int64_t step, const LayerStats& stats, std::span<const double> logit_max) {
  auto guard = log_.lock();
  if (stats.size() != layers_ || logit_max.size() != layers_) {
    throw std::invalid_argument("HDF5 log: arm '" + name_ + "' has " + std::to_string(layers_) +
                                " layers, but stats for step " + std::to_string(step) + " have " +
                                std::to_string(stats.size()) + " and logit maxima " +
                                std::to_string(logit_max.size()));
  }
  const std::size_t old_histograms = histograms_.size(), old_counters = counters_.size();
  try {
    for (std::size_t l = 0; l < layers_; ++l) {
      for (std::size_t k = 0; k < kinds; ++k) {
        const TensorStats& s = stats[l][k];
        for (std::size_t b = 0; b < bins; ++b) {
          if (s.histogram[b] > std::numeric_limits<std::uint32_t>::max()) {
            throw std::overflow_error("HDF5 log: arm '" + name_ + "', step " + std::to_string(step) + ", layer " +
                                      std::to_string(l) + ", " +
                                      std::string(to_string(static_cast<TensorKind>(k))) + ": histogram bin " +
                                      std::to_string(b) + " counts " + std::to_string(s.histogram[b]) +
                                      " values, more than a uint32 holds");
          }
          histograms_.push_back(static_cast<std::uint32_t>(s.histogram[b]));
        }
        counters_.insert(counters_.end(), s.counters.begin(), s.counters.end());
      }
    }
  } catch (...) {
    histograms_.resize(old_histograms);
    counters_.resize(old_counters);
    throw;
  }
  logit_max_.insert(logit_max_.end(), logit_max.begin(), logit_max.end());
  stat_steps_.push_back(step);
}

void Hdf5Arm::block_stats(std::int64_t step, const LayerBlockStats& stats) {
  auto guard = log_.lock();
  if (!blocks_.datasets[0]) return;  // the policy has no block points
  if (stats.size() != layers_)
    throw std::invalid_argument("HDF5 log: arm '" + name_ + "' has " + std::to_string(layers_) +
                                " layers, but block stats for step " + std::to_string(step) + " have " +
                                std::to_string(stats.size()));
  auto& v = blocks_.values;
  for (std::size_t l = 0; l < layers_; ++l)
    for (const BlockStats& b : stats[l]) {
      v[0].insert(v[0].end(), b.scale_binades.begin(), b.scale_binades.end());
      v[1].insert(v[1].end(), b.scale_codes.begin(), b.scale_codes.end());
      v[2].insert(v[2].end(), b.counters.begin(), b.counters.end());
      v[3].insert(v[3].end(), b.error.begin(), b.error.end());
    }
  blocks_.steps.push_back(step);
}

void Hdf5Arm::eval(const EvalRecord& record) {
  auto guard = log_.lock();
  evals_.push_back(record);
}

void Hdf5Arm::shadow(std::span<const ShadowRecord> records) {
  auto guard = log_.lock();
  shadows_.insert(shadows_.end(), records.begin(), records.end());
}

void Hdf5Arm::finish(const std::string& status) {
  auto guard = log_.lock();
  // The records first: the status must not say "completed" in a file that
  // lacks the arm's last steps (a flush refused for want of room throws here).
  log_.flush_locked();
  write_status(status);
  finished_ = true;
  log_.mark_dirty();
  log_.flush_locked();
}

void Hdf5Arm::append_pending() {
  if (!steps_.empty()) {
    append_records(steps_, step_record_fields, steps_ds_);
    steps_.clear();
  }
  if (!stat_steps_.empty()) {
    const std::size_t n = stat_steps_.size();
    auto& d = stats_ds_;
    h5::append_rows(d.step.get(), H5T_NATIVE_INT64, n, stat_steps_.data());
    h5::append_rows(d.histogram.get(), H5T_NATIVE_UINT32, n, histograms_.data());
    h5::append_rows(d.counters.get(), H5T_NATIVE_UINT64, n, counters_.data());
    h5::append_rows(d.logit_max.get(), H5T_NATIVE_DOUBLE, n, logit_max_.data());
    logit_max_.clear();
    stat_steps_.clear();
    histograms_.clear();
    counters_.clear();
  }
  if (!evals_.empty()) {
    append_records(evals_, eval_record_fields, eval_ds_);
    evals_.clear();
  }
  if (!shadows_.empty()) {
    append_records(shadows_, shadow_record_fields, shadow_ds_);
    shadows_.clear();
  }
  if (!blocks_.steps.empty()) {
    const std::size_t n = blocks_.steps.size();
    h5::append_rows(blocks_.datasets[0].get(), H5T_NATIVE_INT64, n, blocks_.steps.data());
    for (std::size_t i = 0; i < 4; ++i) {
      h5::append_rows(blocks_.datasets[i + 1].get(), H5T_NATIVE_UINT64, n, blocks_.values[i].data());
      blocks_.values[i].clear();
    }
    blocks_.steps.clear();
  }
}

// --- Hdf5Log -------------------------------------------------------------------------

Hdf5Log::Hdf5Log(const std::filesystem::path& path, const ExperimentInfo& info, int flush_interval)
    : path_(path), flush_interval_(flush_interval) {
  if (flush_interval < 1) {
    throw std::invalid_argument("HDF5 log " + path.string() + ": flush interval must be at least 1, not " +
                                std::to_string(flush_interval));
  }
  auto library = h5::library_lock();
  file_ = h5::create_file(path);
  try {
    const hid_t root = file_.get();
    write_attributes(root, experiment_attribute_fields, info);
    h5::write_attribute(root, "schema_version", schema_version);
    arms_group_ = h5::create_group(root, "arms");
    h5::flush_file(root);
  } catch (...) {
    // The file is ours (created exclusively): leave nothing half-made behind.
    arms_group_.reset();
    file_.reset();
    std::error_code ec;
    std::filesystem::remove(path, ec);
    throw;
  }
}

Hdf5Log::~Hdf5Log() {
  unregister_log(this);
  std::lock_guard lock(mutex_);
  auto library = h5::library_lock();
  if (broken_.empty()) {
    try {
      flush_locked();
    } catch (const std::exception& e) {
      std::fprintf(stderr, "mpsim: %s\n", e.what());
    }
  }
  if (write_failed_) {
    // Closing would flush HDF5's caches into the file whose write failed
    // (and libhdf5 1.10.8 crashes doing so): leave it as it is.
    for (const auto& arm : arms_) arm->abandon();
    agreement_group_.abandon();
    arms_group_.abandon();
    file_.abandon();
    return;
  }
  arms_.clear();
  agreement_group_.reset();
  arms_group_.reset();
  try {
    file_.close("cannot close HDF5 log " + path_.string());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "mpsim: %s\n", e.what());
  }
}

Hdf5Log::Guard Hdf5Log::lock() {
  Guard guard{std::unique_lock<std::mutex>(mutex_), h5::library_lock()};
  if (!broken_.empty()) {
    throw std::runtime_error("HDF5 log " + path_.string() + " is unusable after an earlier error: " + broken_);
  }
  return guard;
}

ArmLog& Hdf5Log::add_arm(const ArmInfo& info) {
  auto guard = lock();
  const std::string& name = info.name;
  if (!usable_arm_name(name)) {
    throw std::invalid_argument("HDF5 log " + path_.string() + ": arm name '" + name +
                                "' is not usable as a group name (empty, '.', '..' or containing '/')");
  }
  for (const auto& arm : arms_) {
    if (arm->name() == name) {
      throw std::invalid_argument("HDF5 log " + path_.string() + ": arm '" + name + "' already exists");
    }
  }
  arms_.push_back(std::make_unique<Hdf5Arm>(*this, arms_group_.get(), info));
  dirty_ = true;
  flush_locked();
  return *arms_.back();
}

void Hdf5Log::copy_arm(const std::filesystem::path& file, const std::string& name) {
  auto guard = lock();
  if (std::find(copied_.begin(), copied_.end(), name) != copied_.end())
    throw std::invalid_argument("HDF5 log " + path_.string() + ": arm '" + name + "' already exists");
  for (const auto& arm : arms_) {
    if (arm->name() == name) {
      throw std::invalid_argument("HDF5 log " + path_.string() + ": arm '" + name + "' already exists");
    }
  }
  const h5::Handle source =
      h5::take(H5Fopen(file.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT), "cannot open HDF5 log " + file.string());
  const h5::Handle arms = h5::take(H5Gopen2(source.get(), "arms", H5P_DEFAULT), file.string() + ": no /arms group");
  // The copy is about as large as the arm's file; as in flush_locked, not
  // started when it may not fit.
  std::error_code ec;
  const std::uint64_t needed = std::filesystem::file_size(file, ec) + (std::uint64_t{1} << 20);
  if (const std::uint64_t room = room_for_writes(path_); !ec && room < needed) {
    broken_ = "no room to copy an arm";
    throw LogWriteError(describe_write_failure("only " + std::to_string(room) + " bytes are left for it, and copying "
                                               "arm '" + name + "' from " + file.string() + " may need up to " +
                                               std::to_string(needed),
                                               true));
  }
  try {
    h5::copy_tree(arms.get(), arms_group_.get(), name);
  } catch (const std::exception& e) {
    broken_ = e.what();
    write_failed_ = true;
    throw LogWriteError(describe_write_failure(e.what(), false));
  }
  copied_.push_back(name);
  dirty_ = true;
  flush_locked();
}

void Hdf5Log::set_arms_elsewhere(std::string note) {
  std::lock_guard lock(mutex_);
  elsewhere_ = std::move(note);
}

void Hdf5Log::add_agreement(const Agreement& a) {
  auto guard = lock();
  if (!agreement_group_) agreement_group_ = h5::create_group(file_.get(), "agreement");
  h5::Handle group = h5::create_group(agreement_group_.get(), a.other);
  const hid_t g = group.get();
  h5::write_attribute(g, "reference", a.reference);
  h5::write_attribute(g, "other", a.other);
  h5::write_attribute(g, "max_loss_relative_difference", a.max_loss_relative_difference);
  h5::write_attribute(g, "test_accuracy_difference", a.test_accuracy_difference);
  h5::Handle layer = h5::create_string_array(g, "layer", a.layers);
  h5::make_scale(layer.get(), "layer");
  h5::Handle kind = h5::create_string_array(g, "kind", kind_names());
  h5::make_scale(kind.get(), "kind");
  std::vector<double> distance;
  for (const auto& row : a.histogram_distance) distance.insert(distance.end(), row.begin(), row.end());
  h5::Handle d = h5::create_array(g, "histogram_distance", H5T_IEEE_F64LE, H5T_NATIVE_DOUBLE,
                                  {a.histogram_distance.size(), std::size_t{tensor_kind_count}}, distance.data());
  h5::attach_scale(d.get(), layer.get(), 0);
  h5::attach_scale(d.get(), kind.get(), 1);
  dirty_ = true;
  flush_locked();
}

void Hdf5Log::flush() {
  auto guard = lock();
  flush_locked();
}


void Hdf5Log::flush_locked() {
  bool pending = dirty_;
  for (const auto& arm : arms_) pending = pending || arm->pending();
  if (!pending) return;
  // A write that fails half-way can leave the file unreadable (HDF5 updates
  // its metadata in place), so a flush that might not fit is not started: the
  // file then stays as its last flush left it, readable.
  std::uint64_t needed = std::uint64_t{1} << 20;  // metadata, attributes, B-tree nodes
  for (const auto& arm : arms_) needed += arm->flush_bytes_bound();
  if (const std::uint64_t room = room_for_writes(path_); room < needed) {
    broken_ = "no room for the next flush";
    throw LogWriteError(describe_write_failure(
        "only " + std::to_string(room) + " bytes are left for it (disk space or the file size limit), and the next "
        "flush may need up to " + std::to_string(needed),
        true));
  }
  try {
    for (const auto& arm : arms_) {
      arm->append_pending();
      arm->reset_step_count();
    }
    h5::flush_file(file_.get());
    dirty_ = false;
    for (const auto& arm : arms_) arm->mark_flushed();
  } catch (const std::exception& e) {
    // Datasets may now differ in length: refuse further writes.
    broken_ = e.what();
    write_failed_ = true;
    throw LogWriteError(describe_write_failure(e.what(), false));
  }
}


// A write that failed (a full disk, a file size limit, a lost mount): what
// failed, which arms it stopped, and what the file held at its last flush.
// "complete arms: a, b; LABEL: c (NOTE), d (NOTE)", "none" for an empty list.
std::string arm_lists(const std::vector<std::unique_ptr<Hdf5Arm>>& arms, const std::vector<std::string>& copied,
                      const std::string& label, const std::function<std::string(const Hdf5Arm&)>& note) {
  std::string complete, unfinished;
  for (const std::string& name : copied) complete += (complete.empty() ? "" : ", ") + name;
  for (const auto& arm : arms) {
    std::string& list = arm->finished() ? complete : unfinished;
    list += (list.empty() ? "" : ", ") + arm->name() + (arm->finished() ? "" : " (" + note(*arm) + ")");
  }
  return "complete arms: " + (complete.empty() ? "none" : complete) + "; " + label + ": " +
         (unfinished.empty() ? "none" : unfinished);
}

std::string Hdf5Log::describe_write_failure(const std::string& what, bool before_writing) const {
  const std::string arms = arm_lists(arms_, copied_, "unfinished", [](const Hdf5Arm& arm) {
    const std::int64_t step = arm.flushed_step();
    return step < 0 ? std::string("none of its steps") : "steps up to " + std::to_string(step);
  });
  if (before_writing)
    return "the log " + path_.string() + " is out of room: " + what + ". Training stopped before writing, so the " +
           "file is readable as its last flush left it (" + arms + "; their status attributes still say " +
           "'running'). Make room and run again with --force.";
  return "cannot write the log " + path_.string() + "; training stopped, and the file may be unreadable now. " +
         "Before this write it held " + arms + ". Make room and run again with --force. (HDF5: " + what + ")";
}

void Hdf5Log::flush_locked_noexcept() {
  if (!broken_.empty()) return;
  try {
    flush_locked();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "mpsim: %s\n", e.what());
  }
}

void Hdf5Log::report_stopped_locked(const std::string& why) {
  const auto where = [](const Hdf5Arm& arm) {
    return arm.last_step() < 0 ? std::string("before its first step") : "after step " + std::to_string(arm.last_step());
  };
  if (broken_.empty()) {
    for (const auto& arm : arms_) {
      if (arm->finished()) continue;
      try {
        arm->write_status("stopped: " + why + " " + where(*arm));
        dirty_ = true;
      } catch (const std::exception& e) {
        std::fprintf(stderr, "mpsim: %s\n", e.what());
      }
    }
  }
  std::fprintf(stderr,
               "\nmpsim: %s. %s %s: %s. Every step up to the last flush is there.%s To run it again, repeat the "
               "command with --force (arms start from step 0).\n",
               why.c_str(), path_.string().c_str(), broken_.empty() ? "is flushed and readable" : "may be incomplete",
               arm_lists(arms_, copied_, "stopped", where).c_str(),
               elsewhere_.empty() ? "" : (" " + elsewhere_ + ".").c_str());
}

void Hdf5Log::flush_noexcept() {
  std::lock_guard lock(mutex_);
  auto library = h5::library_lock();
  flush_locked_noexcept();
}

// --- Signals ---------------------------------------------------------------------------

int signal_pipe_write = -1;

extern "C" void on_flush_signal(int signal_number) {
  const int saved_errno = errno;
  const unsigned char byte = static_cast<unsigned char>(signal_number);
  const ssize_t written = ::write(signal_pipe_write, &byte, 1);  // async-signal-safe; non-blocking
  static_cast<void>(written);
  errno = saved_errno;
}

// Flushes every open log and keeps them locked, so no other thread writes to
// a file between the flush and _exit.
void flush_all_logs_for_exit(int signal_number) {
  registry_mutex().lock();
  for (Hdf5Log* log : registry()) log->lock_forever();
  auto library = h5::library_lock();
  const std::string why = signal_number == SIGINT ? "interrupted (SIGINT)" : "terminated (SIGTERM)";
  for (Hdf5Log* log : registry()) {
    log->flush_locked_noexcept();
    log->report_stopped_locked(why);
    log->flush_locked_noexcept();  // the arms' new status
  }
  library.release();  // stays locked
}

void watch_signals(int read_end) {
  unsigned char signal_number = 0;
  for (;;) {
    const ssize_t n = ::read(read_end, &signal_number, 1);
    if (n == 1) break;
    if (n < 0 && errno == EINTR) continue;
    return;  // the pipe broke: nothing more to watch
  }
  flush_all_logs_for_exit(signal_number);
  ::_exit(128 + signal_number);
}

}  // namespace

bool usable_arm_name(std::string_view name) {
  return !name.empty() && name != "." && name != ".." && name.find('/') == std::string_view::npos;
}

std::unique_ptr<ExperimentLog> create_hdf5_log(const std::filesystem::path& path, const ExperimentInfo& info,
                                               int flush_interval) {
  auto log = std::make_unique<Hdf5Log>(path, info, flush_interval);
  register_log(log.get());
  return log;
}

std::vector<StepRecord> read_step_records(const std::filesystem::path& file, const std::string& arm) {
  return read_records(file, arm, "steps", step_record_fields);
}

std::vector<EvalRecord> read_eval_records(const std::filesystem::path& file, const std::string& arm) {
  return read_records(file, arm, "eval", eval_record_fields);
}

std::vector<ShadowRecord> read_shadow_records(const std::filesystem::path& file, const std::string& arm) {
  return read_records(file, arm, "shadow", shadow_record_fields);
}

namespace {
template <typename Record, std::size_t N>
std::string record_fields_markdown(const std::array<RecordField<Record>, N>& table) {
  std::vector<std::array<std::string, 4>> rows;
  for (const auto& f : table)
    rows.push_back({"`" + std::string(f.name) + "`", std::string(hdf5_type_name(f)), std::string(f.unit),
                    std::string(f.doc)});
  return markdown_table<4>({"dataset", "type", "unit", "meaning"}, rows);
}

// The attribute lines of an attribute table; the members stored otherwise are left out.
template <typename S, std::size_t N>
std::vector<std::array<std::string, 3>> attribute_rows(const std::array<AttributeField<S>, N>& table) {
  std::vector<std::array<std::string, 3>> rows;
  for (const auto& f : table)
    std::visit(
        [&](auto member) {
          using T = std::remove_cvref_t<decltype(std::declval<S>().*member)>;
          const char* type = std::is_same_v<T, std::string>     ? "string"
                             : std::is_same_v<T, std::uint64_t> ? "uint64"
                             : std::is_same_v<T, int>           ? "int32"
                                                                : nullptr;
          if (type) rows.push_back({"`" + std::string(f.name) + "`", type, std::string(f.doc)});
        },
        f.member);
  return rows;
}
}  // namespace

std::string root_attributes_markdown() {
  auto rows = attribute_rows(experiment_attribute_fields);
  rows.push_back({"`schema_version`", "int32",
                  "`" + std::to_string(schema_version) +
                      "`: this page (version 7 lacked `/arms/<arm>/shadow/`; version 6 named the counter `rounded_to_zero` `flushed`, and counted ReLU's and "
                      "max pooling's input gradients as tensors of their own, though they only select values of their "
                      "output gradients that were counted already: an aggregate of `activation_grads` over layers "
                      "counted those values twice; version 5 lacked the policy point `loss_internals`; version 4 also "
                      "`softmax_internals` and `norm_statistics`; version 3 also `stats/logit_max`; version 2 also "
                      "`cpu` and the arms' `threads` and `gemm`; version 1 also `/arms/<arm>/policy/`)"});
  return markdown_table<3>({"attribute", "type", "meaning"}, rows);
}

std::string arm_attributes_markdown() {
  auto rows = attribute_rows(arm_attribute_fields);
  rows.push_back({"`status`", "string",
                  "`running` until the arm finishes, then `completed` or `stopped: <reason>`. `running` in a file "
                  "whose run has ended means the process ended without finishing the arm (killed, crashed, "
                  "interrupted)"});
  return markdown_table<3>({"attribute", "type", "meaning"}, rows);
}

std::string policy_attributes_markdown() {
  // The fp32 preset's attributes, one row per docs row (every point's parts share theirs).
  const Policy fp32 = *preset_policy("fp32");
  std::vector<std::array<std::string, 3>> rows;
  for (const PolicyAttribute& a : policy_attributes(fp32)) {
    if (std::any_of(rows.begin(), rows.end(), [&](const auto& row) { return row[0] == "`" + a.row + "`"; })) continue;
    const std::string type = std::visit(
        [](const auto& value) -> std::string {
          using T = std::remove_cvref_t<decltype(value)>;
          if constexpr (std::is_same_v<T, int>) return "int32";
          else if constexpr (std::is_same_v<T, double>) return "float64";
          else if constexpr (std::is_same_v<T, bool>) return "uint8 (0 or 1)";
          else if constexpr (std::is_same_v<T, std::string>) return "string";
          else return "string [n] (1-D attribute, may be empty)";
        },
        a.value);
    rows.push_back({"`" + a.row + "`", type, a.doc});
  }
  return markdown_table<3>({"attribute", "type", "meaning"}, rows);
}

std::string step_fields_markdown() { return record_fields_markdown(step_record_fields); }
std::string eval_fields_markdown() { return record_fields_markdown(eval_record_fields); }
std::string shadow_fields_markdown() { return record_fields_markdown(shadow_record_fields); }

void flush_all_logs() {
  std::lock_guard lock(registry_mutex());
  for (Hdf5Log* log : registry()) log->flush_noexcept();
}

void install_flush_on_signals() {
  static std::once_flag once;
  std::call_once(once, [] {
    int fds[2];
    if (::pipe2(fds, O_CLOEXEC) != 0) throw std::system_error(errno, std::generic_category(), "pipe2");
    const int flags = ::fcntl(fds[1], F_GETFL);
    if (flags < 0 || ::fcntl(fds[1], F_SETFL, flags | O_NONBLOCK) != 0) {
      throw std::system_error(errno, std::generic_category(), "fcntl(O_NONBLOCK)");
    }
    signal_pipe_write = fds[1];
    std::thread(watch_signals, fds[0]).detach();

    struct sigaction action {};
    action.sa_handler = on_flush_signal;
    sigemptyset(&action.sa_mask);
    sigaddset(&action.sa_mask, SIGINT);
    sigaddset(&action.sa_mask, SIGTERM);
    action.sa_flags = SA_RESTART;
    for (const int signal_number : {SIGINT, SIGTERM}) {
      if (::sigaction(signal_number, &action, nullptr) != 0) {
        throw std::system_error(errno, std::generic_category(), "sigaction");
      }
    }
  });
}

}  // namespace mpsim::core
