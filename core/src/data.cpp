#include "mpsim/core/data.hpp"
#include "splitmix.hpp"

#include <zlib.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <memory>
#include <numeric>
#include <utility>

namespace mpsim::core {

namespace fs = std::filesystem;

namespace {

// One seed per (seed, stream) pair: nearby pairs give unrelated streams.
constexpr std::uint64_t mix(std::uint64_t seed, std::uint64_t stream) {
  return splitmix_finalize(seed ^ splitmix_finalize(stream + splitmix_gamma));
}

// ------------------------------------------------------------------ IDX files

[[noreturn]] void fail(const fs::path& file, const std::string& problem) {
  throw DataError(file.string() + ": " + problem);
}

std::string hex32(std::uint32_t v) {
  char text[11];
  std::snprintf(text, sizeof text, "0x%08x", v);
  return text;
}

const std::string install_hint =
    "install Debian's dataset-fashion-mnist package (apt-get install dataset-fashion-mnist) or set data.path";

struct GzClose {
  void operator()(gzFile f) const { gzclose(f); }
};

// An IDX file opened through zlib. zlib recognises gzip by its 0x1f 0x8b magic
// and reads any other file as it is ("transparent" mode), so plain (already
// unpacked) files work too.
class IdxReader {
 public:
  explicit IdxReader(const fs::path& path) : path_(path) {
    std::error_code ec;
    const fs::file_status status = fs::status(path, ec);
    if (!fs::exists(status)) fail(path, "file not found; " + install_hint);
    if (fs::is_directory(status)) fail(path, "is a directory, not an IDX file");
    file_.reset(gzopen(path.c_str(), "rb"));
    if (!file_) fail(path, std::string("cannot open for reading: ") + std::strerror(errno));
  }

  // Reads up to n bytes and returns how many there were; short only at the end.
  std::size_t read(std::uint8_t* dst, std::size_t n) {
    std::size_t total = 0;
    while (total < n) {
      const unsigned want = static_cast<unsigned>(std::min<std::size_t>(n - total, 1u << 20));
      const int got = gzread(file_.get(), dst + total, want);
      check_stream();
      if (got <= 0) break;
      total += static_cast<std::size_t>(got);
    }
    return total;
  }

  // The big-endian header: the magic number (checked first, so that a file of
  // the wrong kind is named as such even when shorter than the header we
  // expect), then one 32-bit size per dimension.
  std::vector<std::uint32_t> header(std::uint32_t magic, const char* what, std::size_t rank) {
    std::vector<std::uint32_t> fields;
    for (std::size_t i = 0; i <= rank; ++i) {
      std::uint8_t bytes[4];
      const std::size_t got = read(bytes, 4);
      if (got < 4)
        fail(path_, "truncated: the header takes " + std::to_string(4 * (1 + rank)) + " bytes, got " +
                        std::to_string(4 * i + got));
      fields.push_back(std::uint32_t{bytes[0]} << 24 | std::uint32_t{bytes[1]} << 16 | std::uint32_t{bytes[2]} << 8 |
                       std::uint32_t{bytes[3]});
      if (i == 0 && fields[0] != magic)
        fail(path_, "bad magic number " + hex32(fields[0]) + "; an IDX " + what + " file starts with " + hex32(magic) +
                        " (unsigned byte elements, rank " + std::to_string(rank) + ")");
    }
    fields.erase(fields.begin());
    return fields;
  }

  // Exactly n data bytes, then the end of the file.
  std::vector<std::uint8_t> data(std::size_t n, const std::string& dims) {
    // Read in pieces so that a header promising far more than the file holds
    // fails on the truncation rather than allocating the promised size.
    std::vector<std::uint8_t> bytes;
    const std::size_t piece = std::size_t{1} << 24;
    while (bytes.size() < n) {
      const std::size_t old = bytes.size(), want = std::min(piece, n - old);
      bytes.resize(old + want);
      const std::size_t got = read(bytes.data() + old, want);
      bytes.resize(old + got);
      if (got < want) break;
    }
    if (bytes.size() < n)
      fail(path_, "truncated: the header's dimensions (" + dims + ") call for " + std::to_string(n) +
                      " data bytes, got " + std::to_string(bytes.size()));
    std::size_t extra = 0;
    std::uint8_t sink[4096];
    for (std::size_t got; (got = read(sink, sizeof sink)) > 0;) extra += got;
    if (extra > 0)
      fail(path_, "trailing garbage: " + std::to_string(extra) + " more bytes than the " + std::to_string(n) +
                      " data bytes that the header's dimensions (" + dims + ") call for");
    return bytes;
  }

