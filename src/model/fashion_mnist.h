// Fashion-MNIST: 28x28 grayscale images of clothes in 10 classes (60000 train, 10000 test), read
// from the gzip'd IDX files that the Debian package dataset-fashion-mnist installs, and shuffled
// batch streams over them.
//
//   auto train = model::LoadFashionMnist(/*train=*/true);
//   auto data = std::make_shared<const model::ImageDataset>(std::move(*train));
//   model::ImageBatchStream stream(data, /*seed=*/peer_index, /*batch_size=*/64);
//   model::ImageBatchStream::Batch b = stream.Next();  // images [64,1,28,28], labels [64]
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <vector>

#include "core/status.h"

namespace colony::model {

inline constexpr int64_t kFashionMnistSide = 28;
inline constexpr int64_t kFashionMnistPixels = kFashionMnistSide * kFashionMnistSide;
inline constexpr int64_t kFashionMnistClasses = 10;
// Per-pixel mean and standard deviation of the training images (scaled to [0, 1]).
inline constexpr float kFashionMnistMean = 0.2860f;
inline constexpr float kFashionMnistStd = 0.3530f;

struct ImageDataset {
  std::vector<float> images;    // [size, 1, 28, 28], normalized: (x / 255 - mean) / std
  std::vector<int64_t> labels;  // [size], in [0, 10)
  int64_t size = 0;
};

// Loads the train (60000) or test (10000) split from `dir`:
// {train,t10k}-images-idx3-ubyte.gz and {train,t10k}-labels-idx1-ubyte.gz. The files are treated
// as untrusted: magic numbers, dimensions, counts against the data present, and label range are
// checked, and a corrupt file gives an error naming it.
Result<ImageDataset> LoadFashionMnist(
    bool train, const std::filesystem::path& dir = "/usr/share/datasets/fashion-mnist");

// An endless stream of batches drawn without replacement, reshuffled (by the seed and the pass
// number) at the start of every pass; a batch may span the end of one pass and the start of the
// next. Different seeds give different orders. Not thread-safe.
class ImageBatchStream {
 public:
  struct Batch {
    std::vector<float> images;    // [batch_size, 1, 28, 28]
    std::vector<int64_t> labels;  // [batch_size]
    int64_t batch_size = 0;
  };

  // An empty dataset or a non-positive batch_size yields empty batches.
  ImageBatchStream(std::shared_ptr<const ImageDataset> dataset, uint64_t seed, int64_t batch_size);

  Batch Next();
  // Completed passes over the dataset (0 during the first).
  int64_t pass() const { return pass_; }
  // Samples drawn so far; the stream of (dataset, seed, batch_size) is the same in every
  // process, so batch i is samples [i * batch_size, (i + 1) * batch_size) of it.
  int64_t position() const;
  // Continues from `samples` drawn (0 or more).
  void Seek(int64_t samples);

 private:
  void Reshuffle();

  std::shared_ptr<const ImageDataset> dataset_;
  uint64_t seed_;
  int64_t batch_size_;
  int64_t pass_ = 0;
  std::vector<uint32_t> order_;
  size_t pos_ = 0;
};

}  // namespace colony::model
