// bench/loadgen/driver.cc — the connections, the schedule and the scenarios of idem-bench (see
// driver.h). Each thread runs one Worker: its own io_context (one thread inside), its share of the
// connections and the rate, its own intents and figures, so nothing on the hot path is shared or
// locked; the figures and intents are merged once the threads have joined. Asio and Beast are
// compiled once in the project's HTTP library (BOOST_*_SEPARATE_COMPILATION); only the templates
// used here are instantiated in this file.
#include "bench/loadgen/driver.h"

#include <algorithm>
#include <atomic>
#include <boost/asio/as_tuple.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/asio/write.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/core/string.hpp>
#include <boost/beast/core/tcp_stream.hpp>
#include <boost/beast/http/parser.hpp>
#include <boost/beast/http/read.hpp>
#include <boost/beast/http/string_body.hpp>
#include <charconv>
#include <cmath>
#include <deque>
#include <functional>
#include <optional>
#include <random>
#include <thread>

namespace idem::bench {

namespace {

namespace beast = boost::beast;
namespace bhttp = boost::beast::http;
namespace net = boost::asio;
using tcp = net::ip::tcp;
using SteadyClock = std::chrono::steady_clock;
using TimePoint = SteadyClock::time_point;

constexpr auto kTuple = net::as_tuple(net::use_awaitable);
// A payment answer is a few hundred bytes; anything near this is not one.
constexpr uint64_t kMaxResponseBytes = 1 << 20;
// A connection that could not be opened is tried again after this, not in a tight loop.
constexpr std::chrono::milliseconds kConnectBackoff{100};
// resolve: the pause before retrying an intent whose answer gave no Retry-After, and the most a
// Retry-After may make it wait.
constexpr std::chrono::milliseconds kResolvePause{200};
constexpr std::chrono::milliseconds kMaxResolvePause{2000};

std::atomic<bool> g_stop{false};

enum class Phase { kSetup, kMain, kResolve };

// One intent and the bytes that ask for it: built once, sent as they are on every copy (replay,
// mix and burst repeat them byte for byte).
struct Intent {
  IntentRecord record;
  std::string request;
  std::size_t body_hash = 0;  // of the first success's body
};

struct Outcome {
  int status = 0;          // 0: no answer
  const char* error = "";  // when status == 0: timeout, connect, read, write
  bool replayed = false;   // Idempotent-Replayed: true
  bool keep_alive = true;
  std::string location;
  std::string body;
  std::optional<int> retry_after_s;
};

struct Connection {
  explicit Connection(net::io_context& ioc) : stream(ioc) {}
  beast::tcp_stream stream;
  beast::flat_buffer buffer;
  bool open = false;
  uint64_t exchanges = 0;  // on the current TCP connection
};

// The connections of one burst group and the intent they all send in the current round.
struct Group {
  explicit Group(net::io_context& ioc) : gate(ioc, TimePoint::max()) {}
  std::vector<Connection*> members;
  std::size_t intent = 0;
  uint64_t round = 0;  // 0: none opened yet
  int remaining = 0;   // members still waiting for their answer in this round
  TimePoint start;
  bool done = false;
  // Members wait on it between rounds; cancel() lets them all go at once.
  net::steady_timer gate;
};

std::string PaymentIdOfLocation(std::string_view location) {
  const std::size_t slash = location.rfind('/');
  return std::string(slash == std::string_view::npos ? location : location.substr(slash + 1));
}

class Worker {
 public:
  Worker(const LoadConfig& config, int index, int connections, const tcp::endpoint& endpoint)
      : config_(config),
        index_(index),
        endpoint_(endpoint),
        rng_(config.seed * 1000003 + static_cast<uint64_t>(index)) {
    for (int i = 0; i < connections; ++i) conns_.push_back(std::make_unique<Connection>(ioc_));
    // Everything of a request but its key and body, once.
    const std::string host = config.host + ":" + std::to_string(config.port);
    head_ = "POST " + config.target + " HTTP/1.1\r\nHost: " + host + "\r\nAuthorization: Bearer ";
    tail_ = "\r\nContent-Type: application/json\r\nIdempotency-Key: ";
  }