 private:
  // gzread reports a damaged stream as an error, but a cut-off one only
  // through gzerror (Z_BUF_ERROR, "unexpected end of file"), so ask each time.
  void check_stream() {
    int code = Z_OK;
    const char* message = gzerror(file_.get(), &code);
    if (code == Z_ERRNO) fail(path_, std::string("read error: ") + std::strerror(errno));
    if (code != Z_OK) fail(path_, std::string("corrupt or truncated gzip stream (zlib: ") + message + ")");
  }

  fs::path path_;
  std::unique_ptr<gzFile_s, GzClose> file_;
};

// Limits far above any data set this toolkit trains on; a header beyond them
// is corrupt, and refusing it avoids trying to allocate what it claims.
constexpr std::uint32_t max_side = 4096;
constexpr std::uint64_t max_bytes = std::uint64_t{1} << 32;

void check_count(const fs::path& file, std::uint32_t count) {
  if (count == 0) fail(file, "zero sample count in the header");
  if (count > max_bytes / 4) fail(file, "implausible sample count " + std::to_string(count) + " in the header");
}

void keep_first(Dataset& data, std::int64_t limit) {
  if (limit <= 0 || limit >= data.count) return;
  data.count = limit;
  data.images.resize(static_cast<std::size_t>(limit * data.sample_size()));
  data.labels.resize(static_cast<std::size_t>(data.label_count()));
}

}  // namespace

Dataset read_idx_images(const fs::path& images, const fs::path& labels) {
  Dataset data;
  {
    IdxReader reader(images);
    const std::vector<std::uint32_t> dims = reader.header(0x00000803, "image", 3);
    const std::string text =
        std::to_string(dims[0]) + " x " + std::to_string(dims[1]) + " x " + std::to_string(dims[2]);
    check_count(images, dims[0]);
    if (dims[1] == 0 || dims[2] == 0) fail(images, "zero image size " + text + " in the header");
    const std::uint64_t bytes = std::uint64_t{dims[0]} * dims[1] * dims[2];
    if (dims[1] > max_side || dims[2] > max_side || bytes > max_bytes)
      fail(images, "implausible dimensions " + text + " in the header");
    const std::vector<std::uint8_t> pixels = reader.data(bytes, text);
    data.count = dims[0];
    data.height = dims[1];
    data.width = dims[2];
    data.images.resize(pixels.size());
    std::transform(pixels.begin(), pixels.end(), data.images.begin(),
                   [](std::uint8_t p) { return static_cast<float>(p) / 255.0f; });
  }
  IdxReader reader(labels);
  const std::uint32_t count = reader.header(0x00000801, "label", 1)[0];
  check_count(labels, count);
  const std::vector<std::uint8_t> values = reader.data(count, std::to_string(count));
  if (count != data.count)
    fail(labels, "has " + std::to_string(count) + " labels but " + images.string() + " has " +
                     std::to_string(data.count) + " images");
  for (std::size_t i = 0; i < values.size(); ++i)
    if (values[i] >= data.classes)
      fail(labels, "label " + std::to_string(values[i]) + " at index " + std::to_string(i) + " is not below " +
                       std::to_string(data.classes));
  data.labels.assign(values.begin(), values.end());
  return data;
}

namespace {

constexpr char data_cache_magic[16] = "mpsim data v2\n";

void write_set(std::ofstream& out, const Dataset& d) {
  const std::int64_t header[6] = {d.count, d.channels, d.height, d.width, d.classes, d.labels_per_sample};
  out.write(reinterpret_cast<const char*>(header), sizeof header);
  out.write(reinterpret_cast<const char*>(d.images.data()), static_cast<std::streamsize>(d.images.size() * sizeof(float)));
  out.write(reinterpret_cast<const char*>(d.labels.data()),
            static_cast<std::streamsize>(d.labels.size() * sizeof(std::int32_t)));
}

Dataset read_set(std::ifstream& in, const fs::path& file) {
  Dataset d;
  std::int64_t header[6] = {};
  in.read(reinterpret_cast<char*>(header), sizeof header);
  d.count = header[0];
  d.channels = header[1];
  d.height = header[2];
  d.width = header[3];
  d.classes = header[4];
  d.labels_per_sample = header[5];
  // Each dimension bounded first, so that their product cannot overflow.
  const bool sane = in && d.count >= 0 && d.count <= std::int64_t{max_bytes} && d.channels >= 1 &&
                    d.channels <= max_side && d.height >= 1 && d.height <= max_side && d.width >= 1 &&
                    d.width <= max_side && d.classes >= 1 && d.classes <= 256 && d.labels_per_sample >= 1 &&
                    d.labels_per_sample <= max_side;
  if (!sane || static_cast<std::uint64_t>(d.sample_size()) > max_bytes / std::max<std::uint64_t>(1, d.count))
    fail(file, "is not a data cache mpsim wrote (bad header)");
  d.images.resize(static_cast<std::size_t>(d.count * d.sample_size()));
  d.labels.resize(static_cast<std::size_t>(d.label_count()));
  in.read(reinterpret_cast<char*>(d.images.data()), static_cast<std::streamsize>(d.images.size() * sizeof(float)));
  in.read(reinterpret_cast<char*>(d.labels.data()), static_cast<std::streamsize>(d.labels.size() * sizeof(std::int32_t)));
  if (!in) fail(file, "is truncated");
  return d;
}

}  // namespace

void write_data_cache(const fs::path& file, const TrainTest& data) {
  std::ofstream out(file, std::ios::binary | std::ios::trunc);
  out.write(data_cache_magic, sizeof data_cache_magic);
  write_set(out, data.train);
  write_set(out, data.test);
  out.close();
  if (!out) throw DataError(file.string() + ": cannot write the data cache");
}

TrainTest read_data_cache(const fs::path& file) {
  std::ifstream in(file, std::ios::binary);
  char magic[sizeof data_cache_magic] = {};
  in.read(magic, sizeof magic);
  if (!in || !std::equal(magic, magic + sizeof magic, data_cache_magic)) fail(file, "is not a data cache mpsim wrote");
  TrainTest data{read_set(in, file), read_set(in, file)};
  if (in.peek() != std::char_traits<char>::eof()) fail(file, "has bytes after its data");
  return data;
}

TrainTest load_fashion_mnist(const fs::path& dir, std::int64_t train_limit, std::int64_t test_limit) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec))
    throw DataError(dir.string() + ": Fashion-MNIST directory not found; " + install_hint);
  TrainTest sets{read_idx_images(dir / "train-images-idx3-ubyte.gz", dir / "train-labels-idx1-ubyte.gz"),
                 read_idx_images(dir / "t10k-images-idx3-ubyte.gz", dir / "t10k-labels-idx1-ubyte.gz")};
  keep_first(sets.train, train_limit);
  keep_first(sets.test, test_limit);
  return sets;
}

