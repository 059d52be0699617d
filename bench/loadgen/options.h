// bench/loadgen/options.h — idem-bench's command line: what to run, against what, for how long.
// Parsing is kept apart from the program so a usage error (exit status 2) is decided in one place.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "idem/result.h"

namespace idem::bench {

enum class Scenario {
  kUnique,  // every request a new key and a new merchant order
  kReplay,  // create --keys payments first, then only retry them: every answer must be a replay
  kMix,     // --duplicates percent of requests repeat an earlier intent's key and body
  kBurst,   // --burst identical requests at once, on as many connections, per intent
  kSlow,    // unique, with provider-sim's global `slow` fault (--provider-delay-ms) set meanwhile
};

std::string_view ScenarioName(Scenario scenario);

struct Options {
  std::string url;                                  // idemd, http://host:port
  std::string provider;                             // provider-sim's admin API, http://host:port
  std::string api_key = "dev-acme-alice-7f3c9a1e";  // acme/alice of the development config
  // More than 0: requests spread over this many principals, intent i sending the bearer key
  // api_key + "-" + (i mod principals) (the server must know each: scripts/bench makes them).
  int principals = 0;
  Scenario scenario = Scenario::kUnique;
  int connections = 8;
  int threads = 1;
  double rate = 0;  // requests per second across all connections; 0: closed loop
  double duration_s = 10;
  double warmup_s = 0;
  int keys = 100;               // replay
  int duplicates_pct = 20;      // mix
  int burst = 4;                // burst
  int provider_delay_ms = 100;  // slow
  int timeout_ms = 10000;       // one request: sent and answered within this, else an error
  double resolve_s = 10;        // after the run: retrying intents left without a final answer
  std::string amount = "100.00";
  std::string currency = "CNY";
  std::string json_path;     // every figure, as JSON
  std::string intents_path;  // every intent and what it got, for --check-only
  bool check_only = false;   // no load: the exactly-once check of --intents against --provider
  // Load only: no provider-sim, no retries after the window, no check (for a server that is not
  // idemd, such as the fixed answer scripts/bench measures as the HTTP ceiling).
  bool no_check = false;
  bool help = false;
};

// Errors: kInvalidArgument with a message for the user (exit status 2).
Result<Options> ParseOptions(const std::vector<std::string>& args);

extern const char* const kUsage;

}  // namespace idem::bench
