// server/idemd/problems.cc — the table of idemd's product problems.
#include "server/idemd/problems.h"

#include <cstdlib>
#include <string>

#include "http/log.h"

namespace idem::idemd {
namespace {

// Retry-After seconds and Idempotency-Key-Expires, spelled out in the table's rows.
constexpr int kNoRetry = 0;
constexpr int kRetry1s = 1;
constexpr bool kExpires = true;

}  // namespace

// One case per kind and no default, so a kind without a row does not compile (-Wswitch).
http::ProblemSpec Spec(ProductProblem kind) {
  using K = ProductProblem;
  switch (kind) {
    // {status, type, title, Retry-After seconds, carries Idempotency-Key-Expires}
    case K::kPaymentDeclined:
      return {402, "urn:idem:problem:payment-declined", "Payment Required", kNoRetry, kExpires};
    case K::kProviderUnavailable:
      return {503, "urn:idem:problem:provider-unavailable", "Service Unavailable", kRetry1s,
              kExpires};
    case K::kProviderTimeout:
      return {504, "urn:idem:problem:provider-timeout", "Gateway Timeout", kNoRetry, kExpires};
    case K::kOrderInProgress:
      return {409, "urn:idem:problem:order-in-progress", "Conflict", kRetry1s, kExpires};
    case K::kOrderConflict:
      return {409, "urn:idem:problem:order-conflict", "Conflict", kNoRetry, kExpires};

    case K::kUpstreamUnavailable:
      return {502, "urn:idem:problem:upstream-unavailable", "Bad Gateway", kRetry1s, kExpires};
    case K::kUpstreamTimeout:
      return {504, "urn:idem:problem:upstream-timeout", "Gateway Timeout", kNoRetry, kExpires};
    case K::kUpstreamFailed:
      return {502, "urn:idem:problem:upstream-failed", "Bad Gateway", kNoRetry, kExpires};
    case K::kUpstreamOutcomeUnknown:
      return {502, "urn:idem:problem:upstream-outcome-unknown", "Bad Gateway", kNoRetry, kExpires};
  }
  http::Log(http::LogLevel::kError,
            "problems.cc: " + std::to_string(static_cast<int>(kind)) + " is no ProductProblem");
  std::abort();
}

http::Response Problem(ProductProblem kind, std::string_view detail,
                       const http::ProblemOptions& options) {
  return http::Problem(Spec(kind), detail, options);
}

}  // namespace idem::idemd