// ------------------------------------------------------------------ text

TrainTest load_text(const fs::path& dir, std::int64_t context, std::int64_t train_limit, std::int64_t test_limit) {
  const std::string hint = "install Debian's fortunes package (apt-get install fortunes) or set data.path";
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) throw DataError(dir.string() + ": text directory not found; " + hint);
  if (context < 1) throw DataError("data.context = " + std::to_string(context) + ": use at least 1 token");
  std::vector<fs::path> files;
  for (const auto& entry : fs::directory_iterator(dir, ec))
    if (entry.is_regular_file() && !entry.is_symlink() && entry.path().extension() != ".dat")
      files.push_back(entry.path());
  std::sort(files.begin(), files.end());
  std::string text;
  for (const fs::path& file : files) {
    std::ifstream in(file, std::ios::binary);
    std::string line;
    while (std::getline(in, line))
      if (line != "%") text += line + '\n';
    if (in.bad()) throw DataError(file.string() + ": cannot read");
  }
  const auto windows = text.size() > 1 ? static_cast<std::int64_t>((text.size() - 1) / static_cast<std::size_t>(context))
                                       : std::int64_t{0};
  if (windows < 10)
    throw DataError(dir.string() + ": " + std::to_string(text.size()) + " bytes of text in " +
                    std::to_string(files.size()) + " files, fewer than 10 windows of " + std::to_string(context + 1) +
                    " bytes; " + hint);
  // The vocabulary: the bytes that occur, in byte order.
  std::array<std::int32_t, 256> id{};
  id.fill(-1);
  for (const char c : text) id[static_cast<unsigned char>(c)] = 0;
  std::int32_t classes = 0;
  for (auto& v : id)
    if (v == 0) v = classes++;
  TrainTest sets;
  for (Dataset* d : {&sets.train, &sets.test}) {
    d->channels = d->height = 1;
    d->width = d->labels_per_sample = context;
    d->classes = classes;
  }
  for (std::int64_t w = 0; w < windows; ++w) {
    Dataset& d = (w % 10 == 9) ? sets.test : sets.train;
    const std::size_t start = static_cast<std::size_t>(w * context);
    for (std::int64_t i = 0; i < context; ++i) {
      d.images.push_back(static_cast<float>(id[static_cast<unsigned char>(text[start + static_cast<std::size_t>(i)])]));
      d.labels.push_back(id[static_cast<unsigned char>(text[start + static_cast<std::size_t>(i) + 1])]);
    }
    ++d.count;
  }
  keep_first(sets.train, train_limit);
  keep_first(sets.test, test_limit);
  return sets;
}

