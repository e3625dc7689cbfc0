#pragma once
// Data sets and seeded batching. Images are binary32 in [0, 1], NCHW with one
// channel; labels are class indices.

#include <cstdint>
#include <filesystem>
#include <stdexcept>
#include <string>
#include <vector>

namespace mpsim::core {

// A sample is `sample_size()` binary32 inputs (an image's pixels in [0, 1],
// or a text's token ids) and `labels_per_sample` class indices (one per
// image; one per position of a language model's context: the next token).
struct Dataset {
  std::int64_t count = 0, channels = 1, height = 0, width = 0, classes = 10;
  std::int64_t labels_per_sample = 1;
  std::vector<float> images;         // count * sample_size()
  std::vector<std::int32_t> labels;  // count * labels_per_sample, each in [0, classes)
  std::int64_t sample_size() const { return channels * height * width; }
  std::int64_t label_count() const { return count * labels_per_sample; }
};

struct TrainTest {
  Dataset train, test;
};

// Thrown for a missing, truncated or corrupt data file; what() names the file and the problem.
class DataError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Where Debian's dataset-fashion-mnist package installs the files.
inline constexpr const char* default_fashion_mnist_dir = "/usr/share/datasets/fashion-mnist";

// Reads one gzip'd (or plain) IDX file with full validation: magic number,
// element type, rank, dimensions and exact size.
Dataset read_idx_images(const std::filesystem::path& images, const std::filesystem::path& labels);
// {train,t10k}-{images-idx3,labels-idx1}-ubyte.gz from `dir`. limit > 0 keeps the first `limit` samples.
TrainTest load_fashion_mnist(const std::filesystem::path& dir, std::int64_t train_limit = 0,
                             std::int64_t test_limit = 0);

// Where Debian's fortunes package installs its English collections.
inline constexpr const char* default_fortunes_dir = "/usr/share/games/fortunes";

// A character-level language-modelling task from the text files in `dir`
// (every regular file that is not a strfile index `.dat`, in name order;
// the fortunes' "%" separator lines dropped). The vocabulary is the bytes
// that occur, in byte order (classes = their number). The text is cut into
// consecutive windows of context + 1 bytes overlapping by one: a sample's
// inputs are the window's first `context` token ids (width = context), its
// labels the `context` tokens that follow each. Every 10th window (the
// 10th, 20th, ...) is validation data, the rest training: the same split for
// every seed. limit > 0 keeps the first `limit` windows of each.
TrainTest load_text(const std::filesystem::path& dir, std::int64_t context, std::int64_t train_limit = 0,
                    std::int64_t test_limit = 0);

// A data set as loaded, in one raw file (this machine's byte order; not an
// interchange format): the parent of a parallel run writes each data set
// once and its children read it instead of decompressing and converting the
// IDX files again. read_data_cache throws DataError for a file it did not write.
void write_data_cache(const std::filesystem::path& file, const TrainTest& data);
TrainTest read_data_cache(const std::filesystem::path& file);

// A learnable synthetic task of 28x28 one-channel images, fully determined by seed.
TrainTest make_synthetic(std::uint64_t seed, std::int64_t train_count, std::int64_t test_count,
                         std::int64_t classes = 10);

// Seeded shuffling: epoch e's order is a permutation drawn from (seed, e) alone,
// so every arm with the same seed sees the same batches.
class Batcher {
 public:
  Batcher(const Dataset& data, std::int64_t batch_size, std::uint64_t seed, bool drop_last = true);
  std::int64_t batches_per_epoch() const;
  // Indices of the samples of batch b in epoch e.
  std::vector<std::int64_t> batch_indices(std::int64_t epoch, std::int64_t batch) const;
  // Copies a batch's inputs and labels (as binary32 class indices; labels_per_sample per sample).
  void gather(const std::vector<std::int64_t>& indices, std::vector<float>& images, std::vector<float>& labels) const;

 private:
  const Dataset* data_;
  std::int64_t batch_size_;
  std::uint64_t seed_;
  bool drop_last_;
  mutable std::int64_t cached_epoch_ = -1;
  mutable std::vector<std::int64_t> order_;
};

}  // namespace mpsim::core