  Status ConnectAll() {
    std::string failure;
    for (auto& conn : conns_) {
      net::co_spawn(
          ioc_,
          [this, c = conn.get(), &failure]() -> net::awaitable<void> {
            const boost::system::error_code ec = co_await Open(*c);
            if (ec && failure.empty()) failure = ec.message();
          },
          net::detached);
    }
    RunLoop();
    if (!failure.empty()) {
      return MakeError(Errc::kUnavailable, "cannot connect to " + config_.host + ":" +
                                               std::to_string(config_.port) + ": " + failure);
    }
    return Ok();
  }

  void Setup(int count) {
    for (int i = 0; i < count; ++i) NewIntent();
    for (auto& conn : conns_) {
      net::co_spawn(
          ioc_,
          [this, c = conn.get()]() -> net::awaitable<void> {
            while (next_setup_ < intents_.size()) {
              const std::size_t index = next_setup_++;
              co_await Send(*c, index, SteadyClock::now(), Phase::kSetup);
            }
          },
          net::detached);
    }
    RunLoop();
  }

  // How many intents of the setup got no 201, and the statuses they got instead.
  std::pair<uint64_t, std::map<int, uint64_t>> SetupFailures() const {
    std::pair<uint64_t, std::map<int, uint64_t>> out;
    for (const Intent& in : intents_) {
      if (in.record.successes == 0) {
        ++out.first;
        ++out.second[in.record.last_status];
      }
    }
    return out;
  }

  // Requests (bursts, in the burst scenario) are due every `slot_interval_ns` from `first_slot`
  // in the open loop; workers' schedules interleave (the caller offsets `first_slot`).
  void Main(TimePoint first_slot, double slot_interval_ns, TimePoint measure_from, TimePoint end) {
    first_slot_ = first_slot;
    slot_interval_ns_ = slot_interval_ns;
    measure_from_ = measure_from;
    end_ = end;
    if (config_.scenario == Scenario::kBurst) {
      for (std::size_t g = 0; g < conns_.size() / static_cast<std::size_t>(config_.burst); ++g) {
        auto group = std::make_unique<Group>(ioc_);
        for (int m = 0; m < config_.burst; ++m) {
          Connection* c =
              conns_[g * static_cast<std::size_t>(config_.burst) + static_cast<std::size_t>(m)]
                  .get();
          group->members.push_back(c);
          net::co_spawn(ioc_, BurstMember(*group, *c), net::detached);
        }
        net::co_spawn(ioc_, OpenRound(*group), net::detached);
        groups_.push_back(std::move(group));
      }
    } else {
      for (auto& conn : conns_) net::co_spawn(ioc_, MainLoop(*conn), net::detached);
    }
    RunLoop();
    if (slot_interval_ns_ > 0 && end_ > first_slot_) {
      // Slots k with first_slot + k * interval < end were due; those not taken never left.
      const double span = std::chrono::duration<double, std::nano>(end_ - first_slot_).count();
      const auto due = static_cast<uint64_t>(std::ceil(span / slot_interval_ns_));
      const uint64_t per_slot =
          config_.scenario == Scenario::kBurst ? static_cast<uint64_t>(config_.burst) : 1;
      if (due > next_slot_) totals_.missed_slots += (due - next_slot_) * per_slot;
    }
    totals_.measured_seconds =
        std::max(0.0, std::chrono::duration<double>(end_ - measure_from_).count());
    if (slot_interval_ns_ > 0 && last_measured_send_ > measure_from_) {
      totals_.sending_seconds =
          std::chrono::duration<double>(last_measured_send_ - measure_from_).count();
    }
  }

  void Resolve(TimePoint deadline) {
    for (std::size_t i = 0; i < intents_.size(); ++i) {
      if (!intents_[i].record.Final()) resolve_queue_.emplace_back(i, SteadyClock::now());
    }
    if (resolve_queue_.empty()) return;
    for (auto& conn : conns_) net::co_spawn(ioc_, Resolver(*conn, deadline), net::detached);
    RunLoop();
  }