// ------------------------------------------------------------------ synthetic
//
// Each class has a prototype: a shared 7x7 base pattern plus a class-specific
// deviation, each cell blown up to 4x4 pixels. A sample is its class's
// prototype shifted by up to 2 pixels each way (zeros shifted in), dimmed by a
// random contrast in [1/2, 1] and overlaid with noise of standard deviation
// about 0.2 (52 levels). With these amounts a 784-128-10 MLP trained by plain
// SGD (batch 64, learning rate 0.05 to 0.1) is near 40% after 50 steps, past
// 90% after 200 and near 99% after 500, so the way there is long enough for
// precision effects to show; a nearest-centroid rule gets 80-90%. All
// arithmetic is on integer pixel levels 0..255 (stored as level / 255 like the
// real data), so no floating-point rounding can differ between builds.

namespace {

constexpr int side = 28, cells = 7, cell = side / cells;

// Draws one set of samples from the stream `rng` (train and test use separate
// streams, so either count can change without changing the other set).
Dataset draw_samples(SplitMix64 rng, const std::vector<std::vector<int>>& prototypes, std::int64_t count) {
  Dataset data;
  data.count = count;
  data.height = data.width = side;
  data.classes = static_cast<std::int64_t>(prototypes.size());
  data.images.resize(static_cast<std::size_t>(count * side * side));
  data.labels.resize(static_cast<std::size_t>(count));
  for (std::int64_t i = 0; i < count; ++i) {
    const auto label = static_cast<std::int32_t>(rng.below(prototypes.size()));
    const int dy = static_cast<int>(rng.below(5)) - 2, dx = static_cast<int>(rng.below(5)) - 2;
    const int contrast = 8 + static_cast<int>(rng.below(9));  // sixteenths
    const std::vector<int>& proto = prototypes[static_cast<std::size_t>(label)];
    float* out = data.images.data() + i * side * side;
    for (int y = 0; y < side; ++y) {
      for (int x = 0; x < side; ++x) {
        const int sy = y - dy, sx = x - dx;
        const bool inside = sy >= 0 && sy < side && sx >= 0 && sx < side;
        const int signal = inside ? proto[static_cast<std::size_t>(sy * side + sx)] * contrast / 16 : 0;
        // The sum of a draw's eight bytes is nearly normal (mean 1020, sd ~209).
        std::uint64_t bits = rng.next();
        int sum = 0;
        for (int k = 0; k < 8; ++k, bits >>= 8) sum += static_cast<int>(bits & 0xff);
        const int level = std::clamp(signal + (sum - 1020) / 4, 0, 255);
        out[y * side + x] = static_cast<float>(level) / 255.0f;
      }
    }
    data.labels[static_cast<std::size_t>(i)] = label;
  }
  return data;
}

}  // namespace

