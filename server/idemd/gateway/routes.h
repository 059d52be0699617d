// server/idemd/gateway/routes.h — the gateway's routes ([[routes]] in idemd.toml, docs/gateway.md):
// what each one matches, where it forwards, and how its answers are kept. Read and checked by
// LoadConfig; matched here.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "idem/clock.h"
#include "idem/limits.h"

namespace idem::idemd {

// The header in which a status URL's 2xx answer names the status of the answer it reports
// (docs/gateway.md); without it, the status URL's own status is taken.
inline constexpr std::string_view kOriginalStatusHeader = "original-status";

// Bounds of a route's settings.
inline constexpr std::size_t kMaxGatewayRoutes = 256;
inline constexpr std::size_t kMaxRouteNameLength = 64;
inline constexpr std::size_t kMaxRouteSegments = 32;
inline constexpr std::size_t kMaxRouteListEntries = 64;
// The smallest stored-answer cap a route may set: room for the answer kept instead of one too
// large (answer-too-large).
inline constexpr std::size_t kMinStoredBytes = 1024;

struct GatewayRoute {
  std::string name;     // [a-z0-9._-], unique: metrics, logs, and the records' route id
  std::string method;   // upper case: POST, PUT, PATCH or DELETE
  std::string pattern;  // as written: /v1/orders/{id}/capture
  // The pattern's segments between slashes; nullopt for a {name} segment, which matches any
  // one non-empty segment.
  std::vector<std::optional<std::string>> segments;
  std::string upstream;  // http://host[:port] or https://host[:port], no path
  bool key_required = true;
  // body = "json" (the default): JSON only (415 otherwise), canonicalised for the fingerprint.
  // body = "bytes": any media type, the body counted byte for byte.
  bool json_body = true;
  std::vector<std::string> fingerprint_ignore;    // JSON members left out of the fingerprint
  std::vector<std::string> fingerprint_decimals;  // exact decimals: 10.50 equals "10.5"
  bool success_final = true;                      // "2xx" listed in final_statuses
  std::vector<int> final_statuses;                // replayed; every other status is retryable
  // The upstream's declared semantics: 5xx statuses that prove it did nothing (e.g. 503 from a
  // front that never passed the request on). Any other 5xx that is not final may come from an
  // upstream that acted: its outcome is unknown, as after a timeout (docs/gateway.md).
  std::vector<int> nothing_done_statuses;
  std::vector<std::string> store_headers;  // response headers kept and replayed
  std::string forward_key_header;          // "" sends none
  // The upstream's declared semantics: a repeated request with the same forward_key_header value
  // executes at most once. Only then is a request whose forward's outcome is unknown forwarded
  // again on a route without a status_path; otherwise that outcome is held (final 502).
  bool upstream_deduplicates = false;
  // "" (none), or the upstream's status URL's path and query with one {key}, e.g.
  // "/v1/orders/by-key/{key}": asked (GET, {key} the forwarded key) before a request whose earlier
  // forward's outcome is unknown is forwarded again. 404: the upstream has no such request, and
  // it is forwarded; a 2xx: it ran, and the answer (its status in kOriginalStatusHeader, when
  // sent) is its outcome; anything else: it cannot tell (docs/gateway.md).
  std::string status_path;
  // How long after a forward settled the status URL may go on not telling; then the operation
  // is answered 502 upstream-outcome-unknown, finally, for an operator to settle.
  Millis status_unknown_max{3'600'000};
  // How long after a forward's timeout the upstream may still execute it (a queue in front of
  // its back end, a back end that goes on when its front end gave up). A forward has settled
  // timeout + the lease margin + this after it left: only then is the status URL asked about it,
  // and its "404, never ran" believed.
  Millis late_execution{30'000};
  // A header sent with every question to the status URL ("" none), and the environment variable
  // its value was read from at load. The value is a credential: never printed or logged.
  std::string status_auth_header;
  std::string status_auth_env;
  std::string status_auth_value;
  Millis lease{30000};
  Millis retention{24LL * 3600 * 1000};
  Millis timeout{10000};  // the upstream exchange's deadline
  // The largest answer kept and replayed (status, kept headers and body, encoded), in bytes:
  // kMinStoredBytes..limits::kSealedResponseCeiling. An answer over it finishes the operation
  // with 502 answer-too-large, kept instead, and is never forwarded again.
  std::size_t max_stored_bytes = limits::kSealedResponseMaxBytes;
  int64_t line = 0;  // where its [[routes]] table begins in the file

  // The records' route id: "gw." + name. Part of every record's scope: renaming a route forgets
  // its keys.
  std::string RouteId() const { return "gw." + name; }
};

// The gateway's settings ([gateway] and [[routes]]): what SIGHUP reloads.
struct GatewayConfig {
  std::vector<GatewayRoute> routes;  // in the file's order
  // Requests that match no route and no path of idemd's own: forwarded as they are to
  // `unmatched_upstream` (no protocol, no authentication by idemd), or answered 404.
  bool forward_unmatched = false;
  std::string unmatched_upstream;  // http://host[:port] or https://host[:port]
  Millis unmatched_timeout{10000};
  // "" (the default): a gateway route's principal is the API key's ([[principals]]). Else, the
  // lower-case name of a header set by the user's own authentication layer in front of idemd,
  // which idemd then trusts: its value is the principal (tenant "header").
  std::string principal_header;
  int max_connections = 1024;  // per upstream: each route's pool, and the unmatched one
  std::string ca_file;         // https upstreams: the CAs to trust; empty: the system's
};

// The route `method` and `path` (no query) belong to, or nullptr. Routes never overlap (checked
// at start), so at most one matches.
const GatewayRoute* MatchGatewayRoute(const std::vector<GatewayRoute>& routes,
                                      std::string_view method, std::string_view path);

// The first segment of `path` (a path `route` matches) in a {name} position that a server behind
// idemd could read as other than one plain segment: "." or ".." (also percent-encoded: %2E, any
// case), or one holding an encoded '/' or '\' (%2F, %5C, any case) or a raw '\'. "" when none.
// Forwarded, `POST /v1/orders/../cancel` would match /v1/orders/{id}/cancel and reach /v1/cancel.
std::string_view AmbiguousParameterSegment(const GatewayRoute& route, std::string_view path);

// Whether a request could match both routes.
bool GatewayRoutesOverlap(const GatewayRoute& a, const GatewayRoute& b);

// Parses a route's `match` ("POST /v1/orders/{id}") into method, pattern and segments; an
// error message, or "".
std::string ParseGatewayMatch(std::string_view match, GatewayRoute& route);

// Headers of one hop of a connection, which a proxy never passes on (lower case): Connection and
// the standard headers it governs, Host and Content-Length (the next hop sets its own), and
// Expect (idemd has read the whole body before it forwards).
bool IsHopByHopHeader(std::string_view lower_name);

// Headers that are never stored, replayed or forwarded on a route: hop-by-hop headers,
// credentials, cookies and the client's Idempotency-Key (lower case).
bool IsUnforwardableHeader(std::string_view lower_name);

}  // namespace idem::idemd
