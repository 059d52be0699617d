// bench/loadgen/main.cc — idem-bench: load for idemd's POST /v1/payments that measures latency
// honestly (open loop from the scheduled time, or closed loop), then checks exactly-once against
// provider-sim's books. docs/testing.md says how to run it and what the check means.
//
// The order of a run: the provider's charges before anything is sent (the baseline: earlier
// charges are not this run's), the connections, the scenario's setup (replay: its payments), the
// fault (slow), the warmup and the measured window, the fault cleared, the retries of intents left
// without a final answer, the provider's charges again, and the check.
#include <csignal>
#include <cstdio>
#include <fstream>
#include <random>
#include <sstream>

#include "bench/loadgen/check.h"
#include "bench/loadgen/driver.h"
#include "bench/loadgen/options.h"
#include "bench/loadgen/report.h"
#include "http/client.h"

namespace {

using namespace idem;
using namespace idem::bench;

constexpr int kExitFail = 1;
constexpr int kExitUsage = 2;

Result<ChargeCounts> ProviderCharges(const http::Url& provider) {
  http::CallOptions options;
  options.timeout = Millis(60000);
  // One entry per charge ever made: a long run's stats are many megabytes.
  options.max_response_bytes = std::size_t{1} << 30;
  auto r = http::Call(provider, http::Request{"GET", provider.base_path + "/admin/stats", {}, {}},
                      options);
  if (!r) return r.error();
  if (r->status != 200) {
    return MakeError(Errc::kUnavailable,
                     "GET /admin/stats answered " + std::to_string(r->status) + ": " + r->body);
  }
  return ParseProviderStats(r->body);
}

Status PostFault(const http::Url& provider, const std::string& body) {
  http::Request request{"POST", provider.base_path + "/admin/faults", {}, body};
  request.headers.Set("Content-Type", "application/json");
  auto r = http::Call(provider, std::move(request));
  if (!r) return r.error();
  if (r->status != 200) {
    return MakeError(Errc::kUnavailable,
                     "POST /admin/faults answered " + std::to_string(r->status) + ": " + r->body);
  }
  return Ok();
}

// The slow scenario's provider fault, cleared however the run ends. Only the global fault is
// touched ("none" without a reference), not faults someone set for single references.
class GlobalFault {
 public:
  explicit GlobalFault(const http::Url& provider) : provider_(provider) {}
  ~GlobalFault() { Clear(); }
  GlobalFault(const GlobalFault&) = delete;
  GlobalFault& operator=(const GlobalFault&) = delete;

  Status Set(const std::string& body) {
    Status s = PostFault(provider_, body);
    set_ = s.has_value();
    return s;
  }
  void Clear() {
    if (!set_) return;
    set_ = false;
    if (Status s = PostFault(provider_, R"({"fault":"none"})"); !s) {
      std::fprintf(stderr, "idem-bench: could not clear the provider's fault: %s\n",
                   s.error().message.c_str());
    }
  }

