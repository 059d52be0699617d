// bench/loadgen/report.cc — see report.h.
#include "bench/loadgen/report.h"

#include <boost/json.hpp>
#include <cstdio>

namespace idem::bench {

namespace json = boost::json;

namespace {

constexpr double kNsPerMs = 1e6;
constexpr double kNsPerUs = 1e3;

struct Quantile {
  const char* name;  // for the table
  const char* key;   // for the JSON
  double q;
};
constexpr Quantile kQuantiles[] = {{"p50", "p50", 0.5},
                                   {"p90", "p90", 0.9},
                                   {"p99", "p99", 0.99},
                                   {"p99.9", "p99_9", 0.999},
                                   {"p99.99", "p99_99", 0.9999}};

std::string Printf(const char* format, double value) {
  char buffer[64];
  std::snprintf(buffer, sizeof buffer, format, value);
  return buffer;
}

// Milliseconds with three significant-ish digits: 0.412, 2.31, 21.4, 1530.
std::string Ms(uint64_t ns) {
  const double ms = static_cast<double>(ns) / kNsPerMs;
  if (ms < 1) return Printf("%.3f", ms);
  if (ms < 10) return Printf("%.2f", ms);
  if (ms < 100) return Printf("%.1f", ms);
  return Printf("%.0f", ms);
}

std::string LatencyLine(const LatencyHistogram& h) {
  std::string line = "min " + Ms(h.Min());
  for (const Quantile& q : kQuantiles)
    line += "  " + std::string(q.name) + " " + Ms(h.ValueAtQuantile(q.q));
  line += "  max " + Ms(h.Max()) + "  mean " + Ms(static_cast<uint64_t>(h.Mean()));
  return line;
}

uint64_t Errors(const Figures& f) {
  uint64_t n = 0;
  for (const auto& [status, count] : f.statuses) {
    if (status != 200 && status != 201) n += count;
  }
  for (const auto& [error, count] : f.transport_errors) n += count;
  return n;
}

json::object LatencyJson(const LatencyHistogram& h) {
  const auto us = [](uint64_t ns) { return static_cast<double>(ns) / kNsPerUs; };
  json::object o{{"count", h.Count()},
                 {"min", us(h.Min())},
                 {"mean", h.Mean() / kNsPerUs},
                 {"max", us(h.Max())},
                 {"clamped", h.Clamped()}};
  for (const Quantile& q : kQuantiles) o[q.key] = us(h.ValueAtQuantile(q.q));
  // The histogram itself (non-empty buckets), so a report can draw the whole distribution or
  // merge runs: [lowest µs, highest µs, count].
  json::array buckets;
  h.ForEachBucket([&](uint64_t low, uint64_t high, uint64_t count) {
    buckets.emplace_back(json::array{us(low), us(high), count});
  });
  o["buckets"] = std::move(buckets);
  return o;
}

}  // namespace

uint64_t Succeeded(const Figures& f) {
  uint64_t n = 0;
  for (const auto& [status, count] : f.statuses) {
    if (status == 200 || status == 201) n += count;
  }
  return n;
}

std::string FormatCheck(const CheckResult& c) {
  std::string out = "exactly-once   " + std::to_string(c.intents) + " intents, " +
                    std::to_string(c.succeeded) + " succeeded, " + std::to_string(c.unresolved) +
                    " without a final answer; " + std::to_string(c.charges_checked) +
                    " payments checked against the provider\n";
  if (c.pass) {
    return out +
           "PASS: every intent that succeeded got one payment id, the same answer on every copy "
           "and exactly one charge; no other charge was made\n";
  }
  std::string why;
  const auto add = [&why](uint64_t n, const char* what) {
    if (n > 0) why += (why.empty() ? "" : "; ") + std::string(what) + ": " + std::to_string(n);
  };
  add(c.duplicate_charges, "payments charged more than once");
  add(c.missing_charges, "successes never charged");
  add(c.unexpected_charges, "charges no success accounts for");
  add(c.split_intents, "intents answered with two payment ids");
  add(c.shared_payment_ids, "payment ids answered to two intents");
  add(c.multiple_executions, "intents executed twice");
  add(c.body_mismatches, "successes that differ from their first");
  add(c.replay_violations, "retries that were not replays");
  if (c.succeeded == 0) why += std::string(why.empty() ? "" : "; ") + "nothing succeeded";
  out += "FAIL: " + why + "\n";
  for (const std::string& f : c.failures) out += "  - " + f + "\n";
  return out;
}

std::string FormatTable(const Report& r) {
  const Options& o = *r.options;
  const Figures& f = r.figures;
  const Totals& t = r.totals;
  std::string out;
  out += "idem-bench     scenario " + std::string(ScenarioName(o.scenario)) + ", " +
         (o.rate > 0 ? "open loop at " + Printf("%g", o.rate) + " requests/s" : "closed loop") +
         ", " + std::to_string(o.connections) + " connections, " + std::to_string(o.threads) +
         (o.threads == 1 ? " thread" : " threads") + ", run " + r.run_id + "\n";
  out += "window         " + Printf("%.2f", t.measured_seconds) + " s measured after " +
         Printf("%g", o.warmup_s) + " s warmup\n";
  out += "requests       " + std::to_string(f.requests) + " = " +
         Printf("%.1f", t.Rps(f.requests)) + "/s";
  if (o.rate > 0) out += " (scheduled " + Printf("%g", o.rate) + "/s)";
  out += ", " + std::to_string(f.replayed) + " answered as replays\n";
  if (o.rate > 0 && t.sending_seconds > t.measured_seconds + 0.05) {
    out += "               behind schedule: the window's requests took " +
           Printf("%.2f", t.sending_seconds) +
           " s to leave; the rate is counted over that, and latency grows with the run\n";
  }
  out += "latency (ms)   " + LatencyLine(f.latency) + "\n";
  if (o.rate > 0) {
    out += "send lag (ms)  " + LatencyLine(f.send_lag) + "\n";
    if (t.missed_slots > 0) {
      out += "               " + std::to_string(t.missed_slots) +
             " scheduled requests never left: every connection was busy until a request timeout "
             "after the window (more --connections, or the server is saturated)\n";
    }
  }
  std::string answers;
  for (const auto& [status, n] : f.statuses) {
    answers += (answers.empty() ? "" : ", ") + std::to_string(status) + ": " + std::to_string(n);
  }
  for (const auto& [error, n] : f.transport_errors) {
    answers += (answers.empty() ? "" : ", ") + error + ": " + std::to_string(n);
  }
  out += "answers        " + (answers.empty() ? std::string("none") : answers) + "\n";
  out += "errors         " + std::to_string(Errors(f)) + " (not 200/201)\n";
  out += "run            " + std::to_string(t.setup_requests) + " setup, " +
         std::to_string(t.main_requests) + " warmup+measured, " +
         std::to_string(t.resolve_requests) + " resolving requests; " + std::to_string(t.connects) +
         " connections opened, " + std::to_string(t.resent) +
         " requests resent on a fresh connection\n";
  if (!r.checked) {
    return out + "exactly-once   not checked (--no-check)\n" +
           (Succeeded(f) > 0 ? std::string() : "FAIL: nothing succeeded\n");
  }
  return out + FormatCheck(r.check);
}

std::string CheckJson(const CheckResult& c) {
  json::array failures;
  for (const std::string& f : c.failures) failures.emplace_back(f);
  return json::serialize(json::object{{"pass", c.pass},
                                      {"intents", c.intents},
                                      {"succeeded", c.succeeded},
                                      {"unresolved", c.unresolved},
                                      {"charges_checked", c.charges_checked},
                                      {"split_intents", c.split_intents},
                                      {"shared_payment_ids", c.shared_payment_ids},
                                      {"multiple_executions", c.multiple_executions},
                                      {"body_mismatches", c.body_mismatches},
                                      {"missing_charges", c.missing_charges},
                                      {"duplicate_charges", c.duplicate_charges},
                                      {"unexpected_charges", c.unexpected_charges},
                                      {"replay_violations", c.replay_violations},
                                      {"failures", std::move(failures)}});
}

std::string ReportJson(const Report& r) {
  const Options& o = *r.options;
  const Figures& f = r.figures;
  const Totals& t = r.totals;
  json::object statuses;
  for (const auto& [status, n] : f.statuses) statuses[std::to_string(status)] = n;
  json::object transport;
  for (const auto& [error, n] : f.transport_errors) transport[error] = n;
  json::object config{{"scenario", std::string(ScenarioName(o.scenario))},
                      {"url", o.url},
                      {"provider", o.provider},
                      {"loop", o.rate > 0 ? "open" : "closed"},
                      {"rate", o.rate > 0 ? json::value(o.rate) : json::value(nullptr)},
                      {"connections", o.connections},
                      {"threads", o.threads},
                      {"duration_s", o.duration_s},
                      {"warmup_s", o.warmup_s},
                      {"keys", o.keys},
                      {"duplicates_pct", o.duplicates_pct},
                      {"burst", o.burst},
                      {"provider_delay_ms", o.provider_delay_ms},
                      {"timeout_ms", o.timeout_ms},
                      {"resolve_s", o.resolve_s},
                      {"no_check", o.no_check},
                      {"run_id", r.run_id}};
  json::object measured{{"seconds", t.measured_seconds},
                        {"sending_seconds", t.sending_seconds},
                        {"requests", f.requests},
                        {"rps", t.Rps(f.requests)},
                        {"replayed", f.replayed},
                        {"errors", Errors(f)},
                        {"statuses", std::move(statuses)},
                        {"transport_errors", std::move(transport)},
                        {"latency_us", LatencyJson(f.latency)},
                        {"missed_slots", t.missed_slots}};
  if (o.rate > 0) measured["send_lag_us"] = LatencyJson(f.send_lag);
  json::object totals{{"setup_requests", t.setup_requests},
                      {"main_requests", t.main_requests},
                      {"resolve_requests", t.resolve_requests},
                      {"connects", t.connects},
                      {"resent", t.resent},
                      {"replay_violations", t.replay_violations}};
  return json::serialize(json::object{
             {"tool", "idem-bench"},
             {"format", 1},
             {"config", std::move(config)},
             {"measured", std::move(measured)},
             {"totals", std::move(totals)},
             {"check", r.checked ? json::parse(CheckJson(r.check)) : json::value(nullptr)}}) +
         "\n";
}

}  // namespace idem::bench
