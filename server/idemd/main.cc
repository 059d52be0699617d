// server/idemd/main.cc — wires idemd together: config, store, engine, provider, routes, server,
// background loops (sweeper, takeover, books), and a graceful SIGTERM drain. Nothing else.
#include <signal.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <limits>
#include <thread>

#include "http/log.h"
#include "http/server.h"
#include "idem/engine.h"
#include "idem/failpoint.h"
#include "idem/mutex.h"
#include "idem/store/redis.h"
#include "idem/store/replay_cache.h"
#include "idem/thread_name.h"
#include "server/idemd/config/config.h"
#include "server/idemd/config/store_url.h"
#include "server/idemd/consumers/consumers.h"
#include "server/idemd/filter/filter.h"
#include "server/idemd/filter/timed.h"
#include "server/idemd/gateway/gateway.h"
#include "server/idemd/job_lease.h"
#include "server/idemd/metrics.h"
#include "server/idemd/outbox/relay.h"
#include "server/idemd/payments/books.h"
#include "server/idemd/payments/payments.h"
#include "server/idemd/payments/provider.h"
#include "server/idemd/routes.h"
#include "server/idemd/service.h"

namespace {

using namespace idem;
using namespace idem::idemd;

// A start that cannot go on: one error line, exit status 1.
int Fail(const std::string& what) {
  http::Log(http::LogLevel::kError, "idemd cannot start", {{"error", what}});
  return 1;
}

// Runs `work` every `interval` until stopped.
class Loop {
 public:
  Loop(std::string_view name, Millis interval, std::function<void()> work)
      : Loop(name, interval, [work = std::move(work)](Loop&) { work(); }) {}
  // `work` is given the loop, to Rest inside a round.
  Loop(std::string_view name, Millis interval, std::function<void(Loop&)> work)
      : thread_([this, name = std::string(name), interval, work = std::move(work)] {
          NameThisThread(name);
          MutexLock lock(mu_);
          while (!cv_.WaitFor(mu_, interval, [this]() IDEM_REQUIRES(mu_) { return stop_; })) {
            lock.Unlock();
            work(*this);
            lock.Lock();
          }
        }) {}
  // Waits `d` inside a round (the sweeper's rest between batches), or until the loop stops, and
  // says whether the round goes on: false once the loop stops.
  bool Rest(Millis d) {
    MutexLock lock(mu_);
    return !cv_.WaitFor(mu_, d, [this]() IDEM_REQUIRES(mu_) { return stop_; });
  }
  ~Loop() {
    {
      MutexLock lock(mu_);
      stop_ = true;
    }
    cv_.NotifyAll();
    thread_.join();
  }