  const std::deque<Intent>& AllIntents() const { return intents_; }
  const Figures& Seen() const { return figures_; }
  const Totals& Counts() const { return totals_; }

 private:
  void RunLoop() {
    ioc_.restart();
    ioc_.run();
  }

  std::size_t NewIntent() {
    Intent in;
    in.record.key = config_.run_id + "-" + std::to_string(index_) + "-" + std::to_string(seq_++);
    const std::string& key = in.record.key;
    const std::string body = "{\"merchant_order_no\":\"" + key + "\",\"amount\":\"" +
                             config_.amount + "\",\"currency\":\"" + config_.currency + "\"}";
    // Every worker's n-th intent goes to the same principal: principals are shared evenly.
    const std::string api_key =
        config_.principals > 0
            ? config_.api_key + "-" + std::to_string((seq_ - 1) % config_.principals)
            : config_.api_key;
    in.request.reserve(head_.size() + api_key.size() + tail_.size() + key.size() + body.size() +
                       40);
    in.request.append(head_).append(api_key).append(tail_).append(key).append(
        "\r\nContent-Length: ");
    in.request.append(std::to_string(body.size())).append("\r\n\r\n").append(body);
    intents_.push_back(std::move(in));
    return intents_.size() - 1;
  }

  // The intent of the next request of the measured phase (not burst: its groups pick their own).
  std::size_t PickIntent() {
    switch (config_.scenario) {
      case Scenario::kReplay:
        return replay_cursor_++ % intents_.size();
      case Scenario::kMix:
        if (!answered_.empty() &&
            std::uniform_int_distribution<int>(0, 99)(rng_) < config_.duplicates_pct) {
          return answered_[std::uniform_int_distribution<std::size_t>(0,
                                                                      answered_.size() - 1)(rng_)];
        }
        return NewIntent();
      default:
        return NewIntent();
    }
  }

  // The time the next request is due, waiting for it if it is ahead; nothing once the window
  // has ended or a stop was asked for.
  //
  // Closed loop: the next request is due now, when the previous answer came back, and latency
  // runs from the send.
  //
  // Open loop: requests are due on a fixed schedule, whether or not answers come back, and
  // latency runs from the time a request was *due*, not from when it could be sent. Measuring
  // from the send (or letting a slow answer delay the next send, as a closed loop does) is
  // "coordinated omission": while the server stalls, the load generator stops asking, so the
  // requests that would have waited out the stall are never sent and never measured, and the
  // percentiles describe a server that never stalled. Here a connection takes the earliest slot
  // nobody took; if every connection is busy when slots fall due they wait, and whoever frees
  // first sends the oldest at once, its latency counting the time it spent waiting.
  net::awaitable<std::optional<TimePoint>> NextSlot() {
    TimePoint now = SteadyClock::now();
    if (g_stop.load(std::memory_order_relaxed) && end_ > now) end_ = now;
    if (slot_interval_ns_ <= 0) {
      // Every connection starts at the common start, not when its thread got going.
      if (now < first_slot_) {
        net::steady_timer timer(ioc_, first_slot_);
        co_await timer.async_wait(kTuple);
        now = SteadyClock::now();
      }
      if (now >= end_) co_return std::nullopt;
      co_return now;
    }
    // Slots that fell due in the window but found no free connection until a request timeout
    // after it are left: such a request would time out anyway, and the run must end. They are
    // counted as missed.
    if (now >= end_ + config_.timeout) co_return std::nullopt;
    const TimePoint at =
        first_slot_ +
        std::chrono::nanoseconds(std::llround(slot_interval_ns_ * static_cast<double>(next_slot_)));
    if (at >= end_) co_return std::nullopt;
    ++next_slot_;
    if (at > now) {
      net::steady_timer timer(ioc_, at);
      co_await timer.async_wait(kTuple);
    }
    co_return at;
  }

