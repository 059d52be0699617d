// bench/loadgen/options.cc — see options.h.
#include "bench/loadgen/options.h"

#include <charconv>
#include <cmath>
#include <functional>
#include <map>
#include <optional>

namespace idem::bench {

const char* const kUsage =
    R"(usage: idem-bench --url http://HOST:PORT --provider http://HOST:PORT [options]
       idem-bench --check-only --intents FILE --provider http://HOST:PORT
       idem-bench --no-check --url http://HOST:PORT [options]

Load for idemd's POST /v1/payments, then the exactly-once check against provider-sim.

  --scenario S          unique (default), replay, mix, burst, slow
  --connections N       keep-alive connections (default 8)
  --threads T           event loops, each with its share of the connections (default 1)
  --rate R              open loop: R requests/s scheduled across all connections, latency
                        measured from each request's scheduled time (default: closed loop)
  --duration S          measured seconds (default 10)
  --warmup S            seconds run first and left out of the figures (default 0)
  --api-key KEY         bearer key (default: acme/alice of the development config)
  --principals N        spread the intents over N principals: intent i sends the key
                        KEY-(i mod N), for a server that knows KEY-0 .. KEY-(N-1)
  --keys K              replay: payments created first, then retried (default 100)
  --duplicates P        mix: percent of requests that repeat an earlier intent (default 20)
  --burst B             burst: identical requests sent at once per intent (default 4)
  --provider-delay-ms D slow: provider-sim's answer delay for every charge (default 100)
  --timeout-ms T        one request's deadline, sending and answer (default 10000)
  --resolve S           after the run, retry intents without a final answer for up to S
                        seconds before checking (default 10; 0: no retries)
  --json FILE           every figure as JSON
  --intents FILE        every intent (key, payment id, answers) as JSON, for --check-only
  --check-only          send nothing: check the intents of --intents against --provider now
  --no-check            load only: no provider-sim (but slow needs it for the fault), no
                        retries after the window, no check; for servers that are not idemd

Exit status: 0 the check passed, 1 it failed (or the run could not be made), 2 usage error.
With --no-check: 0 when a measured request got a 200 or 201, else 1.
)";

std::string_view ScenarioName(Scenario scenario) {
  switch (scenario) {
    case Scenario::kUnique:
      return "unique";
    case Scenario::kReplay:
      return "replay";
    case Scenario::kMix:
      return "mix";
    case Scenario::kBurst:
      return "burst";
    case Scenario::kSlow:
      return "slow";
  }
  return "?";
}

namespace {

Error Usage(const std::string& message) { return MakeError(Errc::kInvalidArgument, message); }

bool ParseInt(std::string_view text, int low, int high, int* out) {
  int value = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc() || end != text.data() + text.size() || value < low || value > high) {
    return false;
  }
  *out = value;
  return true;
}

bool ParseNumber(std::string_view text, double low, double high, double* out) {
  // Seconds and rates may be fractional: --duration 2.5, --rate 0.5.
  double value = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc() || end != text.data() + text.size() || !std::isfinite(value) ||
      value < low || value > high) {
    return false;
  }
  *out = value;
  return true;
}

}  // namespace

