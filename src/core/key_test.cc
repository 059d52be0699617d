// src/core/key_test.cc — Idempotency-Key parsing and scope hashing.
#include "idem/key.h"

#include <gtest/gtest.h>

#include <thread>

#include "testing/fakes.h"

namespace idem {
namespace {

TEST(ParseIdempotencyKey, AcceptsBareTokensAndSfStrings) {
  KeyPolicy p;
  EXPECT_EQ(*ParseIdempotencyKey("01J2ABCDXYZ", p), "01J2ABCDXYZ");
  EXPECT_EQ(*ParseIdempotencyKey("\"01J2ABCDXYZ\"", p), "01J2ABCDXYZ");
  EXPECT_EQ(*ParseIdempotencyKey("  order:42.retry_1-a \t", p), "order:42.retry_1-a");
}

TEST(ParseIdempotencyKey, BareAndQuotedFormsNameTheSameKey) {
  KeyPolicy p;
  EXPECT_EQ(*ParseIdempotencyKey("abc-12345", p), *ParseIdempotencyKey("\"abc-12345\"", p));
}

TEST(ParseIdempotencyKey, EnforcesLengthAtAndPastTheLimits) {
  KeyPolicy p;
  EXPECT_TRUE(ParseIdempotencyKey(std::string(8, 'a'), p).has_value());
  EXPECT_EQ(ParseIdempotencyKey(std::string(7, 'a'), p).error().code, Errc::kInvalidArgument);
  EXPECT_TRUE(ParseIdempotencyKey(std::string(255, 'a'), p).has_value());
  EXPECT_EQ(ParseIdempotencyKey(std::string(256, 'a'), p).error().code, Errc::kInvalidArgument);
  EXPECT_EQ(ParseIdempotencyKey(std::string(1 << 20, 'a'), p).error().code, Errc::kInvalidArgument);
  EXPECT_TRUE(ParseIdempotencyKey("\"" + std::string(255, 'a') + "\"", p).has_value());
  EXPECT_FALSE(ParseIdempotencyKey("\"" + std::string(256, 'a') + "\"", p).has_value());
}

TEST(ParseIdempotencyKey, RejectsCharactersOutsideThePolicy) {
  KeyPolicy p;
  for (std::string bad : {"abcd efgh", "abcd/efgh", "abcd+efgh", "abcdéfgh", "abcd\x01xyz",
                          "abcd\"efgh", "abc,defgh"}) {
    auto r = ParseIdempotencyKey(bad, p);
    ASSERT_FALSE(r.has_value()) << bad;
    EXPECT_EQ(r.error().code, Errc::kInvalidArgument);
  }
}

TEST(ParseIdempotencyKey, RejectsBrokenSfStrings) {
  KeyPolicy p;
  for (std::string bad :
       {"\"abcdefgh", "\"abcd\"efgh\"", "\"abcd\\xefgh\"", "\"\"", "\"", "\"abcdefgh\\\""}) {
    EXPECT_EQ(ParseIdempotencyKey(bad, p).error().code, Errc::kInvalidArgument) << bad;
  }
  // An escaped quote decodes to '"', which the default charset then refuses.
  EXPECT_FALSE(ParseIdempotencyKey("\"abcd\\\"efgh\"", p).has_value());
}

TEST(ParseIdempotencyKey, RejectsEmptyAndMissingValues) {
  KeyPolicy p;
  EXPECT_EQ(ParseIdempotencyKey("", p).error().code, Errc::kInvalidArgument);
  EXPECT_EQ(ParseIdempotencyKey("   ", p).error().code, Errc::kInvalidArgument);
}

TEST(ParseIdempotencyKey, PolicyIsConfigurable) {
  KeyPolicy p;
  p.min_length = 2;
  p.max_length = 4;
  p.allowed = KeyPolicy::Charset("xyz\"");
  EXPECT_EQ(*ParseIdempotencyKey("xy", p), "xy");
  EXPECT_FALSE(ParseIdempotencyKey("x", p).has_value());
  EXPECT_FALSE(ParseIdempotencyKey("xyzxy", p).has_value());
  EXPECT_FALSE(ParseIdempotencyKey("ab", p).has_value());
  EXPECT_EQ(*ParseIdempotencyKey("\"x\\\"y\"", p), "x\"y");
}

ScopeHash H(std::string t, std::string u, std::string r, std::string k) {
  return *Scope{std::move(t), std::move(u), std::move(r), std::move(k)}.Hash();
}
Errc HashError(std::string t, std::string u, std::string r, std::string k) {
  auto h = Scope{std::move(t), std::move(u), std::move(r), std::move(k)}.Hash();
  return h ? Errc::kInternal : h.error().code;
}
bool HashOk(std::string t, std::string u, std::string r, std::string k) {
  return Scope{std::move(t), std::move(u), std::move(r), std::move(k)}.Hash().has_value();
}

TEST(Scope, HashSeparatesEveryPart) {
  const ScopeHash base = H("acme", "alice", "payments.create", "key-00001");
  EXPECT_EQ(base, H("acme", "alice", "payments.create", "key-00001"));
  EXPECT_NE(base, H("globex", "alice", "payments.create", "key-00001"));
  EXPECT_NE(base, H("acme", "bob", "payments.create", "key-00001"));
  EXPECT_NE(base, H("acme", "alice", "refunds.create", "key-00001"));
  EXPECT_NE(base, H("acme", "alice", "payments.create", "key-00002"));
  // Moving characters between parts changes the hash (the separator cannot occur in a part).
  EXPECT_NE(H("ab", "c", "r", "kkkkkkkk"), H("a", "bc", "r", "kkkkkkkk"));
}

TEST(Scope, KnownVector) {
  // SHA-256("t\x1fu\x1fr\x1fk"), computed independently with sha256sum.
  EXPECT_EQ(ToHex(H("t", "u", "r", "k")),
            "42dccd70e5fc8a8539a803f6ed9da872a27e3a6f5d7ccf981954a0348bbf66e7");
}

TEST(Scope, RejectsEmptyOversizedOrSeparatorParts) {
  EXPECT_EQ(HashError("", "u", "r", "k"), Errc::kInvalidArgument);
  EXPECT_EQ(HashError("t", "u\x1f", "r", "k"), Errc::kInvalidArgument);
  EXPECT_EQ(HashError("t", "u", std::string(limits::kRouteMaxLength + 1, 'r'), "k"),
            Errc::kInvalidArgument);
  EXPECT_TRUE(HashOk("t", "u", std::string(limits::kRouteMaxLength, 'r'), "k"));
}

// FIPS 180-2's vectors, the parts hashed as one input, and the same answer on other threads.
TEST(Sha256, KnownVectorsOfThePartsConcatenated) {
  const std::string abc = "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad";
  EXPECT_EQ(ToHex(Sha256({"abc"})), abc);
  EXPECT_EQ(ToHex(Sha256({"a", "", "bc"})), abc);
  EXPECT_EQ(ToHex(Sha256({})), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(ToHex(Sha256({"abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq"})),
            "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
  std::string elsewhere;
  std::thread([&] { elsewhere = ToHex(Sha256({"ab", "c"})); }).join();
  EXPECT_EQ(elsewhere, abc);
}

// RFC 9562: the time in the first 48 bits, version 7, variant 10, the rest from the random
// source, as 8-4-4-4-12 lower-case hex digits.
TEST(NewUuidV7, TimeVersionVariantAndTheRandomBitsInPlace) {
  testing::FakeClock clock(FromUnixMillis(0x0123456789ab));
  testing::SeededRandom random(3);
  testing::SeededRandom same(3);
  std::array<uint8_t, 16> bytes;
  same.Fill(bytes);
  const std::string hex = ToHex(bytes);
  const std::string id = NewUuidV7(clock, random);
  ASSERT_EQ(id.size(), 36u);
  EXPECT_EQ(id.substr(0, 14), "01234567-89ab-");
  EXPECT_EQ(id[14], '7');
  EXPECT_EQ(id.substr(15, 3), hex.substr(13, 3));
  EXPECT_EQ(id[18], '-');
  EXPECT_EQ(id[19], "0123456789abcdef"[0x8 | ((bytes[8] >> 4) & 0x3)]);
  EXPECT_EQ(id.substr(20, 3), hex.substr(17, 3));
  EXPECT_EQ(id[23], '-');
  EXPECT_EQ(id.substr(24), hex.substr(20));
  EXPECT_NE(NewUuidV7(clock, random), id);
}

}  // namespace
}  // namespace idem