  net::awaitable<void> MainLoop(Connection& c) {
    for (;;) {
      const std::optional<TimePoint> due = co_await NextSlot();
      if (!due) co_return;
      const std::size_t index = PickIntent();
      const Outcome outcome = co_await Send(c, index, *due, Phase::kMain);
      if (std::string_view(outcome.error).starts_with("connect")) co_await Pause(kConnectBackoff);
    }
  }

  // A burst member: waits for its group's next round, sends the round's request, and the last of
  // the group to be answered opens the next round.
  net::awaitable<void> BurstMember(Group& g, Connection& c) {
    uint64_t seen = 0;
    for (;;) {
      while (g.round == seen && !g.done) co_await g.gate.async_wait(kTuple);
      if (g.round == seen) co_return;  // done
      seen = g.round;
      co_await Send(c, g.intent, g.start, Phase::kMain);
      if (--g.remaining == 0) co_await OpenRound(g);
    }
  }

  net::awaitable<void> OpenRound(Group& g) {
    const std::optional<TimePoint> due = co_await NextSlot();
    if (due) {
      g.intent = NewIntent();
      g.start = *due;
      g.remaining = static_cast<int>(g.members.size());
      ++g.round;
    } else {
      g.done = true;
    }
    g.gate.cancel();
  }

  net::awaitable<void> Resolver(Connection& c, TimePoint deadline) {
    while (!resolve_queue_.empty()) {
      const std::size_t index = resolve_queue_.front().first;
      const TimePoint not_before = resolve_queue_.front().second;
      resolve_queue_.pop_front();
      if (not_before >= deadline) co_return;
      if (not_before > SteadyClock::now()) {
        net::steady_timer timer(ioc_, not_before);
        co_await timer.async_wait(kTuple);
      }
      const Outcome outcome = co_await Send(c, index, SteadyClock::now(), Phase::kResolve);
      if (!intents_[index].record.Final()) {
        const auto pause = outcome.retry_after_s
                               ? std::min<std::chrono::milliseconds>(
                                     std::chrono::seconds(*outcome.retry_after_s), kMaxResolvePause)
                               : kResolvePause;
        resolve_queue_.emplace_back(index, SteadyClock::now() + pause);
      }
    }
  }

  net::awaitable<void> Pause(std::chrono::milliseconds d) {
    net::steady_timer timer(ioc_, d);
    co_await timer.async_wait(kTuple);
  }

  net::awaitable<boost::system::error_code> Open(Connection& c) {
    c.stream.expires_after(config_.timeout);
    auto [ec] = co_await c.stream.async_connect(endpoint_, kTuple);
    if (ec) {
      Close(c);
      co_return ec;
    }
    // Requests are written whole; Nagle would only hold the next one back.
    boost::system::error_code ignored;
    c.stream.socket().set_option(tcp::no_delay(true), ignored);
    c.open = true;
    c.exchanges = 0;
    c.buffer.clear();
    ++totals_.connects;
    co_return ec;
  }

  static void Close(Connection& c) {
    boost::system::error_code ignored;
    c.stream.socket().shutdown(tcp::socket::shutdown_both, ignored);
    c.stream.close();
    c.open = false;
    c.buffer.clear();
  }

