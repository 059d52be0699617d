// examples/inbox/main.cc — a queue consumer that embeds libidem's Inbox: each order message is
// stored once in the consumer's own table, in the transaction that records the message, however
// often the broker delivers it; a shipment is booked with a carrier once, under a key the carrier
// deduplicates by. The broker is played by a list of deliveries.
//
//   inbox FILE.db    prints what became of each delivery; exits 0 when each ran once
#include <idem/inbox.h>
#include <idem/store/sqlite.h>

#include <array>
#include <chrono>
#include <cstdint>
#include <iostream>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace {

// 32 random bytes. A real consumer loads its HMAC and sealing secrets from its configuration and
// keeps them: a record is verified and opened only with the secrets that made it.
idem::Secret FreshSecret() {
  std::array<uint8_t, 32> bytes;
  idem::SystemRandom().Fill(bytes);
  return idem::Secret{1, std::string(bytes.begin(), bytes.end())};
}

int Fail(const std::string& what, const idem::Error& error) {
  std::cerr << "inbox: " << what << ": " << error.message << "\n";
  return 1;
}

// What the consumer tells its broker about a message.
std::string_view Answer(const idem::InboxOutcome& outcome) {
  if (outcome.Acknowledge()) return "ack";  // executed now, or a duplicate of one that was
  switch (outcome.kind) {
    case idem::InboxOutcome::Kind::kMismatch:
    case idem::InboxOutcome::Kind::kInvalid:
      return "dead-letter";  // never runs: quarantine it
    case idem::InboxOutcome::Kind::kInProgress:
      return "keep";  // runs elsewhere: look again after outcome.retry_after
    default:
      return "redeliver";  // failed, nothing committed
  }
}

// A carrier that books each shipment once per idempotency key, as a real API would.
struct Carrier {
  std::map<std::string, std::string> bookings;  // key -> booking id
  std::string Book(const std::string& key) {
    auto [at, added] = bookings.try_emplace(key, "BK-" + std::to_string(bookings.size() + 1));
    return at->second;
  }
  std::optional<std::string> Find(const std::string& key) const {
    auto at = bookings.find(key);
    return at == bookings.end() ? std::nullopt : std::optional<std::string>(at->second);
  }
};

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::cerr << "usage: inbox FILE.db\n";
    return 2;
  }
  idem::SqliteStoreOptions options;
  options.path = argv[1];
  // The consumer's own tables, created with libidem's schema as migrations of the application.
  options.apps = {{"shop",
                   {{1, "CREATE TABLE orders (id TEXT PRIMARY KEY, body TEXT NOT NULL)"},
                    {2, "CREATE TABLE shipments (id TEXT PRIMARY KEY, booking TEXT NOT NULL)"}}}};
  auto store = idem::OpenSqliteStore(options, idem::SystemClock(), idem::SystemRandom());
  if (!store) return Fail("store", store.error());
  auto fingerprinter = idem::Fingerprinter::Create({FreshSecret()}, 1);
  if (!fingerprinter) return Fail("fingerprinter", fingerprinter.error());
  auto sealer = idem::Sealer::Create({FreshSecret()}, 1, idem::SystemRandom());
  if (!sealer) return Fail("sealer", sealer.error());
  idem::Engine engine(**store, **fingerprinter, **sealer, idem::SystemClock());

  // Consumer group "billing", consumer "orders": its records are on the route inbox.orders.
  idem::InboxPolicy policy = idem::InboxPolicy::For("billing", "orders");
  policy.retention = std::chrono::hours(24);  // longer than the broker keeps redelivering
  auto inbox = idem::Inbox::Create(engine, policy);
  if (!inbox) return Fail("inbox", inbox.error());

  // The handler of an order: its only effect is its row, written in the message's transaction.
  const idem::InboxHandler store_order = [](idem::InboxTxn& txn) -> idem::Result<std::string> {
    IDEM_RETURN_IF_ERROR(txn.Exec("INSERT INTO orders (id, body) VALUES (?, ?)",
                                  {txn.Key(), txn.Message().payload}));
    return "order " + txn.Key() + " stored";
  };

  std::array<uint8_t, 4> nonce;
  idem::SystemRandom().Fill(nonce);
  const std::string order = "A-" + idem::ToHex(nonce);  // a new order on every run
  const std::string body = R"({"order":")" + order + R"(","amount":25})";
  const std::string other = R"({"order":")" + order + R"(","amount":99})";
  // A delivery, its redelivery, and a message that reuses the order's id for another amount.
  std::vector<idem::InboxOutcome::Kind> kinds;
  for (const std::string& payload : {body, body, other}) {
    auto message = idem::InboxMessage::KeyedByJson(payload, "/order");
    if (!message) return Fail("message", message.error());
    const idem::InboxOutcome outcome = inbox->Process(*message, store_order);
    std::cout << "order " << outcome.key << ": " << idem::InboxOutcomeName(outcome.kind) << " -> "
              << Answer(outcome) << (outcome.result.empty() ? "" : " (" + outcome.result + ")")
              << "\n";
    kinds.push_back(outcome.kind);
  }

  // The handler of a shipment calls a carrier: the claim commits first, the call goes out under
  // a lease that covers it, with a key the carrier deduplicates by, and the booking is stored
  // with the result.
  Carrier carrier;
  const idem::InboxCallHandler ship = [&](idem::InboxCall& call) -> idem::Result<std::string> {
    const std::string key = call.DownstreamKey("book");
    std::optional<std::string> booking;
    if (call.Resumed() && call.RecoveryPoint() == "book") {
      booking = carrier.Find(key);  // an earlier attempt may have booked it: ask first
    }
    if (!booking) {
      IDEM_RETURN_IF_ERROR(call.BeforeCall("book", std::chrono::seconds(5)));
      booking = carrier.Book(key);
    }
    call.AtFinish([id = call.Key(), b = *booking](idem::InboxTxn& txn) -> idem::Status {
      IDEM_RETURN_IF_ERROR(txn.Exec("INSERT INTO shipments (id, booking) VALUES (?, ?)", {id, b}));
      return idem::Ok();
    });
    return "booked " + *booking;
  };
  auto shipment = idem::InboxMessage::KeyedByHeader("ship-" + order, body);
  if (!shipment) return Fail("shipment", shipment.error());
  for (int delivery = 1; delivery <= 2; ++delivery) {
    const idem::InboxOutcome outcome = inbox->ProcessWithCalls(*shipment, ship);
    std::cout << "shipment " << outcome.key << ": " << idem::InboxOutcomeName(outcome.kind)
              << " -> " << Answer(outcome)
              << (outcome.result.empty() ? "" : " (" + outcome.result + ")") << "\n";
    kinds.push_back(outcome.kind);
  }

  using Kind = idem::InboxOutcome::Kind;
  const bool once = kinds == std::vector<Kind>{Kind::kExecuted, Kind::kDuplicate, Kind::kMismatch,
                                               Kind::kExecuted, Kind::kDuplicate} &&
                    carrier.bookings.size() == 1;
  std::cout << (once ? "each message ran once\n" : "unexpected outcomes\n");
  return once ? 0 : 1;
}
