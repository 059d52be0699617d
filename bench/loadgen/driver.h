// bench/loadgen/driver.h — the load itself: keep-alive HTTP/1.1 connections on C++20 coroutines,
// closed or open loop, the scenarios' choice of intents, and what came back. Asio and Beast stay
// in driver.cc; nothing here includes them.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "bench/loadgen/check.h"
#include "bench/loadgen/histogram.h"
#include "bench/loadgen/options.h"
#include "idem/result.h"

namespace idem::bench {

struct LoadConfig {
  Scenario scenario = Scenario::kUnique;
  std::string host;
  uint16_t port = 0;
  std::string target = "/v1/payments";
  std::string api_key;
  int principals = 0;  // > 0: intent i sends api_key + "-" + (i mod principals)
  std::string amount;
  std::string currency;
  int connections = 1;
  int threads = 1;
  double rate = 0;  // requests per second in all; 0: closed loop
  double duration_s = 1;
  double warmup_s = 0;
  int keys = 1;
  int duplicates_pct = 0;
  int burst = 2;
  std::chrono::milliseconds timeout{10000};
  std::string run_id;  // starts every key and merchant order of this run
  uint64_t seed = 1;   // the mix scenario's choices
};

// What the measured window (after the warmup) saw.
struct Figures {
  LatencyHistogram latency;   // ns; open loop: from the scheduled time, closed: from the send
  LatencyHistogram send_lag;  // open loop: how late each request left after its scheduled time
  std::map<int, uint64_t> statuses;                  // HTTP status -> answers
  std::map<std::string, uint64_t> transport_errors;  // timeout, connect, read, write
  uint64_t requests = 0;                             // answered or failed
  uint64_t replayed = 0;                             // answers marked Idempotent-Replayed: true
  void Merge(const Figures& other);
};

// Every phase's counts, the measured window's length, and the run's own health.
struct Totals {
  uint64_t setup_requests = 0;
  uint64_t main_requests = 0;  // warmup and measured
  uint64_t resolve_requests = 0;
  uint64_t connects = 0;  // TCP connections opened, the first ones included
  // Requests sent again, once, on a new connection because a kept-alive one was found closed
  // with nothing read back (the server's idle timeout): safe, they carry their key.
  uint64_t resent = 0;
  // Open loop: requests scheduled in the window that never left: every connection stayed busy
  // until a request timeout after the window. Their latency is unknown, and at least that.
  uint64_t missed_slots = 0;
  uint64_t replay_violations = 0;  // replay: retries not answered 200/201 + Idempotent-Replayed
  double measured_seconds = 0;     // the window: --duration, or less after a stop
  // Open loop: from the window's start until the last of its requests left. Longer than the
  // window when the server fell behind the schedule; the throughput is counted over this.
  double sending_seconds = 0;
  // Requests per second: the measured requests over the window, or over the time they took to
  // leave when that was longer (an open loop the server could not keep up with).
  double Rps(uint64_t requests) const;
  void Merge(const Totals& other);
};

class Load {
 public:
  explicit Load(LoadConfig config);
  ~Load();
  Load(const Load&) = delete;
  Load& operator=(const Load&) = delete;

  // Opens every connection. Errors: kUnavailable when the target does not accept them.
  Status Connect();
  // replay: creates config.keys payments, not measured. Errors: kUnavailable when one of them
  // did not get a 201.
  Status Setup();
  // The warmup and the measured window.
  void Run();
  // Retries, with their key and body, the intents left without a final answer (a transport
  // error, 409, 429, 5xx) until each has one or `seconds` have passed.
  void Resolve(double seconds);

  Figures MeasuredFigures() const;
  Totals RunTotals() const;
  std::vector<IntentRecord> Intents() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Ends the measured window early (SIGINT): what was measured so far is reported and checked.
void RequestStop();

}  // namespace idem::bench