  // One request and its answer on `c`, (re)connecting first if needed.
  net::awaitable<Outcome> Exchange(Connection& c, const std::string& request) {
    Outcome out;
    for (bool first_try = true;; first_try = false) {
      if (!c.open) {
        const boost::system::error_code ec = co_await Open(c);
        if (ec) {
          out.error = ec == beast::error::timeout ? "connect timeout" : "connect";
          co_return out;
        }
      }
      // A kept-alive connection may have been closed by the server while idle (its read
      // timeout); that shows as a failed write or an end of stream with nothing read, and the
      // request is sent once more on a new connection. Safe: it carries its Idempotency-Key.
      const bool reused = c.exchanges > 0;
      c.stream.expires_after(config_.timeout);
      [[maybe_unused]] auto [write_ec, written] =
          co_await net::async_write(c.stream, net::buffer(request), kTuple);
      if (write_ec) {
        Close(c);
        if (reused && first_try && write_ec != beast::error::timeout) {
          ++totals_.resent;
          continue;
        }
        out.error = write_ec == beast::error::timeout ? "timeout" : "write";
        co_return out;
      }
      bhttp::response_parser<bhttp::string_body> parser;
      parser.body_limit(kMaxResponseBytes);
      auto [read_ec, received] = co_await bhttp::async_read(c.stream, c.buffer, parser, kTuple);
      if (read_ec) {
        Close(c);
        const bool nothing_back = received == 0 && (read_ec == bhttp::error::end_of_stream ||
                                                    read_ec == net::error::eof ||
                                                    read_ec == net::error::connection_reset);
        if (reused && first_try && nothing_back) {
          ++totals_.resent;
          continue;
        }
        out.error = read_ec == beast::error::timeout ? "timeout" : "read";
        co_return out;
      }
      ++c.exchanges;
      auto& res = parser.get();
      out.status = static_cast<int>(res.result_int());
      out.keep_alive = res.keep_alive();
      if (auto it = res.find("Idempotent-Replayed"); it != res.end()) {
        out.replayed = beast::iequals(it->value(), "true");
      }
      if (auto it = res.find(bhttp::field::location); it != res.end()) {
        out.location = std::string(it->value());
      }
      if (auto it = res.find(bhttp::field::retry_after); it != res.end()) {
        int seconds = 0;
        const std::string_view v = it->value();
        if (std::from_chars(v.data(), v.data() + v.size(), seconds).ec == std::errc()) {
          out.retry_after_s = seconds;
        }
      }
      out.body = std::move(res.body());
      if (!out.keep_alive) Close(c);
      co_return out;
    }
  }

  // Sends intent `index` on `c` and records what came back. `start`: where its latency is
  // counted from (the scheduled time in the open loop).
  net::awaitable<Outcome> Send(Connection& c, std::size_t index, TimePoint start, Phase phase) {
    // intents_ is a deque: other coroutines may add intents while this one waits, and a deque
    // keeps references to its elements valid when it grows at the end.
    Intent& in = intents_[index];
    ++in.record.sent;
    const TimePoint sent = SteadyClock::now();
    Outcome outcome = co_await Exchange(c, in.request);
    const TimePoint done = SteadyClock::now();
    RecordAnswer(index, outcome, phase);
    switch (phase) {
      case Phase::kSetup:
        ++totals_.setup_requests;
        break;
      case Phase::kResolve:
        ++totals_.resolve_requests;
        break;
      case Phase::kMain:
        ++totals_.main_requests;
        if (start >= measure_from_ && start < end_) {
          last_measured_send_ = std::max(last_measured_send_, sent);
          Count(outcome, std::chrono::nanoseconds(done - start),
                std::chrono::nanoseconds(sent - start));
        }
        break;
    }
    co_return outcome;
  }

  void RecordAnswer(std::size_t index, const Outcome& o, Phase phase) {
    Intent& in = intents_[index];
    IntentRecord& r = in.record;
    r.last_status = o.status;
    if (o.status != 0 && r.answered++ == 0) answered_.push_back(index);
    const bool success = o.status == 200 || o.status == 201;
    if (phase == Phase::kMain && config_.scenario == Scenario::kReplay &&
        !(success && o.replayed)) {
      ++totals_.replay_violations;
    }
    if (!success) return;
    ++r.successes;
    if (!o.replayed) ++r.executions;
    std::string id = PaymentIdOfLocation(o.location);
    const std::size_t hash = std::hash<std::string>{}(o.body);
    if (r.payment_id.empty() && r.successes == 1) {
      // The first success: its body must be this order's payment, the one Location names.
      const std::optional<std::string> named = PaymentIdInBody(o.body, r.key);
      if (!named || (!id.empty() && *named != id)) ++r.body_mismatches;
      if (id.empty() && named) id = *named;
      r.payment_id = std::move(id);
      in.body_hash = hash;
      return;
    }
    if (id != r.payment_id && std::find(r.other_payment_ids.begin(), r.other_payment_ids.end(),
                                        id) == r.other_payment_ids.end()) {
      r.other_payment_ids.push_back(std::move(id));
    }
    if (hash != in.body_hash) ++r.body_mismatches;
  }