 private:
  Mutex mu_;
  CondVar cv_;
  bool stop_ IDEM_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

// SIGHUP: reads the config file again and serves its [gateway] and [[routes]] from now on; the
// requests in flight finish on the routes they began on. Every other setting needs a restart. A
// file that does not load, or routes whose pools cannot be made, change nothing. Nor does one
// that points a kept route with PROCESSING records (`store`'s census) at another upstream, status
// URL or key header: the outcome of those records' forwards would be asked of, and forwarded
// again to, a service that never had them. A kept route's fingerprint rules may change: its
// records stay verifiable under theirs (Gateway::Make).
void Reload(const std::string& path, const std::vector<std::string>& overrides,
            const GatewayDeps& deps, Service& service, Store& store) {
  auto fail = [](const std::string& why) {
    http::Log(http::LogLevel::kError, "reload failed; the routes are unchanged", {{"error", why}});
  };
  auto config = LoadConfig(path, overrides);
  if (!config) return fail(config.error().message);
  const std::shared_ptr<const Gateway> current = service.CurrentGateway();
  std::optional<RecordCensus> census;
  for (const GatewayRoute& route : config->gateway.routes) {
    const GatewayEndpoint* kept = current->Named(route.name);
    if (kept == nullptr ||
        (kept->route->upstream == route.upstream && kept->route->status_path == route.status_path &&
         kept->route->forward_key_header == route.forward_key_header)) {
      continue;
    }
    if (!census) {
      auto taken = store.Census();
      if (!taken)
        return fail("the store's census, to check route " + route.name + ": " +
                    taken.error().message);
      census = std::move(*taken);
    }
    auto live = census->processing_by_route.find(route.RouteId());
    if (live != census->processing_by_route.end() && live->second > 0) {
      return fail("route " + route.name + " would change its upstream, status_path or " +
                  "forward_key_header while " + std::to_string(live->second) +
                  " of its operations are PROCESSING; let them finish first, or give the new "
                  "upstream a route of another name (docs/gateway.md)");
    }
  }
  const std::size_t routes = config->gateway.routes.size();
  auto gateway = Gateway::Make(std::move(config->gateway), deps, current.get());
  if (!gateway) return fail(gateway.error().message);
  service.SetGateway(std::move(*gateway));
  http::Log(http::LogLevel::kInfo, "routes reloaded",
            {{"routes", routes},
             {"note", "only [gateway] and [[routes]] take effect; other settings need a restart"}});
}

constexpr const char* kDefaultConfig = "/etc/idem/idemd.toml";

int Run(int argc, char** argv) {
  std::string config_path = kDefaultConfig;
  bool check_config = false;
  std::vector<std::string> overrides;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg == "--config" && i + 1 < argc) {
      config_path = argv[++i];
    } else if (arg == "--check-config") {
      check_config = true;
    } else if (arg == "--version") {
      std::cout << "idemd " << IDEM_VERSION << "\n";
      return 0;
    } else if (arg == "--help" || arg == "-h") {
      std::cout
          << R"(usage: idemd [--config FILE] [--check-config] [--listen ADDRESS:PORT] [--store URL] [--redis URL] [--provider URL]
       idemd --version

idemd serves payments (POST /v1/payments) and gateway routes so that a request
sent many times under one Idempotency-Key executes once, and every copy gets
the same answer; it also runs the queue consumers, the outbox relay and the
reconciliation of the books its configuration names.

Options:
  --config FILE          the configuration (default )"
          << kDefaultConfig << R"();
                         IDEMD_<SECTION>_<KEY> environment variables override
                         its keys, the flags below override both
  --check-config         load and check the configuration, print it as in
                         effect (passwords redacted, secrets never printed) and
                         exit
  --listen ADDRESS:PORT  where to listen ([server] host and port; port 0 picks
                         a free one, printed on stdout as 'idemd listening on
                         URL')
  --store URL            the store: sqlite://PATH or postgresql://... ([store]
                         url)
  --redis URL            a Redis in front of the store: redis://HOST:PORT
                         ([redis] url)
  --provider URL         the payment provider's base URL ([provider] url)
  --version              print the version and exit
  -h, --help             print this help and exit

Environment:
  IDEM_SECRETS           the secrets file's TOML text (HMAC and sealing keys);
                         else [secrets] file is read
  IDEMD_<SECTION>_<KEY>  overrides one key of the configuration

Signals:
  SIGTERM, SIGINT        drain: stop taking requests and messages, finish those
                         in hand within [server] drain_timeout_ms, then exit 0
  SIGHUP                 reload the gateway routes from the file (kept as they
                         were if the new ones do not load)

Exit status:
  0                      stopped after a drain, or --check-config, --version or
                         --help done
  1                      could not start (the reason is logged as 'idemd cannot
                         start')

Logs: one JSON object per line on stderr. docs/config.md lists every key,
docs/idemd.md the API, the metrics and the logs.
)";
      return 0;
    } else {
      overrides.push_back(arg);
    }
  }
  auto config = LoadConfig(config_path, overrides);
  if (!config) return Fail(config.error().message);
  if (check_config) {
    std::cout << "# idemd " << IDEM_VERSION << ": the configuration in effect from " << config_path
              << ", the IDEMD_* environment and the flags\n"
              << EffectiveConfigToml(*config);
    return 0;
  }

  // Signals are taken by this thread only, through sigwait; every other thread blocks them.
  http::BlockSignals();

  if (const char* spec = std::getenv("IDEM_FAILPOINTS"); spec != nullptr && *spec != '\0') {
    if (auto armed = ArmFailpoints(spec); !armed) {
      return Fail("IDEM_FAILPOINTS: " + armed.error().message);
    }
    http::Log(http::LogLevel::kWarn, "failpoints armed", {{"spec", spec}});
  }

