// server/idemd/problems.h — the problems idemd's products answer beyond those of the HTTP layer,
// of requests and of the protocol (http/problem.h): payments' and the gateway's, in one closed
// table of their own, built by the same http::Problem.
#pragma once

#include <cstdint>
#include <string_view>

#include "http/problem.h"

namespace idem::idemd {

// Closed like http::ProblemKind: each kind has exactly one row (problems.cc, a switch without a
// default), clients depend on each row's type URI, and no type URI is also http::ProblemKind's.
enum class ProductProblem : uint8_t {
  // Payments.
  kPaymentDeclined,      // the provider declined the charge; final
  kProviderUnavailable,  // the provider is down or failed; retry (an unknown outcome is looked up)
  kProviderTimeout,      // the provider did not answer; retry to learn the outcome
  kOrderInProgress,      // the merchant order is being paid under another key; retry
  kOrderConflict,        // the merchant order is already paid differently

  // Gateway routes.
  kUpstreamUnavailable,  // the upstream could not be reached and nothing was sent; retry
  kUpstreamTimeout,      // the upstream did not answer; retry with the same key to learn more
  // The upstream answered a 5xx that does not prove it did nothing (not in the route's
  // nothing_done_statuses): it may have acted; retry with the same key to learn more.
  kUpstreamFailed,
  // Final: whether a forward executed stays unknown (the route's status URL could not tell for
  // status_unknown_max_ms, or the route has none and no upstream_deduplicates); nothing is
  // forwarded again, and an operator settles the record.
  kUpstreamOutcomeUnknown,

  kLast = kUpstreamOutcomeUnknown,  // keep naming the last kind: tests walk every kind up to it
};

// The row of `kind`. Aborts for a value that is no ProductProblem (a programmer error).
http::ProblemSpec Spec(ProductProblem kind);

// http::Problem on `kind`'s row. Every product problem is about a record, so `options` carries
// its key_expires.
http::Response Problem(ProductProblem kind, std::string_view detail,
                       const http::ProblemOptions& options = {});

}  // namespace idem::idemd