  void Count(const Outcome& o, std::chrono::nanoseconds latency, std::chrono::nanoseconds lag) {
    ++figures_.requests;
    figures_.latency.Record(static_cast<uint64_t>(std::max<int64_t>(0, latency.count())));
    if (slot_interval_ns_ > 0) {
      figures_.send_lag.Record(static_cast<uint64_t>(std::max<int64_t>(0, lag.count())));
    }
    if (o.status != 0) {
      ++figures_.statuses[o.status];
    } else {
      ++figures_.transport_errors[o.error];
    }
    if (o.replayed) ++figures_.replayed;
  }

  const LoadConfig& config_;
  const int index_;
  const tcp::endpoint endpoint_;
  net::io_context ioc_{1};
  std::vector<std::unique_ptr<Connection>> conns_;
  std::vector<std::unique_ptr<Group>> groups_;
  std::string head_;  // a request up to its bearer key
  std::string tail_;  // from after the key up to the idempotency key
  std::mt19937_64 rng_;
  std::deque<Intent> intents_;
  std::vector<std::size_t> answered_;  // intents with at least one answer, for mix
  uint64_t seq_ = 0;
  std::size_t next_setup_ = 0;
  std::size_t replay_cursor_ = 0;
  std::deque<std::pair<std::size_t, TimePoint>> resolve_queue_;
  TimePoint first_slot_;
  double slot_interval_ns_ = 0;  // 0: closed loop
  uint64_t next_slot_ = 0;
  TimePoint measure_from_;
  TimePoint end_;
  TimePoint last_measured_send_;
  Figures figures_;
  Totals totals_;
};

}  // namespace

void Figures::Merge(const Figures& other) {
  latency.Merge(other.latency);
  send_lag.Merge(other.send_lag);
  for (const auto& [status, n] : other.statuses) statuses[status] += n;
  for (const auto& [error, n] : other.transport_errors) transport_errors[error] += n;
  requests += other.requests;
  replayed += other.replayed;
}

void Totals::Merge(const Totals& other) {
  setup_requests += other.setup_requests;
  main_requests += other.main_requests;
  resolve_requests += other.resolve_requests;
  connects += other.connects;
  resent += other.resent;
  missed_slots += other.missed_slots;
  replay_violations += other.replay_violations;
  measured_seconds = std::max(measured_seconds, other.measured_seconds);
  sending_seconds = std::max(sending_seconds, other.sending_seconds);
}

double Totals::Rps(uint64_t requests) const {
  const double seconds = std::max(measured_seconds, sending_seconds);
  return seconds > 0 ? static_cast<double>(requests) / seconds : 0;
}

void RequestStop() { g_stop.store(true); }

struct Load::Impl {
  LoadConfig config;
  std::vector<std::unique_ptr<Worker>> workers;

