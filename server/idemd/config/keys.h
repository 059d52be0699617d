// server/idemd/config/keys.h — the one table of idemd's config keys: each key's section, name,
// TOML type, bounds and the Config member it sets. Loading, `--check-config`'s printing,
// ConfigKeys() (the unknown-key check, the IDEMD_* overrides, docs/config.md's test) all walk it.
// Keys of [[principals]] and [[routes]] entries are read by their own readers (config.cc,
// gateway/route_config.cc). Internal to the config library (toml++ is not idemd's interface).
#pragma once

#include <toml++/toml.h>

#include <cstdint>
#include <limits>
#include <map>
#include <span>
#include <string>
#include <string_view>

#include "idem/result.h"
#include "server/idemd/config/config.h"

namespace idem::idemd {

// A key's bound "as far as its field goes": the field type's maximum, and for a duration
// kMaxConfigDuration in the duration's unit.
inline constexpr int64_t kFieldMax = std::numeric_limits<int64_t>::max();

struct ConfigKey;

// Sets the key's member of `config` from `node`. `where` is where the value came from ("c.toml:5",
// "IDEMD_STORE_POOL_SIZE"); errors are kInvalidArgument "WHERE: section.key must ...".
using ReadConfigKey = Status (*)(const ConfigKey& key, const toml::node& node,
                                 const std::string& where, Config& config);
// Inserts the key's value in `config` into its section's table, as LoadConfig reads it back.
using WriteConfigKey = void (*)(const ConfigKey& key, const Config& config, toml::table& section);

struct ConfigKey {
  std::string_view section;
  std::string_view key;
  Kind kind;
  // Integers and durations: the value must be min..max (kFieldMax: as far as the field goes).
  int64_t min = 0;
  int64_t max = kFieldMax;
  ReadConfigKey read = nullptr;
  // nullptr: accepted, never printed (another spelling of a printed key, or a removed key read
  // and ignored with a warning).
  WriteConfigKey write = nullptr;

  std::string Name() const { return std::string(section) + "." + std::string(key); }
};

// Every key of every [section], in the order they are read (an alias before the key it spells
// otherwise, which wins when both are set).
std::span<const ConfigKey> ConfigKeyTable();

// Reads every key of the table present in `file` (the IDEMD_* variables already applied; `from_env`
// maps "section.key" to the variable that set it, for the errors) into `config`. Bounds of one key
// are checked here; those between keys are LoadConfig's.
Status ReadConfigKeys(const toml::table& file, const std::string& path,
                      const std::map<std::string, std::string>& from_env, Config& config);

// Every key of the table that is printed, with its value in `config`, into `out` (a table per
// section).
void WriteConfigKeys(const Config& config, toml::table& out);

}  // namespace idem::idemd