 private:
  const http::Url& provider_;
  bool set_ = false;
};

bool WriteFile(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << text;
  out.close();
  if (!out) std::fprintf(stderr, "idem-bench: cannot write %s\n", path.c_str());
  return static_cast<bool>(out);
}

std::string RunId() {
  std::random_device device;
  char id[16];
  std::snprintf(id, sizeof id, "lg%08x", static_cast<unsigned>(device()));
  return id;
}

void OnInterrupt(int) {
  RequestStop();
  // A second Ctrl-C ends the process at once.
  std::signal(SIGINT, SIG_DFL);
}

int CheckOnly(const Options& options, const http::Url& provider) {
  std::ifstream in(options.intents_path, std::ios::binary);
  if (!in) {
    std::fprintf(stderr, "idem-bench: cannot read %s\n", options.intents_path.c_str());
    return kExitUsage;
  }
  std::stringstream text;
  text << in.rdbuf();
  auto file = IntentsFromJson(text.str());
  if (!file) {
    std::fprintf(stderr, "idem-bench: %s: %s\n", options.intents_path.c_str(),
                 file.error().message.c_str());
    return kExitUsage;
  }
  auto charges = ProviderCharges(provider);
  if (!charges) {
    std::fprintf(stderr, "idem-bench: provider stats: %s\n", charges.error().message.c_str());
    return kExitFail;
  }
  const CheckResult check =
      CheckExactlyOnce(file->intents, file->provider_before, *charges, file->replay_violations);
  std::fputs(FormatCheck(check).c_str(), stdout);
  if (!options.json_path.empty() && !WriteFile(options.json_path, CheckJson(check) + "\n")) {
    return kExitFail;
  }
  return check.pass ? 0 : kExitFail;
}

int Run(const Options& options) {
  // --no-check may run without a provider (then the slow scenario is refused by ParseOptions).
  Result<http::Url> provider = MakeError(Errc::kInvalidArgument, "no --provider");
  if (!options.provider.empty() || !options.no_check) {
    provider = http::ParseHttpUrl(options.provider);
    if (!provider) {
      std::fprintf(stderr, "idem-bench: --provider: %s\n", provider.error().message.c_str());
      return kExitUsage;
    }
  }
  if (options.check_only) return CheckOnly(options, *provider);
  auto target = http::ParseHttpUrl(options.url);
  if (!target) {
    std::fprintf(stderr, "idem-bench: --url: %s\n", target.error().message.c_str());
    return kExitUsage;
  }

  ChargeCounts before;
  if (!options.no_check) {
    auto charges = ProviderCharges(*provider);
    if (!charges) {
      std::fprintf(stderr, "idem-bench: provider stats: %s\n", charges.error().message.c_str());
      return kExitFail;
    }
    before = std::move(*charges);
  }
  const std::string run_id = RunId();
  LoadConfig config;
  config.scenario = options.scenario;
  config.host = target->host;
  config.port = target->port;
  config.target = target->base_path + "/v1/payments";
  config.api_key = options.api_key;
  config.principals = options.principals;
  config.amount = options.amount;
  config.currency = options.currency;
  config.connections = options.connections;
  config.threads = options.threads;
  config.rate = options.rate;
  config.duration_s = options.duration_s;
  config.warmup_s = options.warmup_s;
  config.keys = options.keys;
  config.duplicates_pct = options.duplicates_pct;
  config.burst = options.burst;
  config.timeout = Millis(options.timeout_ms);
  config.run_id = run_id;
  config.seed = std::random_device{}();

  std::signal(SIGINT, OnInterrupt);
  Load load(config);
  if (Status s = load.Connect(); !s) {
    std::fprintf(stderr, "idem-bench: %s\n", s.error().message.c_str());
    return kExitFail;
  }
  if (Status s = load.Setup(); !s) {
    std::fprintf(stderr, "idem-bench: replay setup: %s\n", s.error().message.c_str());
    return kExitFail;
  }
  // Unused (never set) when there is no provider: only slow sets a fault, and it needs one.
  const http::Url no_provider;
  GlobalFault fault(provider ? *provider : no_provider);
  if (options.scenario == Scenario::kSlow) {
    const std::string body =
        R"({"fault":"slow","delay_ms":)" + std::to_string(options.provider_delay_ms) + "}";
    if (Status s = fault.Set(body); !s) {
      std::fprintf(stderr, "idem-bench: setting the slow fault: %s\n", s.error().message.c_str());
      return kExitFail;
    }
  }
  load.Run();
  // Retries after the window are the client finishing its business, not part of the scenario.
  fault.Clear();
  Report report;
  report.options = &options;
  report.run_id = run_id;
  if (options.no_check) {
    report.figures = load.MeasuredFigures();
    report.totals = load.RunTotals();
    report.checked = false;
    std::fputs(FormatTable(report).c_str(), stdout);
    const bool written =
        options.json_path.empty() || WriteFile(options.json_path, ReportJson(report));
    return Succeeded(report.figures) > 0 && written ? 0 : kExitFail;
  }
  load.Resolve(options.resolve_s);

  auto after = ProviderCharges(*provider);
  if (!after) {
    std::fprintf(stderr, "idem-bench: provider stats: %s\n", after.error().message.c_str());
    return kExitFail;
  }
  report.figures = load.MeasuredFigures();
  report.totals = load.RunTotals();
  IntentsFile intents{before, report.totals.replay_violations, load.Intents()};
  report.check =
      CheckExactlyOnce(intents.intents, intents.provider_before, *after, intents.replay_violations);
  std::fputs(FormatTable(report).c_str(), stdout);
  bool written = true;
  if (!options.json_path.empty()) written &= WriteFile(options.json_path, ReportJson(report));
  if (!options.intents_path.empty()) {
    written &= WriteFile(options.intents_path, IntentsToJson(intents));
  }
  return report.check.pass && written ? 0 : kExitFail;
}

}  // namespace

int main(int argc, char** argv) {
  const std::vector<std::string> args(argv + 1, argv + argc);
  auto options = idem::bench::ParseOptions(args);
  if (!options) {
    std::fprintf(stderr, "idem-bench: %s\n\n%s", options.error().message.c_str(),
                 idem::bench::kUsage);
    return kExitUsage;
  }
  if (options->help) {
    std::fputs(idem::bench::kUsage, stdout);
    return 0;
  }
  return Run(*options);
}
