#include "model/fashion_mnist.h"

#include <zlib.h>

#include <array>
#include <cerrno>
#include <cstring>
#include <string>
#include <system_error>
#include <utility>

namespace colony::model {

namespace fs = std::filesystem;

namespace {

constexpr uint32_t kImagesMagic = 0x00000803;  // unsigned byte data, 3 dimensions
constexpr uint32_t kLabelsMagic = 0x00000801;  // unsigned byte data, 1 dimension
// The train images are 47 MB; anything much larger is not Fashion-MNIST (a gzip bomb).
constexpr size_t kMaxFileBytes = 128 << 20;

Status MissingDataset(const fs::path& file) {
  return NotFound("Fashion-MNIST file " + file.string() +
                  " not found: install the Debian package dataset-fashion-mnist (scripts/setup)");
}

Result<std::string> ReadGzip(const fs::path& file) {
  std::error_code ec;
  if (!fs::is_regular_file(file, ec)) return MissingDataset(file);
  gzFile gz = gzopen(file.c_str(), "rb");
  if (gz == nullptr) return NotFound("cannot open " + file.string() + ": " + std::strerror(errno));
  gzbuffer(gz, 256 * 1024);
  std::string out;
  std::array<char, 256 * 1024> buf;
  for (;;) {
    const int n = gzread(gz, buf.data(), static_cast<unsigned>(buf.size()));
    if (n < 0) {
      int err = 0;
      std::string msg = gzerror(gz, &err);
      gzclose(gz);
      return DataLoss("corrupt Fashion-MNIST file " + file.string() + ": " + msg);
    }
    if (n == 0) break;
    out.append(buf.data(), static_cast<size_t>(n));
    if (out.size() > kMaxFileBytes) {
      gzclose(gz);
      return DataLoss("Fashion-MNIST file " + file.string() + " decompresses to more than " +
                      std::to_string(kMaxFileBytes) + " bytes");
    }
  }
  int err = 0;
  std::string msg = gzerror(gz, &err);
  const int close_rc = gzclose(gz);
  if (err != Z_OK || close_rc != Z_OK) {
    return DataLoss("corrupt Fashion-MNIST file " + file.string() + ": " +
                    (err != Z_OK ? msg : "truncated gzip stream"));
  }
  return out;
}

uint32_t BigEndian32(const std::string& data, size_t offset) {
  const auto* p = reinterpret_cast<const unsigned char*>(data.data()) + offset;
  return (uint32_t{p[0]} << 24) | (uint32_t{p[1]} << 16) | (uint32_t{p[2]} << 8) | uint32_t{p[3]};
}

uint64_t SplitMix64(uint64_t& state) {
  uint64_t z = (state += 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

}  // namespace

Result<ImageDataset> LoadFashionMnist(bool train, const fs::path& dir) {
  const std::string prefix = train ? "train" : "t10k";
  const fs::path images_file = dir / (prefix + "-images-idx3-ubyte.gz");
  const fs::path labels_file = dir / (prefix + "-labels-idx1-ubyte.gz");
  COLONY_ASSIGN_OR_RETURN(std::string images, ReadGzip(images_file));
  COLONY_ASSIGN_OR_RETURN(std::string labels, ReadGzip(labels_file));

  if (images.size() < 16 || BigEndian32(images, 0) != kImagesMagic) {
    return DataLoss(images_file.string() + " is not an IDX image file (bad magic number)");
  }
  const uint64_t n = BigEndian32(images, 4);
  const uint32_t rows = BigEndian32(images, 8), cols = BigEndian32(images, 12);
  if (rows != kFashionMnistSide || cols != kFashionMnistSide) {
    return DataLoss(images_file.string() + " holds " + std::to_string(rows) + "x" +
                    std::to_string(cols) + " images, expected 28x28");
  }
  if (images.size() - 16 != n * kFashionMnistPixels) {
    return DataLoss(images_file.string() + " announces " + std::to_string(n) +
                    " images but holds " + std::to_string(images.size() - 16) +
                    " bytes of pixels (truncated or corrupt)");
  }
  if (labels.size() < 8 || BigEndian32(labels, 0) != kLabelsMagic) {
    return DataLoss(labels_file.string() + " is not an IDX label file (bad magic number)");
  }
  const uint64_t num_labels = BigEndian32(labels, 4);
  if (labels.size() - 8 != num_labels) {
    return DataLoss(labels_file.string() + " announces " + std::to_string(num_labels) +
                    " labels but holds " + std::to_string(labels.size() - 8) +
                    " (truncated or corrupt)");
  }
  if (num_labels != n) {
    return DataLoss(images_file.string() + " and " + labels_file.string() +
                    " disagree on the number of examples (" + std::to_string(n) + " vs " +
                    std::to_string(num_labels) + ")");
  }
  if (n == 0) return DataLoss(images_file.string() + " holds no images");

  ImageDataset d;
  d.size = static_cast<int64_t>(n);
  d.labels.resize(n);
  for (uint64_t i = 0; i < n; ++i) {
    const auto label = static_cast<unsigned char>(labels[8 + i]);
    if (label >= kFashionMnistClasses) {
      return DataLoss(labels_file.string() + ": label " + std::to_string(label) + " of example " +
                      std::to_string(i) + " is out of range [0, 10)");
    }
    d.labels[i] = label;
  }
  std::array<float, 256> lut;
  for (int v = 0; v < 256; ++v) {
    lut[v] = (static_cast<float>(v) / 255.0f - kFashionMnistMean) / kFashionMnistStd;
  }
  d.images.resize(n * kFashionMnistPixels);
  const auto* pixels = reinterpret_cast<const unsigned char*>(images.data()) + 16;
  for (size_t i = 0; i < d.images.size(); ++i) d.images[i] = lut[pixels[i]];
  return d;
}

ImageBatchStream::ImageBatchStream(std::shared_ptr<const ImageDataset> dataset, uint64_t seed,
                                   int64_t batch_size)
    : dataset_(std::move(dataset)), seed_(seed), batch_size_(batch_size) {
  Reshuffle();
}

void ImageBatchStream::Reshuffle() {
  const size_t n = dataset_ ? static_cast<size_t>(dataset_->size) : 0;
  order_.resize(n);
  for (size_t i = 0; i < n; ++i) order_[i] = static_cast<uint32_t>(i);
  // Fisher-Yates with our own generator: the same order on every platform.
  uint64_t state = seed_ ^ (static_cast<uint64_t>(pass_) * 0xd1b54a32d192ed03ULL);
  SplitMix64(state);
  for (size_t i = n; i > 1; --i) {
    std::swap(order_[i - 1], order_[static_cast<size_t>(SplitMix64(state) % i)]);
  }
  pos_ = 0;
}

ImageBatchStream::Batch ImageBatchStream::Next() {
  Batch b;
  if (order_.empty() || batch_size_ <= 0) return b;
  b.batch_size = batch_size_;
  b.images.resize(static_cast<size_t>(batch_size_ * kFashionMnistPixels));
  b.labels.resize(static_cast<size_t>(batch_size_));
  for (int64_t row = 0; row < batch_size_; ++row) {
    if (pos_ == order_.size()) {
      ++pass_;
      Reshuffle();
    }
    const size_t i = order_[pos_++];
    std::memcpy(b.images.data() + row * kFashionMnistPixels,
                dataset_->images.data() + i * kFashionMnistPixels,
                kFashionMnistPixels * sizeof(float));
    b.labels[static_cast<size_t>(row)] = dataset_->labels[i];
  }
  return b;
}

int64_t ImageBatchStream::position() const {
  return pass_ * static_cast<int64_t>(order_.size()) + static_cast<int64_t>(pos_);
}

void ImageBatchStream::Seek(int64_t samples) {
  const auto n = static_cast<int64_t>(order_.size());
  if (n == 0 || samples < 0) return;
  if (samples / n != pass_) {
    pass_ = samples / n;
    Reshuffle();
  }
  pos_ = static_cast<size_t>(samples % n);
}

}  // namespace colony::model
