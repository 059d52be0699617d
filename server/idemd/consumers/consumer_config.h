// server/idemd/consumers/consumer_config.h — the queue consumers from a config file's
// [[consumers]] entries, and back: each entry checked and named in its errors
// ("c.toml:12: [[consumers]] orders: max_attempts: must be ..."). LoadConfig reads them;
// `--check-config` prints them with ConsumerTable.
#pragma once

#include <toml++/toml.h>

#include <string>
#include <vector>

#include "idem/result.h"
#include "server/idemd/consumers/consumer_route.h"

namespace idem::idemd {

// The [[consumers]] entries of `file` (none: no consumers), in the file's order. `origin` is the
// file's path, for the errors. LoadConfig then checks each one's timings (CheckConsumerTiming).
Status ReadConsumers(const toml::table& file, const std::string& origin,
                     std::vector<ConsumerRoute>& out);

// The bounds between a consumer's timings and its target's, once its target's lease and
// retention are known (a payments target's are [idempotency]'s): a consumer whose records would
// expire while the broker may still deliver its message again (retention shorter than
// RedeliveryHorizon), or that would take a message from a consumer still inside its lease, is
// refused, naming the setting to change.
Status CheckConsumerTiming(const ConsumerRoute& consumer, const std::string& origin);

// `consumer` as the [[consumers]] entry ReadConsumers reads back to it, every key included.
toml::table ConsumerTable(const ConsumerRoute& consumer);

}  // namespace idem::idemd
