// server/idemd/routes.h — idemd's own routes, in one table: the probes, the metrics, the payments
// API and the operations' status URLs. The service matches them before any gateway route, the
// config refuses a gateway route that could match one of them, and their paths, labels and route
// ids are written here and nowhere else.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace idem::idemd {

// POST /v1/payments. Stored (hashed) in every payment record's scope: never change it.
inline constexpr std::string_view kPaymentsCreateRoute = "payments.create";

enum class OwnRoute : uint8_t {
  kHealthz,
  kReadyz,
  kMetrics,
  kPaymentsCreate,       // POST /v1/payments
  kPaymentEventsReplay,  // POST /v1/payments/{id}/events/replay
  kPaymentEvents,        // GET /v1/payments/{id}/events
  kPaymentGet,           // GET /v1/payments/{id}
  kOperationGet,         // GET /v1/operations/{key}[?route=NAME]
};

struct OwnRouteEntry {
  OwnRoute route;
  // As a gateway route's `match` writes a path; a last segment "{name}" takes the rest of the
  // path, at least one byte; a "{name}" segment before fixed ones takes one segment (no '/'),
  // at least one byte.
  std::string_view pattern;
  std::string_view label;  // the route label of metrics and logs
};

inline constexpr std::array<OwnRouteEntry, 8> kOwnRoutes{{
    {OwnRoute::kHealthz, "/healthz", "healthz"},
    {OwnRoute::kReadyz, "/readyz", "readyz"},
    {OwnRoute::kMetrics, "/metrics", "metrics"},
    {OwnRoute::kPaymentsCreate, "/v1/payments", kPaymentsCreateRoute},
    {OwnRoute::kPaymentEventsReplay, "/v1/payments/{id}/events/replay", "payments.events.replay"},
    {OwnRoute::kPaymentEvents, "/v1/payments/{id}/events", "payments.events"},
    {OwnRoute::kPaymentGet, "/v1/payments/{id}", "payments.get"},
    {OwnRoute::kOperationGet, "/v1/operations/{key}", "operations.get"},
}};

// An entry's pattern up to its "{name}" segment ("/v1/payments/"), or all of it.
constexpr std::string_view FixedPart(const OwnRouteEntry& entry) {
  return entry.pattern.substr(0, entry.pattern.find('{'));
}

constexpr const OwnRouteEntry& Entry(OwnRoute route) {
  return kOwnRoutes[static_cast<std::size_t>(route)];
}

// What a path names among idemd's own routes: the route, and its {id} or {key} (empty for the
// others). nullopt for any other path.
struct OwnMatch {
  const OwnRouteEntry* entry;
  std::string_view id;
};
constexpr std::optional<OwnMatch> MatchOwnRoute(std::string_view path) {
  for (const OwnRouteEntry& entry : kOwnRoutes) {
    const std::string_view fixed = FixedPart(entry);
    if (fixed.size() == entry.pattern.size()) {
      if (path == fixed) return OwnMatch{&entry, {}};
      continue;
    }
    // What follows the "{name}" segment: nothing (it takes the rest), or fixed segments.
    const std::string_view after = entry.pattern.substr(entry.pattern.find('}') + 1);
    if (path.size() <= fixed.size() + after.size() || path.substr(0, fixed.size()) != fixed ||
        path.substr(path.size() - after.size()) != after) {
      continue;
    }
    const std::string_view id =
        path.substr(fixed.size(), path.size() - fixed.size() - after.size());
    if (after.empty() || id.find('/') == std::string_view::npos) return OwnMatch{&entry, id};
  }
  return std::nullopt;
}

// The URL path of payment `id`, and the prefix of an operation's status URL (its key follows).
inline std::string PaymentPath(std::string_view id) {
  return std::string(FixedPart(Entry(OwnRoute::kPaymentGet))) + std::string(id);
}
inline constexpr std::string_view kOperationsPrefix = FixedPart(Entry(OwnRoute::kOperationGet));

constexpr bool InEnumOrder() {
  for (std::size_t i = 0; i < kOwnRoutes.size(); ++i) {
    if (static_cast<std::size_t>(kOwnRoutes[i].route) != i) return false;
  }
  return true;
}
static_assert(InEnumOrder(), "kOwnRoutes is in the order of OwnRoute");

}  // namespace idem::idemd
