// testing/services.h — what a test does when a service or a local facility it needs is missing
// (a PostgreSQL or Redis address, a program, a server process on this machine): it is skipped,
// unless IDEM_REQUIRE_SERVICES is set, as scripts/test sets it; then it fails, so that a run
// meant to test everything cannot pass by testing nothing.
#pragma once

#include <gtest/gtest.h>

#include <cstdlib>
#include <string>
#include <string_view>

namespace idem::testing {

// True when IDEM_REQUIRE_SERVICES is set to anything but "" or "0".
inline bool ServicesRequired() {
  const char* value = std::getenv("IDEM_REQUIRE_SERVICES");
  return value != nullptr && std::string_view(value) != "" && std::string_view(value) != "0";
}

// The value of the environment variable `variable` (the address of a service of the tests, set by
// scripts/with-services), or "" when it is not set.
inline std::string ServiceUrl(const std::string& variable) {
  const char* value = std::getenv(variable.c_str());
  return value != nullptr ? value : "";
}

}  // namespace idem::testing

// Skips the test, saying `message` (anything a gtest message takes: "no " << path), or fails it
// fatally when services are required. In a test body, a SetUp or a helper returning void; either
// way it returns from that function only, so the caller of a helper must stop itself: wrap the
// call in ASSERT_NO_FATAL_FAILURE and check IsSkipped(), or have the helper return whether it
// went on.
#define IDEM_SKIP_OR_FAIL(message)                                      \
  do {                                                                  \
    if (::idem::testing::ServicesRequired()) {                          \
      GTEST_FAIL() << message << " (and IDEM_REQUIRE_SERVICES is set)"; \
    }                                                                   \
    GTEST_SKIP() << message;                                            \
  } while (false)

// IDEM_SKIP_OR_FAIL when `url` (a service's address from the environment variable `variable`) is
// empty.
#define IDEM_NEED_SERVICE(url, variable)                               \
  do {                                                                 \
    if ((url).empty()) IDEM_SKIP_OR_FAIL((variable) << " is not set"); \
  } while (false)