  StoreUrlOptions store_options;
  store_options.pool_size = config->store.pool_size;
  store_options.sqlite_cache_bytes = config->store.sqlite_cache_bytes;
  store_options.prepared_statements = config->store.prepared_statements;
  store_options.notifications = config->store.notifications;
  store_options.listen_url = config->store.listen_url;
  store_options.postgres_timeouts = config->store.timeouts;
  store_options.apps = IdemdMigrations();
  auto store = OpenStoreUrl(config->store.url, store_options);
  if (!store) return Fail("store: " + store.error().message);
  Metrics metrics({.longest_timeout = LongestTimeout(*config),
                   .version = IDEM_VERSION,
                   .store = (*store)->capabilities().name});
  // Every call that reaches the database is timed, beneath the caches in front of it.
  store = MakeTimedStore(std::move(*store), metrics, SystemMonotonicClock());
  std::unique_ptr<InFlightMarkers> markers;
  if (!config->redis.url.empty()) {
    // Replays served from an in-process LRU and Redis, and in-flight markers that turn concurrent
    // duplicates away early; the database still decides (redis.h).
    RedisCacheOptions cache;
    cache.url = config->redis.url;
    cache.lru_bytes = static_cast<std::size_t>(config->store.replay_cache_bytes);
    cache.on_fallback = [&metrics] { metrics.CountRedisFallback(); };
    cache.on_health = [](std::string_view failure) {
      if (failure.empty()) {
        http::Log(http::LogLevel::kInfo, "redis answers again");
      } else {
        http::Log(http::LogLevel::kWarn, "redis failing; the store answers meanwhile",
                  {{"error", failure}});
      }
    };
    auto fast = OpenRedisFastPath(std::move(*store), cache, SystemClock(), SystemRandom());
    if (!fast) return Fail("redis: " + fast.error().message);
    store = std::move(fast->store);
    markers = std::move(fast->markers);
  } else if (config->store.replay_cache_bytes > 0) {
    // Replays served from memory on every backend; the database still decides (replay_cache.h).
    store = WrapWithReplayCache(
        std::move(*store),
        {.max_bytes = static_cast<std::size_t>(config->store.replay_cache_bytes)}, SystemClock());
  }
  auto fingerprinter =
      Fingerprinter::Create(config->secrets.keys.hmac, config->secrets.keys.hmac_current);
  if (!fingerprinter) return Fail("secrets: " + fingerprinter.error().message);
  // Each route caps its own stored answers (RoutePolicy::max_response_bytes); the sealer takes
  // any a route may keep.
  auto sealer = Sealer::Create(config->secrets.keys.seal, config->secrets.keys.seal_current,
                               SystemRandom(), limits::kSealedResponseCeiling);
  if (!sealer) return Fail("secrets: " + sealer.error().message);
  auto provider = MakeHttpProvider(config->provider);
  if (!provider) return Fail("provider: " + provider.error().message);
  TimedProvider timed_provider(**provider, metrics, SystemMonotonicClock());

