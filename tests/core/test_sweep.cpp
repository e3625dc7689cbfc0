// Sweeps (core/src/sweep.cpp): a [sweep] table and multi-valued overrides
// expand into the cartesian product of whole configs, in a fixed order with
// labels; [smoke] applies with --smoke; errors name the key and the point; the
// written config runs the same points again.
#include <catch2/catch.hpp>

#include "mpsim/core/sweep.hpp"

using namespace mpsim::core;

namespace {

const std::string base = "arms = [\"fp16-mixed\"]\n[data]\ndataset = \"synthetic\"\n";

std::vector<std::string> labels(const Sweep& s) {
  std::vector<std::string> out;
  for (const auto& p : s.points) out.push_back(p.label);
  return out;
}

std::string sweep_error(const std::string& text, const std::vector<std::string>& overrides = {}, bool smoke = false) {
  try {
    parse_sweep(text, "test.toml", overrides, smoke);
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "no error";
}

}  // namespace

TEST_CASE("sweep: no axes is one point without a label", "[sweep][config]") {
  const Sweep s = parse_sweep(base, "t");
  REQUIRE(s.points.size() == 1);
  CHECK(s.points[0].label.empty());
  CHECK(s.axes.empty());
  CHECK(s.to_toml() == s.points[0].config.to_toml());
}

TEST_CASE("sweep: a [sweep] table and overrides expand to the cartesian product", "[sweep][config]") {
  const std::string text = base + "[sweep]\n\"policies.fp16-mixed.loss_scale.initial\" = [1, 1024]\n"
                                  "optimizer.lr = [0.01, 0.1, 0.5]\n";
  const Sweep s = parse_sweep(text, "t", {"train.epochs=2", "seeds=[1,2]"});
  // Axes in the order of their keys: optimizer.lr before policies.*.
  CHECK(labels(s) == std::vector<std::string>{"lr=0.01,initial=1", "lr=0.01,initial=1024", "lr=0.1,initial=1",
                                              "lr=0.1,initial=1024", "lr=0.5,initial=1", "lr=0.5,initial=1024"});
  for (const auto& p : s.points) {
    CHECK(p.config.train.epochs == 2);  // a single-valued override applies everywhere
    CHECK(p.config.seeds == std::vector<std::uint64_t>{1, 2});  // an array value is one value
  }
  CHECK(s.points[3].config.policies.at("fp16-mixed").loss_scaling.initial_scale == 1024.0);
  CHECK(s.points[3].config.optimizer.lr == 0.1);
  CHECK(s.points[0].config.policies.at("fp16-mixed").loss_scaling.initial_scale == 1.0);

  // An override with several values replaces the table's axis of the same key.
  const Sweep t = parse_sweep(text, "t", {"optimizer.lr=0.2,0.3"});
  CHECK(labels(t) == std::vector<std::string>{"lr=0.2,initial=1", "lr=0.2,initial=1024", "lr=0.3,initial=1",
                                              "lr=0.3,initial=1024"});
  // Strings, and '/' (not allowed in HDF5 group names) becomes ':' in labels.
  const Sweep u = parse_sweep(base, "t", {"arms=fp32,fp8", "policies.fp16-mixed.weights=binary16/stochastic,binary16"});
  CHECK(labels(u) == std::vector<std::string>{"arms=fp32,weights=binary16:stochastic", "arms=fp32,weights=binary16",
                                              "arms=fp8,weights=binary16:stochastic", "arms=fp8,weights=binary16"});
  CHECK(u.points[2].config.arms == std::vector<std::string>{"fp8"});
}

TEST_CASE("sweep: keys joined by '+' vary together", "[sweep][config]") {
  const std::string text = base + "[sweep]\n\"loss.weight+optimizer.lr\" = [[1.0, 0.05], [0.25, 0.2]]\n"
                                  "train.epochs = [1, 2]\n";
  const Sweep s = parse_sweep(text, "t");
  REQUIRE(labels(s) == std::vector<std::string>{"weight=1.0,lr=0.05,epochs=1", "weight=1.0,lr=0.05,epochs=2",
                                                "weight=0.25,lr=0.2,epochs=1", "weight=0.25,lr=0.2,epochs=2"});
  CHECK(s.points[2].config.train.loss.weight == 0.25);
  CHECK(s.points[2].config.optimizer.lr == 0.2);
  CHECK(s.points[1].config.train.loss.weight == 1.0);
  CHECK(s.points[1].config.optimizer.lr == 0.05);
  const Sweep again = parse_sweep(s.to_toml(), "resolved");
  CHECK(labels(again) == labels(s));
  CHECK(again.axes.front().name() == "loss.weight+optimizer.lr");
  CHECK_THAT(sweep_error(base + "[sweep]\n\"loss.weight+optimizer.lr\" = [[1.0, 0.05], [0.25]]\n"),
             Catch::Matchers::Contains("each value must be an array of 2 values, one per key"));
  CHECK_THAT(sweep_error(base + "[sweep]\n\"loss.weight+\" = [[1.0, 0.05]]\n"),
             Catch::Matchers::Contains("an empty key between '+' signs"));
  CHECK_THAT(sweep_error(base, {"loss.weight+optimizer.lr=1,2"}),
             Catch::Matchers::Contains("keys that vary together go in a [sweep] table"));
}

TEST_CASE("sweep: the written config gives the same points", "[sweep][config]") {
  const Sweep s = parse_sweep(base + "[sweep]\noptimizer.lr = [0.01, 0.1]\n", "t", {"arms=fp32,fp16-mixed"});
  const Sweep again = parse_sweep(s.to_toml(), "resolved");
  REQUIRE(labels(again) == labels(s));
  // The same arms with the same policies and settings (the written file also
  // carries the first point's policy tables, which the other points do not use).
  for (std::size_t i = 0; i < s.points.size(); ++i) {
    const ExperimentConfig &a = again.points[i].config, &b = s.points[i].config;
    CHECK(a.arms == b.arms);
    CHECK(a.optimizer.lr == b.optimizer.lr);
    for (const auto& arm : b.arms) CHECK(describe(a.policies.at(arm)) == describe(b.policies.at(arm)));
  }
}

TEST_CASE("sweep: --smoke applies the [smoke] overrides", "[sweep][config]") {
  const std::string text = base + "[smoke]\ntrain.epochs = 1\n\"data.train_limit\" = 64\n";
  const Sweep s = parse_sweep(text, "t", {}, true);
  CHECK(s.points[0].config.train.epochs == 1);
  CHECK(s.points[0].config.data.train_limit == 64);
  CHECK(parse_sweep(text, "t").points[0].config.data.train_limit == 0);  // not without --smoke
  // The command line still wins.
  CHECK(parse_sweep(text, "t", {"train.epochs=3"}, true).points[0].config.train.epochs == 3);
  CHECK_THAT(sweep_error(base, {}, true), Catch::Matchers::Contains("has no [smoke] table"));
}

TEST_CASE("sweep: --smoke never writes the full run's log", "[sweep][config]") {
  // Issue 18: `mpsim run default.toml --smoke` used to replace runs/default.h5.
  const std::string smoke = "[smoke]\ntrain.epochs = 1\n";
  CHECK(parse_sweep("output = \"runs/x.h5\"\n" + base + smoke, "t", {}, true).points[0].config.output ==
        "runs/x-smoke.h5");
  CHECK(parse_sweep(base + smoke, "t", {}, true).points[0].config.output == "runs/default-smoke.h5");
  CHECK(parse_sweep(base + smoke, "t").points[0].config.output == "runs/default.h5");  // not without --smoke
  // [smoke] may name its own output, and the command line still wins.
  CHECK(parse_sweep(base + "[smoke]\noutput = \"s.h5\"\n", "t", {}, true).points[0].config.output == "s.h5");
  CHECK(parse_sweep(base + smoke, "t", {"output=\"o.h5\""}, true).points[0].config.output == "o.h5");
}

TEST_CASE("sweep: errors name the key and the point", "[sweep][config]") {
  CHECK_THAT(sweep_error(base + "[sweep]\n\"optimizer.lr\" = 0.1\n"),
             Catch::Matchers::Contains("sweep.\"optimizer.lr\" must be a non-empty array"));
  CHECK_THAT(sweep_error(base, {"optimizer.lr=0.1,-1"}),
             Catch::Matchers::Contains("sweep point lr=-1: optimizer.lr must be a finite number > 0 (got -1)"));
  CHECK_THAT(sweep_error(base, {"output=a.h5,b.h5"}), Catch::Matchers::Contains("output differs between points"));
  CHECK_THAT(sweep_error(base, {"optimizer.lrate=0.1,0.2"}), Catch::Matchers::Contains("unknown config key 'optimizer.lrate'"));
}
