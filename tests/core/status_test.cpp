#include "core/status.h"

#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <utility>

namespace colony {
namespace {

TEST(StatusTest, DefaultIsOk) {
  Status st;
  EXPECT_TRUE(st.ok());
  EXPECT_EQ(st.code(), StatusCode::kOk);
  EXPECT_EQ(st.message(), "");
  EXPECT_EQ(st.ToString(), "ok");
  EXPECT_EQ(st, Status::Ok());
}

TEST(StatusTest, ErrorCarriesCodeAndMessage) {
  Status st = DeadlineExceeded("call to /ping timed out after 5 s");
  EXPECT_FALSE(st.ok());
  EXPECT_EQ(st.code(), StatusCode::kDeadlineExceeded);
  EXPECT_EQ(st.message(), "call to /ping timed out after 5 s");
  EXPECT_EQ(st.ToString(), "deadline_exceeded: call to /ping timed out after 5 s");
}

TEST(StatusTest, ToStringWithoutMessageIsJustTheCodeName) {
  EXPECT_EQ(Status(StatusCode::kAborted, "").ToString(), "aborted");
}

TEST(StatusTest, ConvenienceConstructorsSetTheirCodes) {
  EXPECT_EQ(Cancelled("x").code(), StatusCode::kCancelled);
  EXPECT_EQ(InvalidArgument("x").code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(DeadlineExceeded("x").code(), StatusCode::kDeadlineExceeded);
  EXPECT_EQ(NotFound("x").code(), StatusCode::kNotFound);
  EXPECT_EQ(PermissionDenied("x").code(), StatusCode::kPermissionDenied);
  EXPECT_EQ(ResourceExhausted("x").code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(FailedPrecondition("x").code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(Unimplemented("x").code(), StatusCode::kUnimplemented);
  EXPECT_EQ(Internal("x").code(), StatusCode::kInternal);
  EXPECT_EQ(Unavailable("x").code(), StatusCode::kUnavailable);
  EXPECT_EQ(DataLoss("x").code(), StatusCode::kDataLoss);
  EXPECT_EQ(Unauthenticated("x").code(), StatusCode::kUnauthenticated);
  EXPECT_EQ(Closed("x").code(), StatusCode::kClosed);
  EXPECT_EQ(ProtocolError("x").code(), StatusCode::kProtocolError);
}

TEST(StatusTest, CodeNamesAreStableAndDistinct) {
  // These names go on the wire: pin them.
  const std::pair<StatusCode, const char*> kNames[] = {
      {StatusCode::kOk, "ok"},
      {StatusCode::kCancelled, "cancelled"},
      {StatusCode::kUnknown, "unknown"},
      {StatusCode::kInvalidArgument, "invalid_argument"},
      {StatusCode::kDeadlineExceeded, "deadline_exceeded"},
      {StatusCode::kNotFound, "not_found"},
      {StatusCode::kAlreadyExists, "already_exists"},
      {StatusCode::kPermissionDenied, "permission_denied"},
      {StatusCode::kResourceExhausted, "resource_exhausted"},
      {StatusCode::kFailedPrecondition, "failed_precondition"},
      {StatusCode::kAborted, "aborted"},
      {StatusCode::kOutOfRange, "out_of_range"},
      {StatusCode::kUnimplemented, "unimplemented"},
      {StatusCode::kInternal, "internal"},
      {StatusCode::kUnavailable, "unavailable"},
      {StatusCode::kDataLoss, "data_loss"},
      {StatusCode::kUnauthenticated, "unauthenticated"},
      {StatusCode::kClosed, "closed"},
      {StatusCode::kProtocolError, "protocol_error"},
  };
  int expected_value = 0;
  for (const auto& [code, name] : kNames) {
    EXPECT_EQ(static_cast<int>(code), expected_value++) << name;
    EXPECT_EQ(StatusCodeName(code), name);
  }
  EXPECT_EQ(StatusCodeName(static_cast<StatusCode>(999)), "unknown");
}

TEST(StatusTest, WithContextPrefixesMessageAndKeepsCode) {
  Status st = Unavailable("connection refused");
  Status wrapped = st.WithContext("dial /ip4/1.2.3.4/tcp/1");
  EXPECT_EQ(wrapped.code(), StatusCode::kUnavailable);
  EXPECT_EQ(wrapped.message(), "dial /ip4/1.2.3.4/tcp/1: connection refused");
  EXPECT_EQ(st.message(), "connection refused");  // the original is unchanged
  EXPECT_EQ(wrapped.WithContext("join").message(),
            "join: dial /ip4/1.2.3.4/tcp/1: connection refused");
}

TEST(StatusTest, WithContextOnOkStaysOk) {
  Status st = Status::Ok().WithContext("anything");
  EXPECT_TRUE(st.ok());
  EXPECT_EQ(st.message(), "");
}

TEST(StatusTest, Equality) {
  EXPECT_EQ(NotFound("a"), NotFound("a"));
  EXPECT_FALSE(NotFound("a") == NotFound("b"));
  EXPECT_FALSE(NotFound("a") == Internal("a"));
  EXPECT_FALSE(NotFound("a") == Status::Ok());
}

TEST(ResultTest, HoldsValue) {
  Result<int> r = 42;
  ASSERT_TRUE(r.ok());
  EXPECT_TRUE(static_cast<bool>(r));
  EXPECT_EQ(r.value(), 42);
  EXPECT_EQ(*r, 42);
  EXPECT_TRUE(r.status().ok());
  *r = 7;
  EXPECT_EQ(r.value(), 7);
}

TEST(ResultTest, HoldsError) {
  Result<int> r = NotFound("no such peer");
  EXPECT_FALSE(r.ok());
  EXPECT_FALSE(static_cast<bool>(r));
  EXPECT_EQ(r.status().code(), StatusCode::kNotFound);
  EXPECT_EQ(r.status().message(), "no such peer");
}

TEST(ResultTest, DefaultConstructedIsAnUnsetError) {
  Result<int> r;
  EXPECT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kUnknown);
  EXPECT_FALSE(r.status().message().empty());
}

TEST(ResultTest, ArrowAndMoveOut) {
  Result<std::string> r = std::string("hello");
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->size(), 5u);
  std::string s = std::move(r).value();
  EXPECT_EQ(s, "hello");
}

TEST(ResultTest, MoveOnlyValue) {
  Result<std::unique_ptr<int>> r = std::make_unique<int>(5);
  ASSERT_TRUE(r.ok());
  std::unique_ptr<int> p = std::move(r).value();
  ASSERT_NE(p, nullptr);
  EXPECT_EQ(*p, 5);
}

Result<int> ParsePositive(int v) {
  if (v <= 0) return InvalidArgument("not positive: " + std::to_string(v));
  return v;
}

Status Check(bool good) { return good ? Status::Ok() : FailedPrecondition("check failed"); }

Result<int> DoubledPositive(int v, int* reached) {
  COLONY_ASSIGN_OR_RETURN(int x, ParsePositive(v));
  ++*reached;
  return 2 * x;
}

Status TwoChecks(bool first, bool second, int* reached) {
  COLONY_RETURN_IF_ERROR(Check(first));
  ++*reached;
  COLONY_RETURN_IF_ERROR(Check(second));
  ++*reached;
  return Status::Ok();
}

Result<std::unique_ptr<int>> MakeBox(int v) {
  if (v < 0) return InvalidArgument("negative");
  return std::make_unique<int>(v);
}

Result<int> SumOfBoxes(int a, int b) {
  // Two uses in one function (on different lines) and a move-only value.
  COLONY_ASSIGN_OR_RETURN(auto x, MakeBox(a));
  COLONY_ASSIGN_OR_RETURN(auto y, MakeBox(b));
  return *x + *y;
}

TEST(StatusMacrosTest, AssignOrReturnAssignsOnSuccess) {
  int reached = 0;
  Result<int> r = DoubledPositive(21, &reached);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(*r, 42);
  EXPECT_EQ(reached, 1);
}

TEST(StatusMacrosTest, AssignOrReturnPropagatesError) {
  int reached = 0;
  Result<int> r = DoubledPositive(-3, &reached);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status(), InvalidArgument("not positive: -3"));
  EXPECT_EQ(reached, 0);
}

TEST(StatusMacrosTest, AssignOrReturnWithMoveOnlyValues) {
  Result<int> ok = SumOfBoxes(2, 3);
  ASSERT_TRUE(ok.ok());
  EXPECT_EQ(*ok, 5);
  Result<int> bad = SumOfBoxes(2, -1);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().message(), "negative");
}

TEST(StatusMacrosTest, ReturnIfErrorStopsAtFirstError) {
  int reached = 0;
  EXPECT_TRUE(TwoChecks(true, true, &reached).ok());
  EXPECT_EQ(reached, 2);

  reached = 0;
  Status st = TwoChecks(false, true, &reached);
  EXPECT_EQ(st.code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(reached, 0);

  reached = 0;
  st = TwoChecks(true, false, &reached);
  EXPECT_EQ(st.code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(reached, 1);
}

}  // namespace
}  // namespace colony
