// Status and Result<T>: errors as cheap values across module boundaries.
//
// A Status is OK or carries a code and a human-readable message that names what failed, where,
// and (when possible) what to do about it. Result<T> holds either a T or a non-OK Status.
#pragma once

#include <cassert>
#include <string>
#include <string_view>
#include <utility>
#include <variant>

namespace colony {

enum class StatusCode : int {
  kOk = 0,
  kCancelled = 1,
  kUnknown = 2,
  kInvalidArgument = 3,
  kDeadlineExceeded = 4,
  kNotFound = 5,
  kAlreadyExists = 6,
  kPermissionDenied = 7,
  kResourceExhausted = 8,
  kFailedPrecondition = 9,
  kAborted = 10,
  kOutOfRange = 11,
  kUnimplemented = 12,
  kInternal = 13,
  kUnavailable = 14,
  kDataLoss = 15,
  kUnauthenticated = 16,
  kClosed = 17,         // the connection or object was closed while the operation was pending
  kProtocolError = 18,  // the remote peer violated the wire protocol
};

// Stable lowercase name of a code ("deadline_exceeded"), used in messages and on the wire.
std::string_view StatusCodeName(StatusCode code);

class [[nodiscard]] Status {
 public:
  Status() = default;  // OK
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}

  static Status Ok() { return {}; }

  bool ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }

  // "deadline_exceeded: call to /ping timed out after 5 s"
  std::string ToString() const;

  // Returns a copy whose message is prefixed with `context`: "dial /ip4/..: <message>".
  Status WithContext(std::string_view context) const;

  friend bool operator==(const Status& a, const Status& b) {
    return a.code_ == b.code_ && a.message_ == b.message_;
  }

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

// Convenience constructors.
inline Status Cancelled(std::string m) { return {StatusCode::kCancelled, std::move(m)}; }
inline Status InvalidArgument(std::string m) {
  return {StatusCode::kInvalidArgument, std::move(m)};
}
inline Status DeadlineExceeded(std::string m) {
  return {StatusCode::kDeadlineExceeded, std::move(m)};
}
inline Status NotFound(std::string m) { return {StatusCode::kNotFound, std::move(m)}; }
inline Status AlreadyExists(std::string m) { return {StatusCode::kAlreadyExists, std::move(m)}; }
inline Status PermissionDenied(std::string m) {
  return {StatusCode::kPermissionDenied, std::move(m)};
}
inline Status ResourceExhausted(std::string m) {
  return {StatusCode::kResourceExhausted, std::move(m)};
}
inline Status FailedPrecondition(std::string m) {
  return {StatusCode::kFailedPrecondition, std::move(m)};
}
inline Status Unimplemented(std::string m) { return {StatusCode::kUnimplemented, std::move(m)}; }
inline Status Internal(std::string m) { return {StatusCode::kInternal, std::move(m)}; }
inline Status Unavailable(std::string m) { return {StatusCode::kUnavailable, std::move(m)}; }
inline Status DataLoss(std::string m) { return {StatusCode::kDataLoss, std::move(m)}; }
inline Status Unauthenticated(std::string m) {
  return {StatusCode::kUnauthenticated, std::move(m)};
}
inline Status Closed(std::string m) { return {StatusCode::kClosed, std::move(m)}; }
inline Status ProtocolError(std::string m) { return {StatusCode::kProtocolError, std::move(m)}; }

// Result<T>: a value or an error. Accessing value() of an error is a programming bug (asserts).
template <typename T>
class [[nodiscard]] Result {
 public:
  // An "unset" error result; exists so Result can travel through APIs (asio's co_spawn) that
  // need default-constructible values.
  Result() : v_(Status(StatusCode::kUnknown, "result was never set")) {}
  Result(T value) : v_(std::move(value)) {}        // NOLINT(google-explicit-constructor)
  Result(Status status) : v_(std::move(status)) {  // NOLINT(google-explicit-constructor)
    assert(!std::get<Status>(v_).ok() && "Result constructed from an OK status");
  }

  bool ok() const { return v_.index() == 0; }
  explicit operator bool() const { return ok(); }

  const Status& status() const {
    static const Status kOk;
    return ok() ? kOk : std::get<Status>(v_);
  }
  T& value() & {
    assert(ok());
    return std::get<T>(v_);
  }
  const T& value() const& {
    assert(ok());
    return std::get<T>(v_);
  }
  T&& value() && {
    assert(ok());
    return std::get<T>(std::move(v_));
  }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }

 private:
  std::variant<T, Status> v_;
};

}  // namespace colony

// Propagates a non-OK Status from an expression returning Status.
#define COLONY_RETURN_IF_ERROR(expr) \
  do {                               \
    ::colony::Status _st = (expr);   \
    if (!_st.ok()) return _st;       \
  } while (0)

// The same inside a coroutine.
#define COLONY_CO_RETURN_IF_ERROR(expr) \
  do {                                  \
    ::colony::Status _st = (expr);      \
    if (!_st.ok()) co_return _st;       \
  } while (0)

#define COLONY_CONCAT_INNER(a, b) a##b
#define COLONY_CONCAT(a, b) COLONY_CONCAT_INNER(a, b)
// COLONY_ASSIGN_OR_RETURN(auto x, Foo()); returns Foo()'s status on error.
#define COLONY_ASSIGN_OR_RETURN(lhs, expr) \
  COLONY_ASSIGN_OR_RETURN_IMPL(COLONY_CONCAT(_res_, __LINE__), lhs, expr)
#define COLONY_ASSIGN_OR_RETURN_IMPL(tmp, lhs, expr) \
  auto tmp = (expr);                                 \
  if (!tmp.ok()) return tmp.status();                \
  lhs = std::move(tmp).value()
