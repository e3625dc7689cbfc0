#pragma once
// The file in which a process that trained one arm hands its ArmResult to the
// process that runs the experiment (experiment.hpp). Every field of ArmResult
// is listed once, in `arm_result_fields` (a table of fields.hpp, as the log's
// records and the config keys are); that table alone drives writing and
// reading, so adding a field to ArmResult is one line here (the build fails
// while a member is missing from the table).
//
// Layout (native byte order: both ends are the same build on one machine):
//   magic "mpsimArm", u32 version, u32 field count, then per field in table
//   order: its name (u64 length + bytes), u64 element size, and its value
//   (a scalar's bytes; a string or vector: u64 count + the elements' bytes).
// A file of another version, or with other fields, sizes or a short tail, is
// refused with a message that names the file and the first difference.

#include <array>
#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "mpsim/core/fields.hpp"
#include "mpsim/core/trainer.hpp"

namespace mpsim::core {

// A field of ArmResult, of one of the types the file knows how to keep (fields.hpp).
using ArmResultField =
    Field<ArmResult, std::string, std::int64_t, double, std::vector<double>, LayerStats>;

inline constexpr std::uint32_t arm_result_file_version = 1;

inline constexpr auto arm_result_fields = std::to_array<ArmResultField>({
    {"status", &ArmResult::status, "", "\"completed\" or \"stopped: <reason>\""},
    {"steps", &ArmResult::steps, "steps", "optimiser steps taken (skipped ones included)"},
    {"skipped_steps", &ArmResult::skipped_steps, "steps", "steps skipped for an inf/NaN gradient"},
    {"final_loss_scale", &ArmResult::final_loss_scale, "", "the loss scale after the last step"},
    {"train_loss", &ArmResult::train_loss, "", "mean training loss at the last evaluation"},
    {"test_loss", &ArmResult::test_loss, "", "test loss at the last evaluation"},
    {"test_accuracy", &ArmResult::test_accuracy, "0..1", "test accuracy at the last evaluation"},
    {"activation_grad_flushed", &ArmResult::activation_grad_flushed, "0..1",
     "flushed / nonzero activation gradients"},
    {"activation_grad_below_2_24", &ArmResult::activation_grad_below_2_24, "0..1",
     "activation gradients below 2^-24 / nonzero"},
    {"weight_grad_flushed", &ArmResult::weight_grad_flushed, "0..1", "flushed / nonzero weight gradients"},
    {"weight_grad_below_2_24", &ArmResult::weight_grad_below_2_24, "0..1", "weight gradients below 2^-24 / nonzero"},
    {"swallowed_updates", &ArmResult::swallowed_updates, "0..1", "swallowed / nonzero weight updates"},
    {"wall_seconds", &ArmResult::wall_seconds, "s", "wall-clock time of the arm"},
    {"losses", &ArmResult::losses, "", "training loss per step"},
    {"loss_scales", &ArmResult::loss_scales, "", "loss scale used per step"},
    {"stat_totals", &ArmResult::stat_totals, "",
     "per layer and TensorKind, statistics summed over instrumented steps"},
});
static_assert(describes_every_member<ArmResult>(arm_result_fields),
              "every ArmResult member needs one line in arm_result_fields");

// Throw std::runtime_error naming the file (and, reading, the field at fault).
void write_arm_result(const std::filesystem::path& path, const ArmResult& result);
ArmResult read_arm_result(const std::filesystem::path& path);

}  // namespace mpsim::core
