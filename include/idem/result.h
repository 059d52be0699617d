// include/idem/result.h — errors as values: Errc, Error and Result<T>.
//
// Every fallible libidem call returns a Result. No exception crosses libidem's public API.
#pragma once

#include <cassert>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>
#include <utility>
#include <variant>

namespace idem {

// The closed set of error codes. Each says when to use it; idemd maps each to one HTTP status
// in exactly one function.
enum class Errc {
  // The caller sent something malformed: a bad key, body, field or parameter. Not retryable.
  kInvalidArgument,
  // A size limit was exceeded (body, stored response, JSON nesting). Not retryable as sent.
  kTooLarge,
  // The thing asked for does not exist, or the caller may not know that it does.
  kNotFound,
  // A unique constraint refused an insert; the caller decides from the existing row.
  kAlreadyExists,
  // The key is known with a different request fingerprint: the caller reused a key wrongly.
  kFingerprintMismatch,
  // A conditional update on owner token and fence matched nothing: this executor lost its lease.
  // Nothing the transaction wrote was committed.
  kFenced,
  // A conditional update saw state it did not expect (another takeover won, state moved on), or
  // a lease the caller still holds ends before the external call it must cover
  // (StoreTxn::AdvanceCovered, Engine::AdvanceBeforeCall). Nothing was written; unlike kFenced
  // the caller has not lost the record, but must not make the call.
  kConflict,
  // A per-principal quota is used up. Retryable later.
  kResourceExhausted,
  // A dependency (the store, a downstream) is busy or unreachable. Retryable.
  kUnavailable,
  // A deadline passed before the operation finished; its outcome may be unknown.
  kDeadlineExceeded,
  // Stored data failed authentication or could not be decoded.
  kDataLoss,
  // A bug or an environment failure that no caller input explains.
  kInternal,
};

// A stable lower-case name for logs and problem types ("invalid_argument", ...).
std::string_view ErrcName(Errc code);

struct Error {
  Errc code;
  std::string message;
};

// Always-on assertion for programmer errors (never for input from the network or a database).
#define IDEM_CHECK(cond)                                                            \
  do {                                                                              \
    if (!(cond)) {                                                                  \
      std::fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, __LINE__, #cond); \
      std::abort();                                                                 \
    }                                                                               \
  } while (false)

// Result<T> holds a T or an Error; spelled like std::expected<T, Error>.
template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : v_(std::in_place_index<0>, std::move(value)) {}  // NOLINT: implicit by design
  Result(Error error) : v_(std::in_place_index<1>, std::move(error)) {}  // NOLINT

  bool has_value() const { return v_.index() == 0; }
  explicit operator bool() const { return has_value(); }

  T& value() & {
    IDEM_CHECK(has_value());
    return std::get<0>(v_);
  }
  const T& value() const& {
    IDEM_CHECK(has_value());
    return std::get<0>(v_);
  }
  T&& value() && {
    IDEM_CHECK(has_value());
    return std::get<0>(std::move(v_));
  }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }
  T&& operator*() && { return std::move(*this).value(); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }

  const Error& error() const& {
    IDEM_CHECK(!has_value());
    return std::get<1>(v_);
  }
  Error&& error() && {
    IDEM_CHECK(!has_value());
    return std::get<1>(std::move(v_));
  }

 private:
  std::variant<T, Error> v_;
};

template <>
class [[nodiscard]] Result<void> {
 public:
  Result() = default;
  Result(Error error) : error_(std::move(error)), ok_(false) {}  // NOLINT

  bool has_value() const { return ok_; }
  explicit operator bool() const { return ok_; }
  void value() const { IDEM_CHECK(ok_); }
  const Error& error() const& {
    IDEM_CHECK(!ok_);
    return error_;
  }
  Error&& error() && {
    IDEM_CHECK(!ok_);
    return std::move(error_);
  }

 private:
  Error error_{Errc::kInternal, {}};
  bool ok_ = true;
};

using Status = Result<void>;

inline Status Ok() { return {}; }

inline Error MakeError(Errc code, std::string message) { return Error{code, std::move(message)}; }

}  // namespace idem

#define IDEM_CONCAT_INNER_(a, b) a##b
#define IDEM_CONCAT_(a, b) IDEM_CONCAT_INNER_(a, b)

// Returns the error of `expr` (a Result) from the enclosing function, if it has one.
#define IDEM_RETURN_IF_ERROR(expr)                                         \
  do {                                                                     \
    auto idem_status_ = (expr);                                            \
    if (!idem_status_.has_value()) return std::move(idem_status_).error(); \
  } while (false)

// `IDEM_ASSIGN_OR_RETURN(auto x, Foo());` declares x from Foo()'s value or returns its error.
#define IDEM_ASSIGN_OR_RETURN(lhs, expr) \
  IDEM_ASSIGN_OR_RETURN_IMPL_(IDEM_CONCAT_(idem_result_, __LINE__), lhs, expr)
#define IDEM_ASSIGN_OR_RETURN_IMPL_(tmp, lhs, expr)    \
  auto tmp = (expr);                                   \
  if (!tmp.has_value()) return std::move(tmp).error(); \
  lhs = std::move(tmp).value()