Result<Options> ParseOptions(const std::vector<std::string>& args) {
  Options o;
  bool scenario_given = false;
  // Each option that takes a value: how to store it; false for a value out of range.
  const std::map<std::string, std::function<bool(const std::string&)>> valued = {
      {"--url", [&](const std::string& v) { return !(o.url = v).empty(); }},
      {"--provider", [&](const std::string& v) { return !(o.provider = v).empty(); }},
      {"--api-key", [&](const std::string& v) { return !(o.api_key = v).empty(); }},
      {"--principals",
       [&](const std::string& v) { return ParseInt(v, 1, 1'000'000, &o.principals); }},
      {"--scenario",
       [&](const std::string& v) {
         scenario_given = true;
         for (Scenario s : {Scenario::kUnique, Scenario::kReplay, Scenario::kMix, Scenario::kBurst,
                            Scenario::kSlow}) {
           if (v == ScenarioName(s)) {
             o.scenario = s;
             return true;
           }
         }
         return false;
       }},
      {"--connections",
       [&](const std::string& v) { return ParseInt(v, 1, 10000, &o.connections); }},
      {"--threads", [&](const std::string& v) { return ParseInt(v, 1, 64, &o.threads); }},
      {"--rate", [&](const std::string& v) { return ParseNumber(v, 0.001, 1e7, &o.rate); }},
      {"--duration",
       [&](const std::string& v) { return ParseNumber(v, 0.1, 86400, &o.duration_s); }},
      {"--warmup", [&](const std::string& v) { return ParseNumber(v, 0, 86400, &o.warmup_s); }},
      {"--keys", [&](const std::string& v) { return ParseInt(v, 1, 10'000'000, &o.keys); }},
      {"--duplicates",
       [&](const std::string& v) { return ParseInt(v, 0, 100, &o.duplicates_pct); }},
      {"--burst", [&](const std::string& v) { return ParseInt(v, 2, 1000, &o.burst); }},
      {"--provider-delay-ms",
       [&](const std::string& v) { return ParseInt(v, 1, 600'000, &o.provider_delay_ms); }},
      {"--timeout-ms",
       [&](const std::string& v) { return ParseInt(v, 1, 600'000, &o.timeout_ms); }},
      {"--resolve", [&](const std::string& v) { return ParseNumber(v, 0, 3600, &o.resolve_s); }},
      {"--json", [&](const std::string& v) { return !(o.json_path = v).empty(); }},
      {"--intents", [&](const std::string& v) { return !(o.intents_path = v).empty(); }},
  };
  for (std::size_t i = 0; i < args.size(); ++i) {
    std::string name = args[i];
    std::optional<std::string> value;
    if (const std::size_t eq = name.find('='); name.starts_with("--") && eq != std::string::npos) {
      value = name.substr(eq + 1);
      name.resize(eq);
    }
    if (name == "--help" || name == "-h") {
      o.help = true;
      return o;
    }
    if (name == "--check-only" && !value) {
      o.check_only = true;
      continue;
    }
    if (name == "--no-check" && !value) {
      o.no_check = true;
      continue;
    }
    const auto it = valued.find(name);
    if (it == valued.end()) return Usage("unknown option '" + args[i] + "'");
    if (!value) {
      if (i + 1 >= args.size()) return Usage(name + " needs a value");
      value = args[++i];
    }
    if (!it->second(*value)) return Usage("bad value for " + name + ": '" + *value + "'");
  }

  if (o.no_check) {
    if (o.check_only) return Usage("--check-only and --no-check exclude each other");
    if (!o.intents_path.empty()) {
      return Usage("--intents is for a later check: drop it with --no-check");
    }
    if (o.scenario == Scenario::kSlow && o.provider.empty()) {
      return Usage("slow sets provider-sim's fault: it needs --provider, even with --no-check");
    }
  } else if (o.provider.empty()) {
    return Usage("--provider is required: the exactly-once check reads provider-sim's charges");
  }
  if (o.check_only) {
    if (o.intents_path.empty()) return Usage("--check-only reads the intents of --intents FILE");
    if (!o.url.empty() || scenario_given) {
      return Usage("--check-only sends no load: drop --url and --scenario");
    }
    return o;
  }
  if (o.url.empty()) return Usage("--url is required");
  if (o.connections < o.threads) return Usage("--threads may not exceed --connections");
  if (o.scenario == Scenario::kReplay && o.keys < o.threads) {
    return Usage("--keys must be at least --threads (each thread retries its own payments)");
  }
  if (o.scenario == Scenario::kBurst) {
    if (o.connections % o.burst != 0) {
      return Usage("burst: --connections must be a multiple of --burst (" +
                   std::to_string(o.burst) + "), one group of connections per intent");
    }
    if (o.connections / o.burst < o.threads) {
      return Usage("burst: every thread needs a whole group: --connections >= --burst x --threads");
    }
  }
  return o;
}

}  // namespace idem::bench
