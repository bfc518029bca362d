// Subprocess: child processes with a line-oriented stdout, and programs run to completion with
// a log file and a deadline; FindProgram's $PATH lookup.
#include "core/subprocess.h"

#include <gtest/gtest.h>
#include <signal.h>

#include <chrono>
#include <cstdlib>
#include <string>

#include "test_support.h"

namespace colony {
namespace {

using namespace std::chrono_literals;
using colony::test::ReadFile;
using colony::test::TempDir;

TEST(Subprocess, ReadsLinesAndTheExitCode) {
  auto p = Subprocess::Spawn({"/bin/sh", "-c", "echo one; echo two; exit 3"});
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  EXPECT_EQ(*p->ReadLine(5s), "one");
  EXPECT_EQ(*p->ReadLine(5s), "two");
  EXPECT_EQ(p->ReadLine(5s).status().code(), StatusCode::kNotFound);  // EOF
  EXPECT_EQ(*p->Wait(5s), 3);
}

TEST(Subprocess, ReadLineAndWaitHaveDeadlines) {
  auto p = Subprocess::Spawn({"/bin/sleep", "30"});
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(p->ReadLine(50ms).status().code(), StatusCode::kDeadlineExceeded);
  EXPECT_EQ(p->Wait(50ms).status().code(), StatusCode::kDeadlineExceeded);
  EXPECT_TRUE(p->running());
  p->Signal(SIGTERM);
  EXPECT_EQ(*p->Wait(5s), 128 + SIGTERM);
  EXPECT_FALSE(p->running());
}

TEST(Subprocess, RunWritesBothStreamsToTheLogWithNoInput) {
  TempDir dir;
  const std::string log = dir.File("run.log");
  // `cat` reads stdin: from /dev/null it ends at once instead of waiting on the test's stdin.
  auto code = Subprocess::Run({"/bin/sh", "-c", "echo out; echo err >&2; cat; exit 4"}, log, 10s);
  ASSERT_TRUE(code.ok()) << code.status().ToString();
  EXPECT_EQ(*code, 4);
  EXPECT_EQ(ReadFile(log), "out\nerr\n");
}

TEST(Subprocess, RunKillsAProgramPastItsDeadline) {
  TempDir dir;
  const auto t0 = std::chrono::steady_clock::now();
  auto code = Subprocess::Run({"/bin/sleep", "30"}, dir.File("sleep.log"), 100ms);
  EXPECT_EQ(code.status().code(), StatusCode::kDeadlineExceeded) << code.status().ToString();
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 20s);
}

TEST(Subprocess, RunReportsWhatItCannotStart) {
  TempDir dir;
  EXPECT_EQ(Subprocess::Run({"/bin/true"}, (dir.path() / "missing" / "x.log").string(), 5s)
                .status()
                .code(),
            StatusCode::kPermissionDenied);
  EXPECT_EQ(Subprocess::Run({}, dir.File("x.log"), 5s).status().code(),
            StatusCode::kInvalidArgument);
  // exec fails in the child: exit code 127, like a shell's "command not found".
  EXPECT_EQ(*Subprocess::Run({"/nonexistent/program"}, dir.File("x.log"), 5s), 127);
}

TEST(FindProgram, SearchesPath) {
  const char* saved = std::getenv("PATH");
  const std::string old = saved != nullptr ? saved : "";
  ::setenv("PATH", "/nonexistent:/bin", 1);
  EXPECT_EQ(FindProgram("sh"), "/bin/sh");
  EXPECT_EQ(FindProgram("no-such-program-here"), "");
  EXPECT_EQ(FindProgram("../bin/sh"), "");  // a name, not a path
  EXPECT_EQ(FindProgram(""), "");
  ::setenv("PATH", old.c_str(), 1);
}

}  // namespace
}  // namespace colony