  Engine engine(**store, **fingerprinter, **sealer, SystemClock(), markers.get());
  KeyPolicy keys;
  keys.min_length = config->idempotency.key_min_length;
  keys.max_length = config->idempotency.key_max_length;
  // Every blocking store call of a request runs here; requests themselves hold no thread.
  http::BlockingPool store_pool(StoreThreads(config->store), "store");
  // Snapshot reads (replays not held in memory, parked requests' polls, GETs) on threads of their
  // own: they never queue behind claims and completions.
  http::BlockingPool read_pool(config->store.read_threads, "store-read");
  auto payment_namespace = PaymentsNamespace(**store, SystemRandom());
  if (!payment_namespace) return Fail("store: " + payment_namespace.error().message);
  Payments payments(**store, store_pool, timed_provider, SystemClock(), SystemMonotonicClock(),
                    std::move(*payment_namespace), config->payments.currencies,
                    ChargeCover{config->provider.timeout, config->idempotency.lease_margin},
                    config->provider.deduplicates_by_key, config->provider.settle, &metrics);
  FilterPolicy payments_policy =
      PaymentsPolicy(keys, config->idempotency.lease, config->idempotency.retention,
                     config->idempotency.max_processing, config->idempotency.max_retained,
                     config->idempotency.wait_max);
  payments_policy.max_waiters_per_principal = config->idempotency.max_waiters_per_principal;
  payments_policy.max_new_keys_per_second = config->idempotency.max_new_keys_per_second;
  IdempotencyFilter filter(engine, store_pool, SystemMonotonicClock(), metrics,
                           std::move(payments_policy), payments, &read_pool);
  // The gateway (docs/gateway.md): each route a filter in front of a proxy to its upstream, with
  // a keep-alive pool per route; SIGHUP builds it again from the file.
  const GatewayDeps gateway_deps{
      .engine = engine,
      .pool = store_pool,
      .reads = read_pool,
      .monotonic = SystemMonotonicClock(),
      .metrics = metrics,
      .keys = keys,
      .max_processing = config->idempotency.max_processing,
      .max_retained = config->idempotency.max_retained,
      .max_waiters_per_principal = config->idempotency.max_waiters_per_principal,
      .max_new_keys_per_second = config->idempotency.max_new_keys_per_second,
      .wait_max = config->idempotency.wait_max,
      .lease_margin = config->idempotency.lease_margin};
  auto gateway = Gateway::Make(config->gateway, gateway_deps);
  if (!gateway) return Fail(gateway.error().message);
  Service service(config->principals, **store, store_pool, metrics, filter, payments,
                  std::move(*gateway), &read_pool);
  // The queue consumers (docs/consumers.md): each message a request of its route, through a
  // filter of its own in front of its target's proxy. Started once idemd listens.
  auto consumers = Consumers::Make(config->consumers, gateway_deps, config->gateway,
                                   PaymentsTarget{.operation = payments, .policy = filter.policy()},
                                   InstanceName());
  if (!consumers) return Fail(consumers.error().message);
  // The outbox relay (docs/outbox.md): the payment events to their broker, one instance at a time.
  std::unique_ptr<EventSink> event_sink;
  if (config->outbox.broker != "off") {
    auto sink = OpenEventSink(config->outbox);
    if (!sink) return Fail("outbox: " + sink.error().message);
    event_sink = std::move(*sink);
  }
  // From here until Run returns, info lines (every request's) go through a buffer: a request
  // never waits for stderr; warnings and errors are still written at once (http/log.h).
  http::BufferedLog buffered_log;
  JsonAccessLog log(&metrics);
  // The routes whose records this instance resolves: any other route's PROCESSING records are
  // reported (TakeCensus).
  const auto served = [&service, &consumers](std::string_view route) {
    return route == kPaymentsCreateRoute || IsJobRoute(route) ||
           service.CurrentGateway()->Serves(route) || (*consumers)->Serves(route);
  };
  // The records gauges hold values from the start, and a removed route's records are reported.
  TakeCensus(**store, metrics, SystemClock(), served);
  (*consumers)->SampleLag();
  auto server = http::Server::Start(config->server, service, &log);
  if (!server) return Fail(server.error().message);
  metrics.WatchServer([&running = **server] {
    return Metrics::ServerLoad{.in_flight = running.InFlight(), .parked = running.ParkedCount()};
  });
  const std::string listening = "http://" + http::Authority(config->server.host, (*server)->port());
  std::printf("idemd listening on %s\n", listening.c_str());
  http::Log(
      http::LogLevel::kInfo, "listening",
      {{"version", IDEM_VERSION}, {"url", listening}, {"routes", config->gateway.routes.size()}});
  std::fflush(stdout);