TrainTest make_synthetic(std::uint64_t seed, std::int64_t train_count, std::int64_t test_count, std::int64_t classes) {
  if (train_count < 0 || test_count < 0 || classes < 1)
    throw std::invalid_argument("make_synthetic: counts must be >= 0 and classes >= 1");
  SplitMix64 rng(mix(seed, 0));
  std::vector<int> base(cells * cells);
  for (int& b : base) b = 64 + static_cast<int>(rng.below(129));
  std::vector<std::vector<int>> prototypes(static_cast<std::size_t>(classes), std::vector<int>(side * side));
  for (std::vector<int>& proto : prototypes) {
    std::vector<int> cell_level(cells * cells);
    for (int c = 0; c < cells * cells; ++c)
      cell_level[c] = std::clamp(base[c] + static_cast<int>(rng.below(129)) - 64, 0, 255);
    for (int y = 0; y < side; ++y)
      for (int x = 0; x < side; ++x) proto[y * side + x] = cell_level[(y / cell) * cells + x / cell];
  }
  return {draw_samples(SplitMix64(mix(seed, 1)), prototypes, train_count),
          draw_samples(SplitMix64(mix(seed, 2)), prototypes, test_count)};
}

// -------------------------------------------------------------------- Batcher

Batcher::Batcher(const Dataset& data, std::int64_t batch_size, std::uint64_t seed, bool drop_last)
    : data_(&data), batch_size_(batch_size), seed_(seed), drop_last_(drop_last) {
  if (batch_size <= 0) throw std::invalid_argument("Batcher: batch size must be positive");
}

std::int64_t Batcher::batches_per_epoch() const {
  const std::int64_t n = data_->count;
  return drop_last_ ? n / batch_size_ : (n + batch_size_ - 1) / batch_size_;
}

std::vector<std::int64_t> Batcher::batch_indices(std::int64_t epoch, std::int64_t batch) const {
  if (epoch < 0) throw std::out_of_range("Batcher: negative epoch " + std::to_string(epoch));
  if (batch < 0 || batch >= batches_per_epoch())
    throw std::out_of_range("Batcher: batch " + std::to_string(batch) + " of " + std::to_string(batches_per_epoch()));
  // The permutation is drawn once per epoch and kept while batches of that
  // epoch are asked for; it depends on (seed, epoch) only, not on call order.
  if (epoch != cached_epoch_ || order_.size() != static_cast<std::size_t>(data_->count)) {
    order_.resize(static_cast<std::size_t>(data_->count));
    std::iota(order_.begin(), order_.end(), std::int64_t{0});
    SplitMix64 rng(mix(seed_, static_cast<std::uint64_t>(epoch)));
    for (std::size_t i = order_.size(); i > 1; --i) std::swap(order_[i - 1], order_[rng.below(i)]);
    cached_epoch_ = epoch;
  }
  const std::int64_t begin = batch * batch_size_, end = std::min(begin + batch_size_, data_->count);
  return {order_.begin() + begin, order_.begin() + end};
}

void Batcher::gather(const std::vector<std::int64_t>& indices, std::vector<float>& images,
                     std::vector<float>& labels) const {
  const std::int64_t size = data_->sample_size();
  images.resize(indices.size() * static_cast<std::size_t>(size));
  const std::int64_t per = data_->labels_per_sample;
  labels.resize(indices.size() * static_cast<std::size_t>(per));
  for (std::size_t i = 0; i < indices.size(); ++i) {
    const std::int64_t s = indices[i];
    if (s < 0 || s >= data_->count) throw std::out_of_range("Batcher::gather: sample index " + std::to_string(s));
    std::copy_n(data_->images.begin() + s * size, size, images.begin() + static_cast<std::ptrdiff_t>(i) * size);
    for (std::int64_t k = 0; k < per; ++k)
      labels[i * static_cast<std::size_t>(per) + static_cast<std::size_t>(k)] =
          static_cast<float>(data_->labels[static_cast<std::size_t>(s * per + k)]);
  }
}

}  // namespace mpsim::core
