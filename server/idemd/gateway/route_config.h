// server/idemd/gateway/route_config.h — the gateway's routes from a config file's [[routes]]
// entries, and back: each entry checked and named in its errors ("c.toml:12: [[routes]]
// orders.create: timeout_ms: must be ..."), the routes checked against each other and against
// idemd's own paths. LoadConfig reads them; `--check-config` prints them with RouteTable.
#pragma once

#include <toml++/toml.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "idem/result.h"
#include "server/idemd/gateway/routes.h"

namespace idem::idemd {

// Why `name` cannot name a route or a consumer (metrics, logs, records' route ids): "" when it
// can, 1..kMaxRouteNameLength characters of a-z 0-9 . _ -.
std::string RouteNameProblem(const std::string& name);

// "ORIGIN:LINE: [[routes]] NAME: what", kInvalidArgument.
Error BadRoute(const std::string& origin, int64_t line, const std::string& name,
               const std::string& what);

// An upstream's URL as "scheme://host[:port]": http or https, a host, no path, query or user.
Result<std::string> ParseUpstream(const std::string& text);

// A status code as a TOML value holds it: a number, or its three digits in a string (the form an
// IDEMD_ list takes). nullopt for anything else.
std::optional<int64_t> StatusCodeOf(const toml::node& node);

// A list of 5xx statuses that prove `proves` (e.g. "nothing was charged (a 2xx is a charge)"):
// an array of codes 500..599 as StatusCodeOf reads them, each at most once. Errors
// (kInvalidArgument, the message without where it was read): not such an array.
Result<std::vector<int>> FiveHundredsOf(const toml::node& node, std::string_view proves);

// The [[routes]] entries of `file` (none: no routes), in the file's order. `origin` is the
// file's path, for the errors.
Status ReadGatewayRoutes(const toml::table& file, const std::string& origin,
                         std::vector<GatewayRoute>& out);

// `route` as the [[routes]] entry ReadGatewayRoutes reads back to it, every key included.
toml::table RouteTable(const GatewayRoute& route);

// The target of the consumer named `consumer` (its [consumers.target] table `t`): the keys of a
// [[routes]] entry but name, key and match, and request = "METHOD /path" (one path, no {name}
// segment) in place of match. The route's name is the consumer's; its key is always required
// (the message's). Errors: kInvalidArgument, "ORIGIN:LINE: [[consumers]] NAME target: what".
Result<GatewayRoute> ReadConsumerTarget(const toml::table& t, const std::string& origin,
                                        const std::string& consumer);
// `route` as the [consumers.target] table ReadConsumerTarget reads back to it.
toml::table TargetTable(const GatewayRoute& route);

}  // namespace idem::idemd
