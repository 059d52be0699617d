// include/idem/store/postgres.h — the scale-out store: PostgreSQL through libpq.
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "idem/clock.h"
#include "idem/result.h"
#include "idem/store.h"

namespace idem {

// Bounds on every call to the server, so that a stalled server, a half-open connection or a lock
// held by a stuck transaction becomes an error (kUnavailable) in bounded time instead of a thread
// blocked without end. docs/deploy.md says what an operator sees when they apply.
struct PostgresTimeouts {
  // Establishing a connection (TCP, TLS, authentication, session settings) on the client's own
  // deadline, which also covers a server that accepts TCP connections but never answers (a
  // stopped postmaster). With several hosts in the conninfo, the bound is for all of them. Host
  // names are resolved before it starts, without a bound: use addresses or a local resolver.
  // Generous next to a healthy connect (milliseconds), short next to a client's patience.
  Millis connect{5000};
  // The server cancels a statement that runs longer (statement_timeout). The client waits
  // statement + 1 s for an answer, then drops the connection: a server that stopped answering.
  // Shorter than the lease (30 s), so a completion that stalls fails before a takeover is allowed.
  Millis statement{10000};
  // The server cancels a statement that waits longer for a lock (lock_timeout): a record's row,
  // a business row or a principal's quota counter row held by a stuck transaction. At most
  // `statement`, so a lock wait is reported as such. Our transactions hold row locks for
  // milliseconds.
  Millis lock{5000};
  // The server ends a session left inside a transaction without a statement for this long
  // (idle_in_transaction_session_timeout), which releases its locks: a stuck instance can hold
  // up the others for no longer. No transaction of ours pauses between statements.
  Millis idle_in_transaction{10000};
  // TCP keepalives: a peer that vanished (a half-open connection idle in the pool, or the
  // listener's) is found within idle + interval × count = 60 s, and middleboxes do not drop
  // idle connections. Whole seconds, as the kernel takes them.
  std::chrono::seconds keepalives_idle{30};
  std::chrono::seconds keepalives_interval{10};
  int keepalives_count = 3;
};

// Errors: kInvalidArgument naming the field when a timeout is outside 1 ms..1 h, `lock` is longer
// than `statement`, or a keepalive setting is outside what the kernel takes (idle and interval
// 1..32767 s, count 1..127).
Status ValidatePostgresTimeouts(const PostgresTimeouts& timeouts);

struct PostgresStoreOptions : SchemaOptions {
  // libpq connection string or URI: "postgresql://user@host:port/db".
  std::string conninfo;
  // Completion notifications: a Finish announces its record as it commits (NOTIFY idem_finished)
  // and SubscribeFinished listens for them. Off: no NOTIFY and no listener
  // (capabilities().notifications is false); a request parked on a key another instance runs
  // learns of its completion by polling, later. Nothing is less correct without them: turn them
  // off where LISTEN/NOTIFY does not span the database (a distributed PostgreSQL such as Citus).
  // (Their cost is within the noise here: pgbench of a first execution's statements, 8 clients,
  // 1,600-2,106 tps with the NOTIFY and 1,773-2,065 without, docs/design.md.)
  bool notifications = true;
  // Where the listener that hears other instances' completions (LISTEN idem_finished) connects;
  // empty: conninfo. Notifications do not pass a transaction pooler (PgBouncer's transaction
  // mode): behind one, point this at the database itself. It needs one connection per process.
  std::string listen_conninfo;
  // Schema holding idem's tables (created if missing). Anything but "public" is selected with a
  // per-connection search_path, which PgBouncer's transaction pooling does not carry: use
  // "public" (or a role default search_path) behind PgBouncer.
  std::string schema = "public";
  // Connections kept open; at most this many transactions run at once in this process.
  int pool_size = 8;
  Millis pool_wait{5000};
  // Applied to every connection, as session settings and on the client: keepalives* of the
  // conninfo are replaced and its connect_timeout has no effect. Migrations at open run without
  // the statement, lock, idle and answer bounds (a long migration must not be cancelled, and
  // instances wait for each other's); connecting and keepalives bound them still.
  PostgresTimeouts timeouts;
  // Server-side prepared statements per connection. Turn off behind PgBouncer in transaction
  // pooling mode (before 1.21), which cannot route a prepared statement to its connection.
  bool prepared_statements = true;
  // Statement-level retries of serialisation failures and deadlocks outside explicit
  // transactions (reads, sweeps), and of connections lost before a statement was sent.
  int max_retries = 3;
};

// Connects, then applies pending migrations under a PostgreSQL advisory lock, so instances that
// start at once apply each migration once. `random` must outlive the store.
//
// One clock: every time the store writes or compares (a lease's end, a takeover, an expiry, a
// sweep, a send) is the database's clock at the statement, and every record it returns carries
// that time (Record::observed_at), so instances whose clocks disagree decide alike.
// Errors: kUnavailable if the server cannot be reached within options.timeouts.connect;
// kInvalidArgument for bad options (ValidatePostgresTimeouts among them), a migration the server
// rejects, or (apply_migrations false) a database without idem's schema; kDataLoss if the schema
// is newer than this build.
//
// What the bounds make of a store call: a statement the server cancels (statement or lock
// timeout) or that gets no answer within timeouts.statement + 1 s is kUnavailable — the
// connection is dropped in the second case — and is not retried; a COMMIT that gets no answer is
// kDeadlineExceeded (it may have committed). Store::Ping answers within its timeout on a
// connection of its own.
Result<std::unique_ptr<Store>> OpenPostgresStore(const PostgresStoreOptions& options,
                                                 Random& random);

// As above, with the store's time read from `clock` instead of the database: for tests and
// simulations that move time. Every instance on the database must then share that one clock.
// `clock` must outlive the store.
Result<std::unique_ptr<Store>> OpenPostgresStore(const PostgresStoreOptions& options, Clock& clock,
                                                 Random& random);

}  // namespace idem