  // Runs f on every worker, each on a thread of its own when there are several.
  template <typename F>
  void OnEach(F f) {
    if (workers.size() == 1) {
      f(*workers[0], 0);
      return;
    }
    std::vector<std::thread> threads;
    for (std::size_t i = 0; i < workers.size(); ++i) {
      threads.emplace_back([&f, this, i] { f(*workers[i], i); });
    }
    for (auto& t : threads) t.join();
  }
};

Load::Load(LoadConfig config) : impl_(std::make_unique<Impl>()) {
  impl_->config = std::move(config);
}
Load::~Load() = default;

Status Load::Connect() {
  const LoadConfig& c = impl_->config;
  net::io_context ioc;
  tcp::resolver resolver(ioc);
  boost::system::error_code ec;
  const auto found = resolver.resolve(c.host, std::to_string(c.port), ec);
  if (ec || found.empty()) {
    return MakeError(Errc::kUnavailable, "cannot resolve " + c.host + ": " + ec.message());
  }
  const tcp::endpoint endpoint = *found.begin();
  // Connections split evenly; in the burst scenario whole groups are split.
  const int unit = c.scenario == Scenario::kBurst ? c.burst : 1;
  const int units = c.connections / unit;
  for (int w = 0; w < c.threads; ++w) {
    const int mine = (units / c.threads + (w < units % c.threads ? 1 : 0)) * unit;
    impl_->workers.push_back(std::make_unique<Worker>(impl_->config, w, mine, endpoint));
  }
  std::vector<Status> results(impl_->workers.size());
  impl_->OnEach([&](Worker& w, std::size_t i) { results[i] = w.ConnectAll(); });
  for (Status& s : results) {
    if (!s) return s;
  }
  return Ok();
}

Status Load::Setup() {
  const LoadConfig& c = impl_->config;
  if (c.scenario != Scenario::kReplay) return Ok();
  const int n = static_cast<int>(impl_->workers.size());
  impl_->OnEach([&](Worker& w, std::size_t i) {
    w.Setup(c.keys / n + (static_cast<int>(i) < c.keys % n ? 1 : 0));
  });
  uint64_t failed = 0;
  std::map<int, uint64_t> statuses;
  for (auto& w : impl_->workers) {
    auto [count, by_status] = w->SetupFailures();
    failed += count;
    for (const auto& [status, k] : by_status) statuses[status] += k;
  }
  if (failed == 0) return Ok();
  std::string what;
  for (const auto& [status, k] : statuses) {
    what += (what.empty() ? "" : ", ") + std::to_string(k) + " x " +
            (status == 0 ? std::string("no answer") : std::to_string(status));
  }
  return MakeError(Errc::kUnavailable, std::to_string(failed) + " of " + std::to_string(c.keys) +
                                           " payments were not created (" + what + ")");
}

void Load::Run() {
  const LoadConfig& c = impl_->config;
  const auto n = static_cast<double>(impl_->workers.size());
  // Open loop: the slot rate of all workers together is the request rate, or the burst rate
  // (rate / burst) in the burst scenario, since one slot sends a whole burst.
  const double slots_per_s =
      c.rate <= 0 ? 0 : (c.scenario == Scenario::kBurst ? c.rate / c.burst : c.rate);
  const double all_interval_ns = slots_per_s > 0 ? 1e9 / slots_per_s : 0;
  // A moment for the threads to start, so the first slots are not late before anyone looked.
  const TimePoint t0 = SteadyClock::now() + std::chrono::milliseconds(20);
  const TimePoint measure_from = t0 + std::chrono::duration_cast<SteadyClock::duration>(
                                          std::chrono::duration<double>(c.warmup_s));
  const TimePoint end = measure_from + std::chrono::duration_cast<SteadyClock::duration>(
                                           std::chrono::duration<double>(c.duration_s));
  impl_->OnEach([&](Worker& w, std::size_t i) {
    // Worker i takes every n-th slot of the common schedule, starting at the i-th.
    const TimePoint first =
        t0 + std::chrono::nanoseconds(std::llround(all_interval_ns * static_cast<double>(i)));
    w.Main(first, all_interval_ns * n, measure_from, end);
  });
}

void Load::Resolve(double seconds) {
  if (seconds <= 0) return;
  const TimePoint deadline = SteadyClock::now() + std::chrono::duration_cast<SteadyClock::duration>(
                                                      std::chrono::duration<double>(seconds));
  impl_->OnEach([&](Worker& w, std::size_t) { w.Resolve(deadline); });
}

Figures Load::MeasuredFigures() const {
  Figures out;
  for (const auto& w : impl_->workers) out.Merge(w->Seen());
  return out;
}

Totals Load::RunTotals() const {
  Totals out;
  for (const auto& w : impl_->workers) out.Merge(w->Counts());
  return out;
}

std::vector<IntentRecord> Load::Intents() const {
  std::vector<IntentRecord> out;
  for (const auto& w : impl_->workers) {
    for (const Intent& in : w->AllIntents()) out.push_back(in.record);
  }
  return out;
}

}  // namespace idem::bench
