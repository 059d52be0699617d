// src/core/fingerprint_test.cc — HMAC fingerprints: inputs that must and must not collide,
// secret rotation, rule versions.
#include "idem/fingerprint.h"

#include <gtest/gtest.h>
#include <openssl/hmac.h>

#include <cstring>

namespace idem {
namespace {

const std::string kSecretA(32, 'a');
const std::string kSecretB(40, 'b');

std::unique_ptr<Fingerprinter> Make(uint32_t current) {
  auto fp = Fingerprinter::Create({{1, kSecretA}, {2, kSecretB}}, current);
  EXPECT_TRUE(fp.has_value()) << fp.error().message;
  return std::move(*fp);
}

CanonicalRequest Request(std::string body = R"({"amount":"100.00","trace_id":"t1"})",
                         std::string user = "alice") {
  CanonicalRules rules;
  rules.money_fields = {"amount"};
  rules.removed_fields = {"trace_id"};
  // MakeCanonicalRequest copies what the views show.
  RequestFacts facts{"POST", "payments.create", "application/json", "2024-01-01", body, user};
  return *MakeCanonicalRequest(facts, rules);
}

TEST(Fingerprint, SameMeaningSameFingerprint) {
  auto fp = Make(1);
  EXPECT_EQ(fp->Sign(Request()).mac, fp->Sign(Request(R"({"trace_id":"t2","amount":1e2})")).mac);
}

TEST(Fingerprint, EveryFieldMatters) {
  auto fp = Make(1);
  const auto base = fp->Sign(Request()).mac;
  EXPECT_NE(base, fp->Sign(Request(R"({"amount":"100.01"})")).mac);
  EXPECT_NE(base, fp->Sign(Request(R"({"amount":"100.00"})", "bob")).mac);
  CanonicalRequest r = Request();
  for (std::string CanonicalRequest::*field :
       {&CanonicalRequest::method, &CanonicalRequest::route, &CanonicalRequest::content_type,
        &CanonicalRequest::api_version}) {
    CanonicalRequest changed = r;
    changed.*field += "x";
    EXPECT_NE(base, fp->Sign(changed).mac);
  }
  CanonicalRequest versioned = r;
  versioned.rules_version = 2;
  EXPECT_NE(base, fp->Sign(versioned).mac);
}

TEST(MediaTypeOf, KeepsOnlyTheMediaTypeLowerCased) {
  EXPECT_EQ(MediaTypeOf("application/json"), "application/json");
  EXPECT_EQ(MediaTypeOf("application/json; charset=utf-8"), "application/json");
  EXPECT_EQ(MediaTypeOf("Application/JSON;charset=UTF-8"), "application/json");
  EXPECT_EQ(MediaTypeOf(" \tapplication/json \t; a=1; b=2"), "application/json");
  EXPECT_EQ(MediaTypeOf("text/plain"), "text/plain");
  EXPECT_EQ(MediaTypeOf(""), "");
  EXPECT_EQ(MediaTypeOf("; charset=utf-8"), "");
}

TEST(Fingerprint, OnlyTheMediaTypeOfTheContentTypeCounts) {
  auto fp = Make(1);
  const std::string body = R"({"amount":"1"})";
  auto sign = [&](std::string_view content_type) {
    RequestFacts facts{"POST", "payments.create", content_type, "v1", body, "alice"};
    return fp->Sign(*MakeCanonicalRequest(facts, CanonicalRules{})).mac;
  };
  const auto base = sign("application/json");
  EXPECT_EQ(base, sign("application/json; charset=utf-8"));
  EXPECT_EQ(base, sign("APPLICATION/Json ;charset=utf-8"));
  EXPECT_NE(base, sign("application/jsonx"));
  EXPECT_NE(base, sign("text/json; charset=utf-8"));
}

TEST(Fingerprint, FieldBoundariesCannotShift) {
  auto fp = Make(1);
  CanonicalRequest a = Request(), b = Request();
  a.method = "POS";
  a.route = "Tpayments.create";
  b.method = "POST";
  b.route = "payments.create";
  EXPECT_NE(fp->Sign(a).mac, fp->Sign(b).mac);
}

// The target is a field only when there is one: fingerprints made before it existed (every
// payment's) are unchanged.
TEST(Fingerprint, IsHmacSha256OverLengthPrefixedFields) {
  auto fp = Make(1);
  for (std::string target : {"", "/v1/orders/o-1/capture?x=1"}) {
    CanonicalRequest r{1, "M", "R", "C", "V", "{}", "U", target};
    std::string input;
    std::vector<std::string> fields = {"1", "M", "R", "C", "V", "{}", "U"};
    if (!target.empty()) fields.push_back(target);
    for (const std::string& f : fields) {
      input += std::string("\0\0\0", 3) + static_cast<char>(f.size()) + f;
    }
    unsigned char want[32];
    unsigned int len = 0;
    HMAC(EVP_sha256(), kSecretA.data(), static_cast<int>(kSecretA.size()),
         reinterpret_cast<const unsigned char*>(input.data()), input.size(), want, &len);
    ASSERT_EQ(len, 32u);
    EXPECT_EQ(std::memcmp(fp->Sign(r).mac.data(), want, 32), 0) << target;
  }
}

TEST(Fingerprint, VerifiesUnderTheSecretThatMadeIt) {
  auto old_fp = Make(1);
  const Fingerprint stored = old_fp->Sign(Request());
  EXPECT_EQ(stored.secret_id, 1u);
  auto rotated = Make(2);  // secret 2 is now current; secret 1 still verifies
  EXPECT_NE(rotated->Sign(Request()).mac, stored.mac);
  EXPECT_TRUE(*rotated->Verify(Request(), stored));
  EXPECT_FALSE(*rotated->Verify(Request(R"({"amount":"5"})"), stored));

  auto retired = Fingerprinter::Create({{2, kSecretB}}, 2);
  auto r = (*retired)->Verify(Request(), stored);
  ASSERT_FALSE(r.has_value());
  EXPECT_EQ(r.error().code, Errc::kDataLoss);
}

TEST(Fingerprint, VerifyRefusesAnotherRulesVersion) {
  auto fp = Make(1);
  Fingerprint stored = fp->Sign(Request());
  stored.rules_version = 9;
  EXPECT_EQ(fp->Verify(Request(), stored).error().code, Errc::kInvalidArgument);
}

TEST(Fingerprint, RejectsWeakOrAmbiguousSecrets) {
  EXPECT_EQ(Fingerprinter::Create({{1, std::string(31, 'x')}}, 1).error().code,
            Errc::kInvalidArgument);
  EXPECT_EQ(Fingerprinter::Create({{1, kSecretA}, {1, kSecretB}}, 1).error().code,
            Errc::kInvalidArgument);
  EXPECT_EQ(Fingerprinter::Create({{1, kSecretA}}, 2).error().code, Errc::kInvalidArgument);
}

TEST(Fingerprint, AnOpaqueBodyCountsByteForByte) {
  auto fp = Make(1);
  CanonicalRules rules;
  rules.opaque_body = true;
  rules.max_bytes = 16;
  auto sign = [&](std::string_view body,
                  std::string_view type = "application/x-www-form-urlencoded") {
    RequestFacts facts{"POST", "gw.forms", type, "", body, "u"};
    auto canonical = MakeCanonicalRequest(facts, rules);
    EXPECT_TRUE(canonical.has_value()) << canonical.error().message;
    return fp->Sign(*canonical).mac;
  };
  EXPECT_EQ(sign("a=1&b=2"), sign("a=1&b=2"));
  EXPECT_NE(sign("a=1&b=2"), sign("b=2&a=1")) << "no reordering: bytes are bytes";
  EXPECT_NE(sign("a=1&b=2"), sign("a=1&b=2", "text/plain")) << "the media type still counts";
  EXPECT_EQ(sign("{\"a\":1,\"a\":2}"), sign("{\"a\":1,\"a\":2}")) << "not parsed as JSON";
  const std::string seventeen(17, 'x');
  RequestFacts large{"POST", "gw.forms", "text/plain", "", seventeen, "u"};
  EXPECT_EQ(MakeCanonicalRequest(large, rules).error().code, Errc::kTooLarge);
}

TEST(Fingerprint, InvalidBodyIsAnError) {
  RequestFacts facts{"POST", "r", "application/json", "", "{\"a\":1,\"a\":2}", "u"};
  EXPECT_EQ(MakeCanonicalRequest(facts, {}).error().code, Errc::kInvalidArgument);
}

}  // namespace
}  // namespace idem
