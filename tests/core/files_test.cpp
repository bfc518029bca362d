// Files shared by processes: the lock that serializes creating them, atomic writes, cleanup of
// what crashed writers left, content hashes.
#include "core/files.h"

#include <gtest/gtest.h>

#include <atomic>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "test_support.h"

namespace colony {
namespace {

namespace fs = std::filesystem;
using colony::test::ReadFile;
using colony::test::TempDir;

TEST(Files, Fnv1a64MatchesPublishedVectors) {
  // The FNV-1a test vectors of the algorithm's authors.
  EXPECT_EQ(Hex64(Fnv1a64("")), "cbf29ce484222325");
  EXPECT_EQ(Hex64(Fnv1a64("a")), "af63dc4c8601ec8c");
  EXPECT_EQ(Hex64(Fnv1a64("foobar")), "85944171f73967e8");
  // Chaining equals hashing the concatenation.
  EXPECT_EQ(Fnv1a64("bar", Fnv1a64("foo")), Fnv1a64("foobar"));
}

TEST(Files, HashFileHashesTheContents) {
  TempDir dir;
  colony::test::WriteFile(dir.File("f"), "foobar");
  EXPECT_EQ(*HashFile(dir.File("f")), "85944171f73967e8");
  EXPECT_EQ(HashFile(dir.File("missing")).status().code(), StatusCode::kNotFound);
}

TEST(Files, WriteFileAtomicallyReplacesWholeFiles) {
  TempDir dir;
  const fs::path f = dir.File("data");
  ASSERT_TRUE(WriteFileAtomically(f, "first").ok());
  EXPECT_EQ(ReadFile(f), "first");
  ASSERT_TRUE(WriteFileAtomically(f, "second, longer").ok());
  EXPECT_EQ(ReadFile(f), "second, longer");
  // Nothing else is left in the directory.
  EXPECT_EQ(std::distance(fs::directory_iterator(dir.path()), fs::directory_iterator()), 1);
  EXPECT_FALSE(WriteFileAtomically(dir.path() / "missing" / "x", "y").ok());
}

TEST(Files, ReadFileToStringReadsWholeFilesUpToItsLimit) {
  TempDir dir;
  const auto f = dir.path() / "f";
  const std::string bytes = std::string(100'000, 'x') + std::string(1, '\0') + "tail";
  ASSERT_TRUE(WriteFileAtomically(f, bytes).ok());
  auto read = ReadFileToString(f, bytes.size());
  ASSERT_TRUE(read.ok()) << read.status().ToString();
  EXPECT_EQ(*read, bytes);
  auto over = ReadFileToString(f, bytes.size() - 1);
  ASSERT_FALSE(over.ok());
  EXPECT_EQ(over.status().code(), StatusCode::kResourceExhausted);
  EXPECT_NE(over.status().message().find("is larger than"), std::string::npos);
  EXPECT_EQ(ReadFileToString(dir.path() / "missing", 10).status().code(), StatusCode::kNotFound);
}

TEST(Files, RemoveStaleTempsRemovesOnlyThatFilesTemporaries) {
  TempDir dir;
  const fs::path f = dir.File("model");
  const fs::path stale = UniqueTempPath(f);
  const fs::path other = UniqueTempPath(dir.File("other"));
  EXPECT_NE(UniqueTempPath(f), stale);
  fs::create_directories(stale);  // a crashed writer's work directory
  colony::test::WriteFile(stale / "part", "x");
  colony::test::WriteFile(other.string(), "y");
  colony::test::WriteFile(f.string(), "z");
  RemoveStaleTemps(f);
  EXPECT_FALSE(fs::exists(stale));
  EXPECT_TRUE(fs::exists(other));
  EXPECT_TRUE(fs::exists(f));
}

// Nested folders, files, an empty folder and links (to a file and to a folder outside the
// tree, which must survive): all gone, the links' targets intact; a missing path is fine.
TEST(Files, RemoveTreeRemovesEverythingUnderAPathButNotWhatLinksPointTo) {
  TempDir dir;
  const fs::path tree = dir.path() / "tree", outside = dir.path() / "outside";
  fs::create_directories(tree / "a" / "b" / "c");
  fs::create_directories(tree / "empty");
  fs::create_directories(outside);
  colony::test::WriteFile((outside / "keep").string(), "k");
  colony::test::WriteFile((tree / "top").string(), "1");
  colony::test::WriteFile((tree / "a" / "b" / "c" / "deep").string(), "2");
  fs::create_directory_symlink(outside, tree / "a" / "dir-link");
  fs::create_symlink(outside / "keep", tree / "file-link");
  EXPECT_FALSE(RemoveTree(tree));
  EXPECT_FALSE(fs::exists(tree));
  EXPECT_TRUE(fs::exists(outside / "keep"));
  EXPECT_FALSE(RemoveTree(tree));  // already gone
  // A single file, and a link whose target is a folder: the link alone goes.
  colony::test::WriteFile((dir.path() / "file").string(), "f");
  EXPECT_FALSE(RemoveTree(dir.path() / "file"));
  EXPECT_FALSE(fs::exists(dir.path() / "file"));
  fs::create_directory_symlink(outside, dir.path() / "link");
  EXPECT_FALSE(RemoveTree(dir.path() / "link"));
  EXPECT_FALSE(fs::exists(fs::symlink_status(dir.path() / "link")));
  EXPECT_TRUE(fs::exists(outside / "keep"));
}

TEST(Files, FileLockSerializesThreads) {
  TempDir dir;
  const fs::path lock_path = dir.File("lock");
  std::atomic<int> inside{0}, most{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 20; ++i) {
        auto lock = FileLock::Acquire(lock_path);
        ASSERT_TRUE(lock.ok());
        const int now = ++inside;
        int seen = most.load();
        while (now > seen && !most.compare_exchange_weak(seen, now)) {
        }
        std::this_thread::yield();
        --inside;
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(most.load(), 1);
  EXPECT_EQ(FileLock::Acquire(dir.path() / "missing" / "lock").status().code(),
            StatusCode::kPermissionDenied);
}

}  // namespace
}  // namespace colony
