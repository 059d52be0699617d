// bench/core_bench.cc — canonicalisation and fingerprinting of a 1 KiB payment body and of the
// small one idem-bench sends.
#include <benchmark/benchmark.h>

#include "idem/canonical.h"
#include "idem/fingerprint.h"
#include "idem/seal.h"
#include "testing/fakes.h"

namespace idem {
namespace {

// A realistic 1 KiB payment request: unsorted members, money as a string, nested metadata.
std::string PaymentBody1KiB() {
  std::string body =
      R"({"trace_id":"4bf92f3577b34da6a3ce929d0e0e4736","merchant_order_no":"ORD-2024-000001",)"
      R"("currency":"CNY","amount":"100.00","description":"Order 000001: 2 items, express",)"
      R"("metadata":{"channel":"web","customer":"cus_8KzQ2","cart":[{"sku":"SKU-1","qty":1,)"
      R"("price":"60.00"},{"sku":"SKU-2","qty":2,"price":"20.00"}],"note":")";
  body.append(1024 - body.size() - 3, 'x');
  body.append("\"}}");
  return body;
}

CanonicalRules PaymentRules() {
  CanonicalRules rules;
  rules.money_fields = {"amount"};
  rules.removed_fields = {"trace_id"};
  rules.defaults = {{"description", "\"\""}, {"metadata", "{}"}};
  return rules;
}

void BM_Canonicalize1KiB(benchmark::State& state) {
  const std::string body = PaymentBody1KiB();
  const CanonicalRules rules = PaymentRules();
  for (auto _ : state) benchmark::DoNotOptimize(Canonicalize(body, rules));
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * body.size()));
}
BENCHMARK(BM_Canonicalize1KiB);

// The body idem-bench sends (bench/loadgen/driver.cc): what a replay's canonicalisation costs.
void BM_CanonicalizeBenchBody(benchmark::State& state) {
  const std::string body =
      R"({"merchant_order_no":"lg0123abcd-0-123456","amount":"100.00","currency":"CNY"})";
  const CanonicalRules rules = PaymentRules();
  for (auto _ : state) benchmark::DoNotOptimize(Canonicalize(body, rules));
}
BENCHMARK(BM_CanonicalizeBenchBody);

// What every request pays before touching the store: canonicalise + HMAC-SHA-256.
void BM_CanonicalizeAndHmac1KiB(benchmark::State& state) {
  const std::string body = PaymentBody1KiB();
  const CanonicalRules rules = PaymentRules();
  auto fp = std::move(*Fingerprinter::Create({{1, std::string(32, 'k')}}, 1));
  const RequestFacts facts{"POST", "payments.create", "application/json", "v1", body, "alice"};
  for (auto _ : state) {
    auto canonical = MakeCanonicalRequest(facts, rules);
    benchmark::DoNotOptimize(fp->Sign(*canonical));
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * body.size()));
}
BENCHMARK(BM_CanonicalizeAndHmac1KiB);

void BM_Hmac1KiB(benchmark::State& state) {
  auto fp = std::move(*Fingerprinter::Create({{1, std::string(32, 'k')}}, 1));
  CanonicalRequest r{
      1, "POST", "payments.create", "application/json", "v1", std::string(1024, 'x'), "alice", ""};
  for (auto _ : state) benchmark::DoNotOptimize(fp->Sign(r));
}
BENCHMARK(BM_Hmac1KiB);

void BM_SealOpen512B(benchmark::State& state) {
  testing::SeededRandom random(1);
  auto sealer = std::move(*Sealer::Create({{1, std::string(32, 's')}}, 1, random));
  const ScopeHash scope{};
  const std::string plain(512, 'r');
  for (auto _ : state) {
    auto sealed = sealer->Seal(scope, plain);
    benchmark::DoNotOptimize(sealer->Open(scope, *sealed));
  }
}
BENCHMARK(BM_SealOpen512B);

}  // namespace
}  // namespace idem