  {
    // Completions on other instances wake this instance's parked requests (PostgreSQL
    // LISTEN/NOTIFY); parked requests poll as well, so a lost notification only costs latency.
    std::unique_ptr<Subscription> finished;
    if ((*store)->capabilities().notifications) {
      auto subscription = (*store)->SubscribeFinished([&](const ScopeHash& scope) {
        metrics.CountStoreNotification();
        (*server)->Notify(ToHex(scope));
      });
      if (subscription) finished = std::move(*subscription);
    }
    // Every route's points past a send (only payments have one): such retryable records are
    // the takeover loop's, never the sweeper's.
    // Paced, so that a backlog of expired records never starves the requests of the store (a
    // SQLite file's one writer above all): docs/idemd.md, "Background work".
    Loop sweeper("sweeper", config->idempotency.sweep_interval,
                 [&, failing = false](Loop& self) mutable {
                   // A round goes on until it has caught up with expiry (or idemd stops), at most a
                   // third of the store's time: its rate is the store's, not the interval's.
                   const SweepPacing pacing{.clock = &SystemMonotonicClock(),
                                            .rest_per_work = limits::kSweepRestPerWork,
                                            .rest = [&](Millis d) { return self.Rest(d); },
                                            .swept = [&](int64_t n) { metrics.CountSwept(n); }};
                   const SteadyTime started = SystemMonotonicClock().Now();
                   Result<int64_t> swept = SweepExpired(**store, filter.policy().route.sent_points,
                                                        std::numeric_limits<int>::max(), &pacing);
                   if (!swept) {
                     metrics.CountSweepFailure();
                     // Once per failure, and once when it works again: a store that is down is one
                     // line.
                     if (!failing) {
                       http::Log(http::LogLevel::kWarn, "sweep stopped; the next round tries again",
                                 {{"error", swept.error().message}});
                     }
                     failing = true;
                     return;
                   }
                   // A round that outlasted the interval (a backlog: expiry ahead of one interval's
                   // sweep) is worth a line; a round that keeps up, however much it deletes, is the
                   // counter's.
                   const auto took =
                       std::chrono::duration_cast<Millis>(SystemMonotonicClock().Now() - started);
                   if (failing || took >= config->idempotency.sweep_interval) {
                     http::Log(http::LogLevel::kInfo, "expired records swept",
                               {{"deleted", *swept}, {"ms", took.count()}});
                   }
                   failing = false;
                 });
    Loop census("census", kCensusInterval, [&] {
      TakeCensus(**store, metrics, SystemClock(), served);
      (*consumers)->SampleLag();
    });
    Loop reconciler("reconciler", config->idempotency.takeover_interval, [&] {
      // Payments and the gateway's routes side by side: a stalled provider delays no route's
      // records, and a stalled upstream no payment's (docs/idemd.md, "Ambiguous failures").
      const std::function<void(const std::string&)> notify = [&](const std::string& key) {
        (*server)->Notify(key);
      };
      RunConcurrently(3, 3, [&](std::size_t i) {
        if (i == 0) {
          filter.TakeOverOnce(100, notify);
        } else if (i == 1) {
          service.CurrentGateway()->TakeOverOnce(100, notify);
        } else {
          (*consumers)->TakeOverOnce(100);
        }
      });
    });
    // The books: the provider's charges against the payments (docs/reconciliation.md).
    Reconciliation books(
        **store, timed_provider, SystemClock(), SystemRandom(), &metrics,
        ReconcileOptions{.refund_duplicates = config->reconciliation.refund_duplicates,
                         .refund_orphans = config->reconciliation.refund_orphans,
                         .orphan_grace = config->reconciliation.orphan_grace,
                         .lease = config->reconciliation.lease,
                         .instance = InstanceName()});
    std::optional<Loop> bookkeeper;
    if (config->reconciliation.interval.count() > 0) {
      bookkeeper.emplace("books", config->reconciliation.interval, [&] {
        auto ran = books.RunPeriodic(config->reconciliation.window, config->reconciliation.lag);
        if (!ran && ran.error().code == Errc::kConflict) return;  // another instance runs it
        metrics.CountBooksRun(/*failed=*/!ran);
        boost::json::object line =
            ran ? ToJson(*ran) : boost::json::object{{"error", ran.error().message}};
        // Missing and mismatched need a person; duplicates and orphans are handled or reported.
        const bool alarming =
            ran && (ran->by_class.count("missing") > 0 || ran->by_class.count("mismatched") > 0);
        http::Log(alarming                         ? http::LogLevel::kError
                  : !ran || !ran->findings.empty() ? http::LogLevel::kWarn
                                                   : http::LogLevel::kInfo,
                  "reconciliation", line);
      });
    }
    std::optional<Relay> relay;
    std::optional<Loop> relayer;
    if (event_sink != nullptr) {
      relay.emplace(**store, *event_sink, SystemClock(),
                    RelayOptions{.batch = config->outbox.batch,
                                 .lease = config->outbox.lease,
                                 .retention = config->outbox.retention},
                    &metrics);
      relayer.emplace("outbox-relay", config->outbox.interval, [&, failing = false]() mutable {
        Result<RelayPass> pass = relay->RunOnce(100'000);
        if (!pass && pass.error().code == Errc::kConflict) return;  // another instance relays
        metrics.CountRelayPass(/*failed=*/!pass);
        if (!pass) {
          // Once per failure, and once when it works again: a broker that is down is one line.
          if (!failing) {
            http::Log(http::LogLevel::kWarn, "outbox relay stopped",
                      {{"sink", event_sink->Describe()}, {"error", pass.error().message}});
          }
          failing = true;
          return;
        }
        if (failing || pass->published > 0 || pass->swept > 0) {
          http::Log(http::LogLevel::kInfo, "outbox relayed",
                    {{"sink", event_sink->Describe()},
                     {"published", pass->published},
                     {"swept", pass->swept}});
        }
        failing = false;
      });
    }
    if (Status started = (*consumers)->Start(); !started) {
      (*server)->Drain();
      return Fail(started.error().message);
    }
    int sig = 0;
    while ((sig = http::WaitForSignal()) == SIGHUP)
      Reload(config_path, overrides, gateway_deps, service, **store);
    http::Log(http::LogLevel::kInfo, "draining", {{"signal", sig}});
    // No message is taken from now on; those in hand reach an answer or are left to the broker.
    (*consumers)->Stop();
    (*server)->Drain();
  }
  http::Log(http::LogLevel::kInfo, "stopped");
  return 0;
}

}  // namespace

int main(int argc, char** argv) { return Run(argc, argv); }
