#pragma once
// Sweeps: one experiment over the cartesian product of config values. Axes
// come from a `[sweep]` table (dotted key = array of values) and from
// overrides with several values (`optimizer.lr=0.01,0.1`). Keys joined by '+'
// vary together, one array of values per point of the axis:
// `"loss.weight+optimizer.lr" = [[1.0, 0.05], [0.25, 0.2]]`. `[smoke]` holds
// the overrides `--smoke` applies. Each point is a whole ExperimentConfig
// whose arms share the experiment's HDF5 file. docs/configs.md describes it.

#include <filesystem>
#include <string>
#include <vector>

#include "mpsim/core/config.hpp"

namespace mpsim::core {

struct SweepAxis {
  std::vector<std::string> keys;                // dotted config keys: one, or several that vary together
  std::vector<std::vector<std::string>> values;  // per point of the axis, a TOML value text per key
  std::string name() const;                      // the keys joined by '+'
};

struct SweepPoint {
  std::string label;                   // "initial=8,lr=0.1"; empty when there is no sweep
  std::vector<std::string> overrides;  // the point's own key=value overrides
  ExperimentConfig config;
};

struct Sweep {
  std::vector<SweepAxis> axes;
  // Axes sorted by key; points in order, the first axis varying slowest (one point when there are no axes).
  std::vector<SweepPoint> points;
  // The first point's resolved config plus a [sweep] table of the axes: run
  // again, it gives the same points.
  std::string to_toml() const;
};

// Errors name the key (and the point).
Sweep parse_sweep(const std::string& text, const std::string& source, const std::vector<std::string>& overrides = {},
                  bool smoke = false);
Sweep load_sweep(const std::filesystem::path& file, const std::vector<std::string>& overrides = {}, bool smoke = false);

}  // namespace mpsim::core
