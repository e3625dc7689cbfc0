// The step and eval records described by their field tables (run_log.hpp):
// the tables cover every member; every field written to an HDF5 log reads
// back equal, through the table-driven reader; every field has its dataset of
// the table's name and type; the markdown names every field.
#include <catch2/catch.hpp>

#include <hdf5.h>
#include <stdlib.h>

#include <cmath>
#include <filesystem>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

#include "mpsim/core/arm_result_file.hpp"
#include "mpsim/core/run_log.hpp"

namespace mpsim::core {
namespace {

namespace fs = std::filesystem;

// The build already refuses a table that misses a member (static_assert in
// run_log.hpp); this states it where a reader of the tests looks.
static_assert(member_count_v<StepRecord> == step_record_fields.size());
static_assert(member_count_v<EvalRecord> == eval_record_fields.size());
static_assert(member_count_v<ArmResult> == arm_result_fields.size());

struct Folder {
  fs::path path;
  Folder() {
    std::string pattern = (fs::temp_directory_path() / "mpsim_fields_XXXXXX").string();
    if (::mkdtemp(pattern.data()) == nullptr) throw std::runtime_error("mkdtemp failed");
    path = pattern;
  }
  ~Folder() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
};

// Record i, every field different from its default and from record i - 1.
template <typename Record, std::size_t N>
Record distinct_record(const std::array<RecordField<Record>, N>& table, int i) {
  Record r;
  for (std::size_t f = 0; f < N; ++f) {
    visit_field(table[f], r, [&](auto& value) {
      using T = std::remove_cvref_t<decltype(value)>;
      if constexpr (std::is_same_v<T, bool>) value = (i + static_cast<int>(f)) % 2 == 0;
      else if constexpr (std::is_same_v<T, std::int64_t>) value = 1000 * i + static_cast<std::int64_t>(f);
      else value = std::ldexp(1.0 + 0.1 * static_cast<double>(f), i - 3) / 3.0;  // not a short decimal
    });
  }
  return r;
}

std::string dataset_type(hid_t file, const std::string& path) {
  const hid_t dataset = H5Dopen2(file, path.c_str(), H5P_DEFAULT);
  REQUIRE(dataset >= 0);
  const hid_t type = H5Dget_type(dataset);
  std::string name = H5Tequal(type, H5T_STD_I64LE) > 0   ? "int64"
                     : H5Tequal(type, H5T_IEEE_F64LE) > 0 ? "float64"
                     : H5Tequal(type, H5T_STD_U8LE) > 0   ? "uint8"
                                                          : "other";
  H5Tclose(type);
  H5Dclose(dataset);
  return name;
}

TEST_CASE("record fields: every field of steps, evals and shadow rows round-trips through the HDF5 log",
          "[core][fields]") {
  Folder folder;
  const fs::path file = folder.path / "log.h5";
  std::vector<StepRecord> steps;
  std::vector<EvalRecord> evals;
  std::vector<ShadowRecord> shadows;
  for (int i = 0; i < 5; ++i) steps.push_back(distinct_record(step_record_fields, i));
  for (int i = 0; i < 3; ++i) evals.push_back(distinct_record(eval_record_fields, i));
  for (int i = 0; i < 4; ++i) shadows.push_back(distinct_record(shadow_record_fields, i));
  steps[2].grad_norm = std::numeric_limits<double>::infinity();
  shadows[1].layer = -1;
  shadows[3].relative_error = std::numeric_limits<double>::infinity();
  {
    ExperimentInfo info;
    info.config_toml = "name = \"fields\"\n";
    auto log = create_hdf5_log(file, info, 2);
    ArmInfo arm;
    arm.name = "a";
    arm.backend = "cpu";
    arm.policy = "fp32";
    arm.layers = {"fc1"};
    ArmLog& a = log->add_arm(arm);
    for (const auto& s : steps) a.step(s);
    for (const auto& e : evals) a.eval(e);
    a.shadow(std::span(shadows).first(3));
    a.shadow(std::span(shadows).last(1));
    a.finish("completed");
  }
  CHECK(read_step_records(file, "a") == steps);
  CHECK(read_eval_records(file, "a") == evals);
  CHECK(read_shadow_records(file, "a") == shadows);

  // Each field is its own dataset, named and typed as the table says.
  const hid_t f = H5Fopen(file.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  REQUIRE(f >= 0);
  for (const auto& field : step_record_fields)
    CHECK(dataset_type(f, "arms/a/steps/" + std::string(field.name)) == hdf5_type_name(field));
  for (const auto& field : eval_record_fields)
    CHECK(dataset_type(f, "arms/a/eval/" + std::string(field.name)) == hdf5_type_name(field));
  for (const auto& field : shadow_record_fields)
    CHECK(dataset_type(f, "arms/a/shadow/" + std::string(field.name)) == hdf5_type_name(field));
  H5Fclose(f);

  CHECK_THROWS_WITH(read_step_records(file, "b"), Catch::Matchers::Contains("arm 'b'"));
}

TEST_CASE("record fields: the markdown lists every field with its type", "[core][fields]") {
  const std::string steps = step_fields_markdown(), evals = eval_fields_markdown();
  for (const auto& field : step_record_fields)
    CHECK_THAT(steps, Catch::Matchers::Contains("| `" + std::string(field.name) + "` | " +
                                                std::string(hdf5_type_name(field)) + " |"));
  for (const auto& field : eval_record_fields)
    CHECK_THAT(evals, Catch::Matchers::Contains("| `" + std::string(field.name) + "` | " +
                                                std::string(hdf5_type_name(field)) + " |"));
  const std::string shadows = shadow_fields_markdown();
  for (const auto& field : shadow_record_fields)
    CHECK_THAT(shadows, Catch::Matchers::Contains("| `" + std::string(field.name) + "` | " +
                                                  std::string(hdf5_type_name(field)) + " |"));
}

}  // namespace
}  // namespace mpsim::core
