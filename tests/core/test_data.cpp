// Data loading and batching (core/src/data.cpp).
//
// Fashion-MNIST, where Debian's dataset-fashion-mnist package is installed, is
// checked against an independent decoder here (zlib's inflate on the raw
// bytes), whose output is in turn pinned by values computed with Python's
// gzip module. Broken IDX files are written to a temporary directory, one
// fault each, and must be refused with a message that names the file and the
// fault. The synthetic task and the batcher are checked for determinism (with
// golden values, since "same seed, same bits" must hold across builds), for
// partitioning, and the synthetic task for being learnable but not trivial.
// The golden values were reproduced by an independent Python model of the
// generators (SplitMix64 checked against the first outputs of Vigna's
// splitmix64.c for seed 1234567).
#include <catch2/catch.hpp>

#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <array>
#include <bit>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <iterator>
#include <numeric>
#include <string>
#include <vector>

#include "mpsim/core/data.hpp"
#include "support/test_support.hpp"

namespace {

namespace fs = std::filesystem;
using namespace mpsim::core;
using Bytes = std::vector<std::uint8_t>;

// A fresh directory under the system's temporary directory, removed afterwards.
class TempDir {
 public:
  TempDir() {
    static int serial = 0;
    path_ =
        fs::temp_directory_path() / ("mpsim_test_data_" + std::to_string(::getpid()) + "_" + std::to_string(serial++));
    fs::remove_all(path_);
    fs::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  fs::path operator/(const std::string& name) const { return path_ / name; }
  const fs::path& path() const { return path_; }

 private:
  fs::path path_;
};

void put32(Bytes& bytes, std::uint32_t v) {
  for (int shift = 24; shift >= 0; shift -= 8) bytes.push_back(static_cast<std::uint8_t>(v >> shift));
}

// An IDX image file with pixel i = i * 7 mod 256, so every byte value occurs.
Bytes idx_images(std::uint32_t count, std::uint32_t rows, std::uint32_t cols, std::uint32_t magic = 0x803) {
  Bytes bytes;
  for (std::uint32_t v : {magic, count, rows, cols}) put32(bytes, v);
  for (std::size_t i = 0; i < std::size_t{count} * rows * cols; ++i) bytes.push_back(static_cast<std::uint8_t>(i * 7));
  return bytes;
}

// An IDX label file with label i = (3 i) mod 10.
Bytes idx_labels(std::uint32_t count, std::uint32_t magic = 0x801) {
  Bytes bytes;
  for (std::uint32_t v : {magic, count}) put32(bytes, v);
  for (std::uint32_t i = 0; i < count; ++i) bytes.push_back(static_cast<std::uint8_t>(3 * i % 10));
  return bytes;
}

void write_plain(const fs::path& path, const Bytes& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
  REQUIRE(out.good());
}

void write_gzip(const fs::path& path, const Bytes& bytes) {
  gzFile out = gzopen(path.c_str(), "wb");
  REQUIRE(out != nullptr);
  const int written = gzwrite(out, bytes.data(), static_cast<unsigned>(bytes.size()));
  REQUIRE(gzclose(out) == Z_OK);
  REQUIRE(written == static_cast<int>(bytes.size()));
}

Bytes read_raw(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  REQUIRE(in.good());
  return Bytes(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

// The test's own gzip decoder, independent of the gzFile interface data.cpp uses.
Bytes gunzip(const fs::path& path) {
  Bytes in = read_raw(path), out(std::size_t{1} << 20);
  z_stream z{};
  REQUIRE(inflateInit2(&z, 16 + MAX_WBITS) == Z_OK);  // 16: expect a gzip wrapper
  z.next_in = in.data();
  z.avail_in = static_cast<uInt>(in.size());
  int ret = Z_OK;
  while (ret != Z_STREAM_END) {
    if (z.total_out == out.size()) out.resize(out.size() * 2);
    z.next_out = out.data() + z.total_out;
    z.avail_out = static_cast<uInt>(out.size() - z.total_out);
    ret = inflate(&z, Z_NO_FLUSH);
    REQUIRE((ret == Z_OK || ret == Z_STREAM_END));
  }
  out.resize(z.total_out);
  inflateEnd(&z);
  return out;
}

std::uint64_t fnv1a(const std::uint8_t* bytes, std::size_t n, std::uint64_t h = 0xcbf29ce484222325u) {
  for (std::size_t i = 0; i < n; ++i) h = (h ^ bytes[i]) * 0x100000001b3u;
  return h;
}

// FNV-1a over a data set's float bits and labels, to pin generated data.
std::uint64_t fingerprint(const Dataset& data) {
  std::uint64_t h = 0xcbf29ce484222325u;
  for (const float v : data.images) {
    const auto bits = std::bit_cast<std::array<std::uint8_t, 4>>(v);
    h = fnv1a(bits.data(), bits.size(), h);
  }
  for (const std::int32_t label : data.labels) {
    const auto bits = std::bit_cast<std::array<std::uint8_t, 4>>(label);
    h = fnv1a(bits.data(), bits.size(), h);
  }
  return h;
}

// Matches a message holding every one of the given parts. (Catch's
// Contains(a) && Contains(b) keeps pointers to its operands, so it cannot be
// built in one place and used in another.)
class ContainsAll : public Catch::MatcherBase<std::string> {
 public:
  ContainsAll(std::initializer_list<std::string> parts) : parts_(parts) {}
  bool match(const std::string& text) const override {
    return std::all_of(parts_.begin(), parts_.end(),
                       [&](const std::string& part) { return text.find(part) != std::string::npos; });
  }
  std::string describe() const override {
    std::string text = "contains all of";
    for (const std::string& part : parts_) text += " \"" + part + "\"";
    return text;
  }

 private:
  std::vector<std::string> parts_;
};

}  // namespace

// ------------------------------------------------------------- Fashion-MNIST

TEST_CASE("Fashion-MNIST loads exactly as its files hold it", "[data][fashion-mnist]") {
  const fs::path dir = default_fashion_mnist_dir;
  if (!fs::is_directory(dir))
    mpsim::test::skip(std::string(default_fashion_mnist_dir) +
                      " is absent (apt-get install dataset-fashion-mnist to run this test)");
  const TrainTest sets = load_fashion_mnist(dir);

  // Reference values computed with /usr/bin/python3's gzip module from the
  // files of dataset-fashion-mnist 0.0~git20200523.55506a9-1.
  struct Expected {
    const Dataset* data;
    const char* prefix;
    std::int64_t count;
    std::array<int, 12> first_labels;
    std::uint64_t first_image_fnv1a;  // FNV-1a 64 of the first image's 784 bytes
    std::uint64_t pixel_sum;          // sum of all pixel bytes
  };
  const std::array<Expected, 2> expected{{
      {&sets.train, "train", 60000, {9, 0, 0, 3, 0, 2, 7, 2, 5, 5, 0, 9}, 0x01fdf72590541338u, 3431114169u},
      {&sets.test, "t10k", 10000, {9, 2, 1, 1, 6, 1, 4, 6, 5, 7, 4, 5}, 0xcb45b7589f1b853bu, 573469082u},
  }};
  for (const Expected& e : expected) {
    INFO(e.prefix);
    const Dataset& data = *e.data;
    REQUIRE(data.count == e.count);
    REQUIRE(data.channels == 1);
    REQUIRE(data.height == 28);
    REQUIRE(data.width == 28);
    REQUIRE(data.classes == 10);
    REQUIRE(data.images.size() == static_cast<std::size_t>(e.count * 28 * 28));
    REQUIRE(data.labels.size() == static_cast<std::size_t>(e.count));

    std::array<std::int64_t, 10> histogram{};
    for (const std::int32_t label : data.labels) {
      REQUIRE((label >= 0 && label < 10));
      ++histogram[static_cast<std::size_t>(label)];
    }
    for (const std::int64_t n : histogram) CHECK(n == e.count / 10);  // the published balance
    const auto [lo, hi] = std::minmax_element(data.images.begin(), data.images.end());
    CHECK(*lo == 0.0f);
    CHECK(*hi == 1.0f);

    // The independent decoder, checked against Python, then compared with the loader.
    const Bytes raw_images = gunzip(dir / (std::string(e.prefix) + "-images-idx3-ubyte.gz"));
    const Bytes raw_labels = gunzip(dir / (std::string(e.prefix) + "-labels-idx1-ubyte.gz"));
    REQUIRE(raw_images.size() == 16 + data.images.size());
    REQUIRE(raw_labels.size() == 8 + data.labels.size());
    CHECK(fnv1a(raw_images.data() + 16, 784) == e.first_image_fnv1a);
    CHECK(std::accumulate(raw_images.begin() + 16, raw_images.end(), std::uint64_t{0}) == e.pixel_sum);
    for (std::size_t i = 0; i < e.first_labels.size(); ++i) CHECK(raw_labels[8 + i] == e.first_labels[i]);

    std::size_t pixel_mismatches = 0, label_mismatches = 0;
    for (std::size_t i = 0; i < data.images.size(); ++i)
      pixel_mismatches += data.images[i] != static_cast<float>(raw_images[16 + i]) / 255.0f;
    for (std::size_t i = 0; i < data.labels.size(); ++i) label_mismatches += data.labels[i] != raw_labels[8 + i];
    CHECK(pixel_mismatches == 0);
    CHECK(label_mismatches == 0);
  }

  // Limits keep the leading samples.
  const TrainTest limited = load_fashion_mnist(dir, 100, 7);
  REQUIRE(limited.train.count == 100);
  REQUIRE(limited.test.count == 7);
  REQUIRE(limited.train.images.size() == 100u * 784u);
  REQUIRE(limited.test.labels.size() == 7u);
  CHECK(std::equal(limited.train.images.begin(), limited.train.images.end(), sets.train.images.begin()));
  CHECK(std::equal(limited.test.labels.begin(), limited.test.labels.end(), sets.test.labels.begin()));
}

TEST_CASE("load_fashion_mnist says how to install a missing data set", "[data]") {
  const fs::path missing = fs::temp_directory_path() / "mpsim_no_such_fashion_mnist_dir";
  REQUIRE_FALSE(fs::exists(missing));
  REQUIRE_THROWS_AS(load_fashion_mnist(missing), DataError);
  REQUIRE_THROWS_WITH(load_fashion_mnist(missing),
                      ContainsAll({missing.string(), "apt-get install dataset-fashion-mnist"}));

  const TempDir empty;  // the directory exists but holds no files
  REQUIRE_THROWS_WITH(load_fashion_mnist(empty.path()), ContainsAll({(empty / "train-images-idx3-ubyte.gz").string(),
                                                                     "not found", "dataset-fashion-mnist"}));
}

// ------------------------------------------------------------------ IDX files

TEST_CASE("read_idx_images reads gzip'd and plain IDX files", "[data]") {
  const TempDir dir;
  const Bytes images = idx_images(5, 3, 4), labels = idx_labels(5);
  const bool gzip = GENERATE(false, true);
  INFO((gzip ? "gzip" : "plain"));
  (gzip ? write_gzip : write_plain)(dir / "images", images);
  (gzip ? write_gzip : write_plain)(dir / "labels", labels);
  if (gzip) REQUIRE(read_raw(dir / "images")[0] == 0x1f);

  const Dataset data = read_idx_images(dir / "images", dir / "labels");
  CHECK(data.count == 5);
  CHECK(data.channels == 1);
  CHECK(data.height == 3);
  CHECK(data.width == 4);
  CHECK(data.classes == 10);
  REQUIRE(data.images.size() == 60);
  REQUIRE(data.labels.size() == 5);
  for (std::size_t i = 0; i < 60; ++i) CHECK(data.images[i] == static_cast<float>(images[16 + i]) / 255.0f);
  for (std::size_t i = 0; i < 5; ++i) CHECK(data.labels[i] == labels[8 + i]);
}

TEST_CASE("read_idx_images refuses broken files, naming the file and the fault", "[data]") {
  const TempDir dir;
  const fs::path images = dir / "images.gz", labels = dir / "labels.gz";
  write_gzip(images, idx_images(5, 28, 28));
  write_gzip(labels, idx_labels(5));
  REQUIRE(read_idx_images(images, labels).count == 5);  // the intact pair loads
  const auto read = [&] { return read_idx_images(images, labels); };

  SECTION("missing file") {
    fs::remove(labels);
    REQUIRE_THROWS_AS(read(), DataError);
    REQUIRE_THROWS_WITH(
        read(), ContainsAll({labels.string(), "file not found", "apt-get install dataset-fashion-mnist", "data.path"}));
  }
  SECTION("a directory instead of a file") {
    fs::remove(images);
    fs::create_directory(images);
    REQUIRE_THROWS_WITH(read(), ContainsAll({images.string(), "is a directory"}));
  }
  SECTION("empty file") {
    write_plain(images, {});
    REQUIRE_THROWS_WITH(read(), ContainsAll({images.string(), "truncated: the header takes 16 bytes, got 0"}));
  }
  SECTION("truncated header") {
    Bytes bytes = idx_labels(5);
    bytes.resize(6);
    write_gzip(labels, bytes);
    REQUIRE_THROWS_WITH(read(), ContainsAll({labels.string(), "truncated: the header takes 8 bytes, got 6"}));
  }
  SECTION("bad magic: labels where images belong") {
    write_gzip(images, idx_labels(5));
    REQUIRE_THROWS_WITH(read(),
                        ContainsAll({images.string(), "bad magic number 0x00000801", "starts with 0x00000803"}));
  }
  SECTION("bad magic: 32-bit integer labels") {
    write_gzip(labels, idx_labels(5, 0x00000c01));
    REQUIRE_THROWS_WITH(read(),
                        ContainsAll({labels.string(), "bad magic number 0x00000c01", "starts with 0x00000801"}));
  }
  SECTION("zero sample count") {
    write_gzip(images, idx_images(0, 28, 28));
    REQUIRE_THROWS_WITH(read(), ContainsAll({images.string(), "zero sample count"}));
  }
  SECTION("zero image size") {
    write_gzip(images, idx_images(5, 0, 28));
    REQUIRE_THROWS_WITH(read(), ContainsAll({images.string(), "zero image size 5 x 0 x 28"}));
  }
  SECTION("implausible dimensions") {
    write_gzip(images, idx_images(1, 28, 100000));
    REQUIRE_THROWS_WITH(read(), ContainsAll({images.string(), "implausible dimensions 1 x 28 x 100000"}));
  }
  SECTION("truncated pixel data, plain and gzip'd") {
    Bytes bytes = idx_images(5, 28, 28);
    bytes.resize(bytes.size() - 20);
    (GENERATE(false, true) ? write_gzip : write_plain)(images, bytes);
    REQUIRE_THROWS_WITH(read(), ContainsAll({images.string(), "truncated", "call for 3920 data bytes, got 3900"}));
  }
  SECTION("truncated label data") {
    Bytes bytes = idx_labels(5);
    bytes.pop_back();
    write_gzip(labels, bytes);
    REQUIRE_THROWS_WITH(read(), ContainsAll({labels.string(), "call for 5 data bytes, got 4"}));
  }
  SECTION("trailing bytes") {
    Bytes bytes = idx_images(5, 28, 28);
    bytes.insert(bytes.end(), {1, 2, 3});
    write_gzip(images, bytes);
    REQUIRE_THROWS_WITH(read(),
                        ContainsAll({images.string(), "trailing garbage: 3 more bytes than the 3920 data bytes"}));
    bytes = idx_labels(5);
    bytes.push_back(0);
    write_plain(labels, bytes);
    write_gzip(images, idx_images(5, 28, 28));
    REQUIRE_THROWS_WITH(read(), ContainsAll({labels.string(), "trailing garbage: 1 more bytes than the 5 data bytes"}));
  }
  SECTION("corrupt gzip streams") {
    const Bytes good = read_raw(images);
    Bytes bytes = good;
    bytes.resize(bytes.size() / 2);  // cut off mid-stream
    write_plain(images, bytes);
    REQUIRE_THROWS_WITH(read(),
                        ContainsAll({images.string(), "corrupt or truncated gzip stream", "unexpected end of file"}));
    bytes = good;
    bytes[bytes.size() - 8] ^= 0xff;  // the CRC-32 in the trailer
    write_plain(images, bytes);
    REQUIRE_THROWS_WITH(read(),
                        ContainsAll({images.string(), "corrupt or truncated gzip stream", "incorrect data check"}));
    bytes = good;
    bytes[2] = 9;  // compression method: only 8 (deflate) exists
    write_plain(images, bytes);
    REQUIRE_THROWS_WITH(
        read(), ContainsAll({images.string(), "corrupt or truncated gzip stream", "unknown compression method"}));
  }
  SECTION("image and label counts differ") {
    write_gzip(labels, idx_labels(4));
    REQUIRE_THROWS_WITH(read(), ContainsAll({labels.string(), "has 4 labels but", images.string() + " has 5 images"}));
  }
  SECTION("a label outside [0, 10)") {
    Bytes bytes = idx_labels(5);
    bytes[8 + 2] = 10;
    write_gzip(labels, bytes);
    REQUIRE_THROWS_WITH(read(), ContainsAll({labels.string(), "label 10 at index 2 is not below 10"}));
  }
}

// ------------------------------------------------------------------ synthetic

TEST_CASE("make_synthetic is a deterministic 28x28 task", "[data][synthetic]") {
  const TrainTest a = make_synthetic(7, 2000, 500), b = make_synthetic(7, 2000, 500);
  for (const Dataset* d : {&a.train, &a.test}) {
    CHECK(d->channels == 1);
    CHECK(d->height == 28);
    CHECK(d->width == 28);
    CHECK(d->classes == 10);
    REQUIRE(d->images.size() == static_cast<std::size_t>(d->count * 784));
    REQUIRE(d->labels.size() == static_cast<std::size_t>(d->count));
    CHECK(std::all_of(d->images.begin(), d->images.end(), [](float v) { return v >= 0.0f && v <= 1.0f; }));
  }
  CHECK(a.train.count == 2000);
  CHECK(a.test.count == 500);

  // Labels are drawn uniformly: every class near a tenth (sd ~13 here).
  std::array<int, 10> histogram{};
  for (const std::int32_t label : a.train.labels) {
    REQUIRE((label >= 0 && label < 10));
    ++histogram[static_cast<std::size_t>(label)];
  }
  for (const int n : histogram) CHECK((n > 140 && n < 260));

  // Same seed, same bits; another seed, other data.
  CHECK(a.train.images == b.train.images);
  CHECK(a.train.labels == b.train.labels);
  CHECK(a.test.images == b.test.images);
  CHECK(a.test.labels == b.test.labels);
  const TrainTest c = make_synthetic(8, 2000, 500);
  CHECK(a.train.images != c.train.images);
  CHECK(a.train.labels != c.train.labels);
  CHECK(a.test.images != c.test.images);

  // The test set does not depend on the training count, and a shorter
  // training set is a prefix of a longer one.
  const TrainTest d = make_synthetic(7, 300, 500);
  CHECK(d.test.images == a.test.images);
  CHECK(std::equal(d.train.images.begin(), d.train.images.end(), a.train.images.begin()));
  CHECK(std::equal(d.train.labels.begin(), d.train.labels.end(), a.train.labels.begin()));

  // Other class counts.
  const TrainTest three = make_synthetic(7, 100, 10, 3);
  CHECK(three.train.classes == 3);
  CHECK(std::all_of(three.train.labels.begin(), three.train.labels.end(), [](std::int32_t l) { return l < 3; }));
}

TEST_CASE("make_synthetic gives the same bits in every build", "[data][synthetic]") {
  // Golden values: a change here changes every synthetic run's data.
  const TrainTest sets = make_synthetic(2024, 64, 16);
  CHECK(fingerprint(sets.train) == 0xe5c5022e1af230a9u);
  CHECK(fingerprint(sets.test) == 0xc858dfe00ffad373u);
}

TEST_CASE("make_synthetic is learnable but not trivially", "[data][synthetic]") {
  // Nearest class centroid, a cheap stand-in for training: well above chance
  // (10%) but far from perfect. (A 784-128-10 MLP with plain SGD passes 90%
  // test accuracy within about 200 steps of batch 64 on this data.)
  const TrainTest sets = make_synthetic(11, 4000, 1000);
  std::vector<double> centroids(10 * 784, 0.0);
  std::array<int, 10> counts{};
  for (std::int64_t i = 0; i < sets.train.count; ++i) {
    const auto label = static_cast<std::size_t>(sets.train.labels[static_cast<std::size_t>(i)]);
    ++counts[label];
    for (std::size_t p = 0; p < 784; ++p)
      centroids[label * 784 + p] += sets.train.images[static_cast<std::size_t>(i) * 784 + p];
  }
  for (std::size_t k = 0; k < 10; ++k)
    for (std::size_t p = 0; p < 784; ++p) centroids[k * 784 + p] /= counts[k];
  int correct = 0;
  for (std::int64_t i = 0; i < sets.test.count; ++i) {
    std::size_t best = 0;
    double best_distance = 1e300;
    for (std::size_t k = 0; k < 10; ++k) {
      double distance = 0;
      for (std::size_t p = 0; p < 784; ++p) {
        const double d = sets.test.images[static_cast<std::size_t>(i) * 784 + p] - centroids[k * 784 + p];
        distance += d * d;
      }
      if (distance < best_distance) best_distance = distance, best = k;
    }
    correct += static_cast<std::int32_t>(best) == sets.test.labels[static_cast<std::size_t>(i)];
  }
  const double accuracy = correct / static_cast<double>(sets.test.count);
  INFO("nearest-centroid accuracy " << accuracy);
  CHECK(accuracy > 0.5);
  CHECK(accuracy < 0.95);
}

// -------------------------------------------------------------------- Batcher

namespace {

Dataset numbered(std::int64_t count) {
  // Sample i's pixels are i and i + 0.5, its label i mod 10.
  Dataset data;
  data.count = count;
  data.height = 1;
  data.width = 2;
  for (std::int64_t i = 0; i < count; ++i) {
    data.images.push_back(static_cast<float>(i));
    data.images.push_back(static_cast<float>(i) + 0.5f);
    data.labels.push_back(static_cast<std::int32_t>(i % 10));
  }
  return data;
}

std::vector<std::int64_t> epoch_order(const Batcher& batcher, std::int64_t epoch) {
  std::vector<std::int64_t> order;
  for (std::int64_t b = 0; b < batcher.batches_per_epoch(); ++b) {
    const std::vector<std::int64_t> batch = batcher.batch_indices(epoch, b);
    order.insert(order.end(), batch.begin(), batch.end());
  }
  return order;
}

}  // namespace

TEST_CASE("Batcher partitions each epoch into batches", "[data][batcher]") {
  const Dataset data = numbered(103);
  const Batcher dropping(data, 10, 5, true), keeping(data, 10, 5, false);
  REQUIRE(dropping.batches_per_epoch() == 10);
  REQUIRE(keeping.batches_per_epoch() == 11);
  for (std::int64_t epoch : {0, 1, 7}) {
    INFO("epoch " << epoch);
    for (std::int64_t b = 0; b < 10; ++b) CHECK(dropping.batch_indices(epoch, b).size() == 10);
    CHECK(keeping.batch_indices(epoch, 10).size() == 3);

    // Without drop_last the batches cover every sample once; with it, the
    // same order without its last 3 (the seed and epoch alone fix the order).
    std::vector<std::int64_t> all = epoch_order(keeping, epoch);
    const std::vector<std::int64_t> dropped = epoch_order(dropping, epoch);
    REQUIRE(all.size() == 103);
    REQUIRE(dropped.size() == 100);
    CHECK(std::equal(dropped.begin(), dropped.end(), all.begin()));
    std::sort(all.begin(), all.end());
    std::vector<std::int64_t> identity(103);
    std::iota(identity.begin(), identity.end(), std::int64_t{0});
    CHECK(all == identity);
  }
  CHECK_THROWS_AS(dropping.batch_indices(0, 10), std::out_of_range);
  CHECK_THROWS_AS(dropping.batch_indices(-1, 0), std::out_of_range);
  CHECK(Batcher(data, 200, 5, true).batches_per_epoch() == 0);
  CHECK(Batcher(data, 200, 5, false).batches_per_epoch() == 1);
  CHECK_THROWS_AS(Batcher(data, 0, 5), std::invalid_argument);
}

TEST_CASE("Batcher's order depends on seed and epoch only", "[data][batcher]") {
  const Dataset data = numbered(1000);
  const Batcher a(data, 32, 42), b(data, 32, 42), other_seed(data, 32, 43);
  const std::vector<std::int64_t> e0 = epoch_order(a, 0), e1 = epoch_order(a, 1);
  CHECK(e0 != e1);
  // Another instance, asked in another order, gives the same batches.
  CHECK(epoch_order(b, 1) == e1);
  CHECK(epoch_order(b, 0) == e0);
  CHECK(b.batch_indices(1, 5) == a.batch_indices(1, 5));
  CHECK(epoch_order(a, 0) == e0);
  CHECK(epoch_order(other_seed, 0) != e0);

  // Golden values: a change here changes every training run's batches.
  const Dataset ten = numbered(10);
  CHECK(Batcher(ten, 10, 1).batch_indices(0, 0) == std::vector<std::int64_t>{1, 7, 5, 6, 2, 0, 4, 8, 3, 9});
  CHECK(Batcher(ten, 10, 1).batch_indices(1, 0) == std::vector<std::int64_t>{6, 1, 7, 5, 3, 2, 4, 8, 0, 9});
}

TEST_CASE("Batcher::gather copies samples and labels", "[data][batcher]") {
  const Dataset data = numbered(20);
  const Batcher batcher(data, 4, 3);
  std::vector<float> images(1, -1.0f), labels;
  batcher.gather({13, 0, 19}, images, labels);
  CHECK(images == std::vector<float>{13.0f, 13.5f, 0.0f, 0.5f, 19.0f, 19.5f});
  CHECK(labels == std::vector<float>{3.0f, 0.0f, 9.0f});
  batcher.gather(batcher.batch_indices(0, 0), images, labels);
  CHECK(images.size() == 8);
  CHECK(labels.size() == 4);
  CHECK_THROWS_AS(batcher.gather({20}, images, labels), std::out_of_range);
}

// ------------------------------------------------------------------------- text

TEST_CASE("load_text: a byte vocabulary, windows of context + 1, every 10th window held out", "[data][text]") {
  TempDir dir;
  // Two collections (read in name order), the fortunes' "%" separators, a
  // strfile index that must be skipped, and a link to a collection (as the
  // package's .u8 links) that must not be read twice.
  std::string a, b;
  for (int i = 0; i < 30; ++i) a += i % 2 == 0 ? "abc\n%\n" : "cab\n%\n";
  for (int i = 0; i < 30; ++i) b += "zz\n";
  std::ofstream(dir / "b_text") << b;
  std::ofstream(dir / "a_text") << a;
  std::ofstream(dir / "a_text.dat") << "\x01\x02 binary index";
  fs::create_symlink(dir / "a_text", dir / "a_text.u8");
  std::string text;  // what the loader must see: a, then b, without the "%" lines
  for (int i = 0; i < 30; ++i) text += i % 2 == 0 ? "abc\n" : "cab\n";
  text += b;
  const std::int64_t context = 5;
  const TrainTest t = load_text(dir.path(), context);
  // The vocabulary: '\n', 'a', 'b', 'c', 'z' in byte order.
  const std::string vocabulary = "\nabcz";
  const auto id = [&](char c) { return static_cast<std::int32_t>(vocabulary.find(c)); };
  CHECK(t.train.classes == 5);
  CHECK(t.test.classes == 5);
  const std::int64_t windows = static_cast<std::int64_t>((text.size() - 1) / context);
  CHECK(t.train.count + t.test.count == windows);
  CHECK(t.test.count == windows / 10);
  for (const Dataset* d : {&t.train, &t.test}) {
    CHECK(d->width == context);
    CHECK(d->labels_per_sample == context);
    CHECK(d->sample_size() == context);
    CHECK(d->images.size() == static_cast<std::size_t>(d->count * context));
    CHECK(d->labels.size() == static_cast<std::size_t>(d->count * context));
  }
  // Window w starts at w * context; the 10th, 20th, ... are validation.
  std::int64_t train = 0, test = 0;
  for (std::int64_t w = 0; w < windows; ++w) {
    const Dataset& d = w % 10 == 9 ? t.test : t.train;
    const std::int64_t s = w % 10 == 9 ? test++ : train++;
    for (std::int64_t i = 0; i < context; ++i) {
      INFO("window " << w << ", position " << i);
      CHECK(d.images[static_cast<std::size_t>(s * context + i)] ==
            static_cast<float>(id(text[static_cast<std::size_t>(w * context + i)])));
      CHECK(d.labels[static_cast<std::size_t>(s * context + i)] == id(text[static_cast<std::size_t>(w * context + i + 1)]));
    }
  }
  // The batcher hands out every label of a sample.
  Batcher batcher(t.train, 2, 7);
  std::vector<float> inputs, labels;
  batcher.gather({1, 0}, inputs, labels);
  REQUIRE(labels.size() == static_cast<std::size_t>(2 * context));
  for (std::int64_t i = 0; i < context; ++i) {
    CHECK(labels[static_cast<std::size_t>(i)] == static_cast<float>(t.train.labels[static_cast<std::size_t>(context + i)]));
    CHECK(labels[static_cast<std::size_t>(context + i)] == static_cast<float>(t.train.labels[static_cast<std::size_t>(i)]));
  }
  // Limits keep whole samples, labels included; the data cache keeps labels_per_sample.
  const TrainTest limited = load_text(dir.path(), context, 3, 1);
  CHECK(limited.train.count == 3);
  CHECK(limited.train.labels.size() == static_cast<std::size_t>(3 * context));
  write_data_cache(dir / "cache", limited);
  const TrainTest back = read_data_cache(dir / "cache");
  CHECK(back.train.labels_per_sample == context);
  CHECK(back.train.labels == limited.train.labels);
  CHECK(back.test.images == limited.test.images);
}

TEST_CASE("load_text says how to install a missing text and refuses a text too short", "[data][text]") {
  CHECK_THROWS_WITH(load_text("/nonexistent/mpsim/fortunes", 8), Catch::Contains("apt-get install fortunes"));
  TempDir dir;
  std::ofstream(dir / "short") << "just a few words\n";
  CHECK_THROWS_WITH(load_text(dir.path(), 8), Catch::Contains("fewer than 10 windows of 9 bytes"));
}
