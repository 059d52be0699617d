// testing/assert_ok.h — gtest assertions on idem::Result. An error fails the one test that met it,
// with the error's message; .value() or * on it would abort the whole test binary (IDEM_CHECK).
#pragma once

#include <gtest/gtest.h>

#include <optional>
#include <utility>

#include "idem/result.h"

// Fails the test fatally (returns from the enclosing void function) unless `expr`, a Result,
// holds a value.
#define IDEM_ASSERT_OK(expr)                                                     \
  do {                                                                           \
    const auto& idem_assert_ok_ = (expr);                                        \
    ASSERT_TRUE(idem_assert_ok_.has_value()) << idem_assert_ok_.error().message; \
  } while (false)

// `IDEM_ASSERT_OK_AND_ASSIGN(auto x, Foo());` declares x from Foo()'s value, or fails the test
// fatally with Foo()'s error. The test-body counterpart of IDEM_ASSIGN_OR_RETURN.
#define IDEM_ASSERT_OK_AND_ASSIGN(lhs, expr) \
  IDEM_ASSERT_OK_AND_ASSIGN_IMPL_(IDEM_CONCAT_(idem_assert_result_, __LINE__), lhs, expr)
#define IDEM_ASSERT_OK_AND_ASSIGN_IMPL_(tmp, lhs, expr) \
  auto tmp = (expr);                                    \
  ASSERT_TRUE(tmp.has_value()) << tmp.error().message;  \
  lhs = std::move(tmp).value()

// The value of `expr`, a Result, or nullopt after failing the test (not fatally, at this line)
// with its error: `EXPECT_EQ(IDEM_VALUE_OF(store->Sweep(100, {})), 2);` fails the test where
// `*store->Sweep(...)` would abort the binary.
#define IDEM_VALUE_OF(expr) ::idem::testing::ValueOf((expr), __FILE__, __LINE__)

namespace idem::testing {

// IDEM_VALUE_OF's work (std::source_location is not there for clang-tidy's clang 14).
template <typename T>
std::optional<T> ValueOf(Result<T> result, const char* file, int line) {
  if (result) return std::move(result).value();
  ADD_FAILURE_AT(file, line) << result.error().message;
  return std::nullopt;
}

}  // namespace idem::testing
