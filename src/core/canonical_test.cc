// src/core/canonical_test.cc — canonicalisation vectors: RFC 8785 examples, exact numbers,
// equivalence classes that must and must not collide, rules, and every limit.
#include "idem/canonical.h"

#include <gtest/gtest.h>

namespace idem {
namespace {

std::string Canon(std::string_view json, const CanonicalRules& rules = {}) {
  auto r = Canonicalize(json, rules);
  EXPECT_TRUE(r.has_value()) << json << ": " << r.error().message;
  return r ? *r : std::string("<error>");
}

Errc CanonError(std::string_view json, const CanonicalRules& rules = {}) {
  auto r = Canonicalize(json, rules);
  EXPECT_FALSE(r.has_value()) << json << " canonicalised to " << *r;
  return r ? Errc::kInternal : r.error().code;
}

TEST(Canonicalize, SortsMembersAndDropsWhitespace) {
  EXPECT_EQ(
      Canon(R"( { "b" : 1 , "a" : [ true , false , null ] , "c" : { "z" : "x", "y" : {} } } )"),
      R"({"a":[true,false,null],"b":1,"c":{"y":{},"z":"x"}})");
  EXPECT_EQ(Canon("[]"), "[]");
  EXPECT_EQ(Canon("\"s\""), "\"s\"");
}

// RFC 8785 §3.2.3: sorting by UTF-16 code units (the example's member names).
TEST(Canonicalize, Rfc8785SortingExample) {
  const std::string in =
      "{\"\\u20ac\":\"Euro Sign\",\"\\r\":\"Carriage Return\",\"\\ufb33\":\"Hebrew Letter Dalet "
      "With Dagesh\",\"1\":\"One\",\"\\ud83d\\ude00\":\"Emoji: Grinning Face\",\"\\u0080\":"
      "\"Control\",\"\\u00f6\":\"Latin Small Letter O With Diaeresis\"}";
  const std::string want =
      "{\"\\r\":\"Carriage Return\",\"1\":\"One\",\"\xc2\x80\":\"Control\",\"\xc3\xb6\":\"Latin "
      "Small Letter O With Diaeresis\",\"\xe2\x82\xac\":\"Euro Sign\",\"\xf0\x9f\x98\x80\":"
      "\"Emoji: Grinning Face\",\"\xef\xac\xb3\":\"Hebrew Letter Dalet With Dagesh\"}";
  EXPECT_EQ(Canon(in), want);
}

// RFC 8785 §3.2.2.2: string escaping.
TEST(Canonicalize, Rfc8785StringEscapes) {
  EXPECT_EQ(Canon(R"(["\u20ac$\u000F\u000aA'\u0042\u0022\u005c\\\"\/"])"),
            "[\"\xe2\x82\xac$\\u000f\\nA'B\\\"\\\\\\\\\\\"/\"]");
  EXPECT_EQ(Canon(R"("\b\f\n\r\t\u0000\u001f\u007f")"), "\"\\b\\f\\n\\r\\t\\u0000\\u001f\x7f\"");
}

TEST(Canonicalize, UnicodeEscapesEqualTheirRawCharacters) {
  EXPECT_EQ(Canon(R"({"name":"J\u00fcrgen \ud83d\ude00"})"),
            Canon("{\"name\":\"J\xc3\xbcrgen \xf0\x9f\x98\x80\"}"));
}

TEST(Canonicalize, RejectsInvalidUtf8AndLoneSurrogates) {
  EXPECT_EQ(CanonError("\"\xff\""), Errc::kInvalidArgument);
  EXPECT_EQ(CanonError("\"\xc3\""), Errc::kInvalidArgument);
  EXPECT_EQ(CanonError("\"\xed\xa0\x80\""), Errc::kInvalidArgument);  // UTF-8 encoded surrogate
  EXPECT_EQ(CanonError("\"\xc0\xaf\""), Errc::kInvalidArgument);      // overlong
  EXPECT_EQ(CanonError(R"("\ud800")"), Errc::kInvalidArgument);
  EXPECT_EQ(CanonError(R"("\udc00x")"), Errc::kInvalidArgument);
  EXPECT_EQ(CanonError("{\"\xff\":1}"), Errc::kInvalidArgument);
}

TEST(Canonicalize, RejectsDuplicateMemberNames) {
  EXPECT_EQ(CanonError(R"({"a":1,"a":1})"), Errc::kInvalidArgument);
  EXPECT_EQ(CanonError(R"({"x":{"b":1,"a":2,"b":3}})"), Errc::kInvalidArgument);
  // The same name written two ways is still a duplicate.
  EXPECT_EQ(CanonError(R"({"a":1,"\u0061":2})"), Errc::kInvalidArgument);
}

TEST(Canonicalize, RejectsMalformedJson) {
  for (std::string_view bad :
       {"", "{", "{\"a\":}", "[1,]", "{\"a\":1,}", "01", "1.", ".5", "+1", "NaN", "Infinity", "'a'",
        "{a:1}", "[1] [2]", "/*c*/1", "\"\t\"", "tru", "[1}"}) {
    EXPECT_EQ(CanonError(bad), Errc::kInvalidArgument) << bad;
  }
}

TEST(CanonicalDecimal, EqualAmountsShareOneForm) {
  for (std::string_view s :
       {"100", "100.0", "1e2", "1E2", "1e+2", "100.000", "0.1e3", "10000e-2"}) {
    EXPECT_EQ(*CanonicalDecimal(s), "100") << s;
  }
  EXPECT_EQ(*CanonicalDecimal("-0.50"), "-0.5");
  EXPECT_EQ(*CanonicalDecimal("0.00"), "0");
  EXPECT_EQ(*CanonicalDecimal("-0"), "0");
  EXPECT_EQ(*CanonicalDecimal("-0.0e5"), "0");
  EXPECT_EQ(*CanonicalDecimal("1.5"), "1.5");
  EXPECT_EQ(*CanonicalDecimal("0.001"), "0.001");
  EXPECT_EQ(*CanonicalDecimal("12345.678e1"), "123456.78");
}

TEST(CanonicalDecimal, NeverGoesThroughDouble) {
  // Distinct as decimals, equal as doubles.
  EXPECT_NE(*CanonicalDecimal("9007199254740993"), *CanonicalDecimal("9007199254740992"));
  EXPECT_NE(*CanonicalDecimal("0.1000000000000000000001"), *CanonicalDecimal("0.1"));
  EXPECT_EQ(*CanonicalDecimal("123456789012345678901234567890"), "123456789012345678901234567890");
  EXPECT_EQ(*CanonicalDecimal("-123456789012345678901234567890.50"),
            "-123456789012345678901234567890.5");
}

TEST(CanonicalDecimal, ExtremeMagnitudesUseExponentForm) {
  // Plain form up to 40 integer digits or 40 places after the point, exponent form beyond.
  EXPECT_EQ(*CanonicalDecimal("1e39"), "1" + std::string(39, '0'));
  EXPECT_EQ(*CanonicalDecimal("1e40"), "1e40");
  EXPECT_EQ(*CanonicalDecimal("15e39"), "1.5e40");
  EXPECT_EQ(*CanonicalDecimal("1e-40"), "0." + std::string(39, '0') + "1");
  EXPECT_EQ(*CanonicalDecimal("1e-41"), "1e-41");
  EXPECT_EQ(*CanonicalDecimal("-25e-50"), "-2.5e-49");
  EXPECT_EQ(*CanonicalDecimal("1e41"), *CanonicalDecimal("10e40"));
  EXPECT_EQ(*CanonicalDecimal("0.1e-40"), *CanonicalDecimal("1e-41"));
}

TEST(CanonicalDecimal, LimitsAtAndPastTheEdge) {
  EXPECT_TRUE(CanonicalDecimal("1e" + std::to_string(limits::kJsonMaxExponent)).has_value());
  EXPECT_FALSE(CanonicalDecimal("1e" + std::to_string(limits::kJsonMaxExponent + 1)).has_value());
  EXPECT_FALSE(CanonicalDecimal("1e99999999999999999999").has_value());
  EXPECT_TRUE(CanonicalDecimal(std::string(limits::kJsonMaxNumberDigits, '7')).has_value());
  EXPECT_FALSE(CanonicalDecimal(std::string(limits::kJsonMaxNumberDigits + 1, '7')).has_value());
}

// Found by fuzz/canonical_fuzz.cc: "110.0e1000" was accepted and written as "1.1e1002", which
// (like any number past the limits) was refused when read again — a canonical body
// canonicalised once more, or idemd's amount check on CanonicalScalar's text. The limits now hold
// for the canonical form as well, so canonical text is always accepted again, unchanged.
TEST(CanonicalDecimal, CanonicalFormStaysWithinTheLimits) {
  const std::string max_exponent = std::to_string(limits::kJsonMaxExponent);
  EXPECT_FALSE(CanonicalDecimal("110.0e" + max_exponent).has_value());
  EXPECT_FALSE(CanonicalDecimal("0.001e-" + max_exponent).has_value());
  EXPECT_EQ(*CanonicalDecimal("0.01e" + max_exponent), "1e" + std::to_string(998));
  EXPECT_EQ(CanonError("[110.0e" + max_exponent + "]"), Errc::kInvalidArgument);
  // 100 significant digits 39 places after the point: 140 digits in plain form.
  const std::string hundred = std::string(limits::kJsonMaxNumberDigits, '7');
  EXPECT_FALSE(CanonicalDecimal(hundred + "e-139").has_value());
  EXPECT_TRUE(CanonicalDecimal(hundred.substr(0, 60) + "e-99").has_value());  // 100 digits
  for (const std::string& text :
       {"1e" + max_exponent, "-1e-" + max_exponent, std::string("9.99e-41"),
        "0." + std::string(39, '0') + "1", hundred, "0.1" + std::string(98, '3')}) {
    auto canonical = CanonicalDecimal(text);
    ASSERT_TRUE(canonical.has_value()) << text;
    EXPECT_EQ(CanonicalDecimal(*canonical).value(), *canonical) << text;
  }
}

TEST(CanonicalDecimal, RejectsNonNumbers) {
  for (std::string_view bad :
       {"", "-", "1.", ".1", "01", "1e", "1e+", "abc", "1,0", " 1", "1 ", "0x10", "--1", "1.2.3"}) {
    EXPECT_EQ(CanonicalDecimal(bad).error().code, Errc::kInvalidArgument) << bad;
  }
}

TEST(Canonicalize, NumbersInsideDocumentsAreExact) {
  EXPECT_EQ(Canon(R"({"n":1e2,"m":100.0,"big":123456789012345678901234567890})"),
            R"({"big":123456789012345678901234567890,"m":100,"n":100})");
  EXPECT_EQ(CanonError(R"({"n":1e1001})"), Errc::kInvalidArgument);
}

CanonicalRules PaymentRules() {
  CanonicalRules rules;
  rules.version = 3;
  rules.money_fields = {"amount", "fee.value"};
  rules.removed_fields = {"trace_id", "meta.trace_id"};
  rules.defaults = {{"description", "\"\""}, {"metadata", "{}"}};
  return rules;
}

TEST(Canonicalize, MoneyFieldsAcceptNumbersAndDecimalStringsAlike) {
  const CanonicalRules rules = PaymentRules();
  const std::string want = Canon(R"({"amount":100,"currency":"CNY"})", rules);
  for (std::string_view body :
       {R"({"amount":"100.00","currency":"CNY"})", R"({"amount":100.0,"currency":"CNY"})",
        R"({"amount":1e2,"currency":"CNY"})", R"({"currency":"CNY","amount":"100"})"}) {
    EXPECT_EQ(Canon(body, rules), want) << body;
  }
  EXPECT_NE(Canon(R"({"amount":"100.01","currency":"CNY"})", rules), want);
  EXPECT_EQ(Canon(R"({"fee":{"value":"0.50"}})", rules), Canon(R"({"fee":{"value":0.5}})", rules));
  EXPECT_EQ(CanonError(R"({"amount":"100 CNY"})", rules), Errc::kInvalidArgument);
  EXPECT_EQ(CanonError(R"({"amount":true})", rules), Errc::kInvalidArgument);
  EXPECT_EQ(CanonError(R"({"amount":"1,00"})", rules), Errc::kInvalidArgument);
}

TEST(Canonicalize, NonMoneyStringsStayStrings) {
  // "100" and 100 differ outside money fields: only declared fields get number semantics.
  EXPECT_NE(Canon(R"({"n":"100"})"), Canon(R"({"n":100})"));
}

TEST(Canonicalize, RemovedFieldsDoNotChangeTheResult) {
  const CanonicalRules rules = PaymentRules();
  EXPECT_EQ(Canon(R"({"amount":1,"trace_id":"abc"})", rules),
            Canon(R"({"amount":1,"trace_id":"xyz"})", rules));
  EXPECT_EQ(Canon(R"({"amount":1,"trace_id":"abc"})", rules), Canon(R"({"amount":1})", rules));
  EXPECT_EQ(Canon(R"({"meta":{"trace_id":1,"k":2}})", rules), Canon(R"({"meta":{"k":2}})", rules));
  // Only the declared path: a nested trace_id elsewhere is business data.
  EXPECT_NE(Canon(R"({"other":{"trace_id":1}})", rules), Canon(R"({"other":{}})", rules));
}

TEST(Canonicalize, DefaultsAreFilledWhenAbsent) {
  const CanonicalRules rules = PaymentRules();
  EXPECT_EQ(Canon(R"({"amount":1})", rules), R"({"amount":1,"description":"","metadata":{}})");
  EXPECT_EQ(Canon(R"({"amount":1})", rules),
            Canon(R"({"amount":1,"description":"","metadata":{}})", rules));
  EXPECT_EQ(Canon(R"({"amount":1,"description":"x"})", rules),
            R"({"amount":1,"description":"x","metadata":{}})");
  // Not an object at the root: nothing to fill.
  EXPECT_EQ(Canon("[1]", rules), "[1]");
}

// Found by fuzz/canonical_fuzz.cc: removals ran before the defaults, so a default holding a removed
// path put it back. A body that spelled the default out (with its own trace id) then differed from
// one that left it out, and canonical output was no fixed point.
TEST(Canonicalize, DefaultsDoNotBringBackRemovedFields) {
  CanonicalRules rules;
  rules.removed_fields = {"payer.trace_id"};
  rules.defaults = {{"payer", R"({"trace_id":1,"n":2})"}};
  const std::string implied = Canon(R"({"amount":1})", rules);
  EXPECT_EQ(implied, R"({"amount":1,"payer":{"n":2}})");
  EXPECT_EQ(Canon(R"({"amount":1,"payer":{"n":2,"trace_id":"t-9"}})", rules), implied);
  EXPECT_EQ(Canon(implied, rules), implied);
}

TEST(Canonicalize, InvalidDefaultIsReported) {
  CanonicalRules rules;
  rules.defaults = {{"x", "{not json"}};
  EXPECT_EQ(CanonError("{}", rules), Errc::kInvalidArgument);
}

TEST(Canonicalize, SizeLimitAtAndPastTheEdge) {
  CanonicalRules rules;
  rules.max_bytes = 16;
  EXPECT_TRUE(Canonicalize(R"({"a":"12345678"})", rules).has_value());  // 16 bytes
  EXPECT_EQ(CanonError(R"({"a":"123456789"})", rules), Errc::kTooLarge);
  EXPECT_EQ(CanonError(std::string(limits::kJsonMaxBytes + 1, ' ')), Errc::kTooLarge);
}

TEST(Canonicalize, DepthLimitAtAndPastTheEdge) {
  CanonicalRules rules;
  rules.max_depth = 4;
  EXPECT_TRUE(Canonicalize("[[[[1]]]]", rules).has_value());
  EXPECT_EQ(CanonError("[[[[[1]]]]]", rules), Errc::kInvalidArgument);
  const std::string deep = std::string(10000, '[') + std::string(10000, ']');
  EXPECT_EQ(CanonError(deep), Errc::kInvalidArgument);
}

TEST(Canonicalize, ContainerLimitAtAndPastTheEdge) {
  CanonicalRules rules;
  rules.max_container_size = 3;
  EXPECT_TRUE(Canonicalize("[1,2,3]", rules).has_value());
  EXPECT_EQ(CanonError("[1,2,3,4]", rules), Errc::kInvalidArgument);
  EXPECT_TRUE(Canonicalize(R"({"a":1,"b":2,"c":3})", rules).has_value());
  EXPECT_EQ(CanonError(R"({"a":1,"b":2,"c":3,"d":4})", rules), Errc::kInvalidArgument);
}

// Each container's entries count against that container, also after a nested container closed:
// the members that follow a nested array belong to the object around it.
TEST(Canonicalize, ContainerLimitCountsMembersAfterANestedArrayAgainstTheirObject) {
  CanonicalRules rules;
  rules.max_container_size = 3;
  // At the limit: three members, the first a full array.
  EXPECT_TRUE(Canonicalize(R"({"a":[1,2,3],"b":1,"c":2})", rules).has_value());
  EXPECT_TRUE(Canonicalize(R"({"a":[],"b":1,"c":2})", rules).has_value());
  EXPECT_TRUE(Canonicalize(R"({"x":{"a":[1,2,3],"b":1,"c":2},"y":1,"z":2})", rules).has_value());
  // One past: four members.
  EXPECT_EQ(CanonError(R"({"a":[1,2,3],"b":1,"c":2,"d":3})", rules), Errc::kInvalidArgument);
  EXPECT_EQ(CanonError(R"({"a":[],"b":1,"c":2,"d":3})", rules), Errc::kInvalidArgument);
  // A closed array inside a closed object: the outer object's members still count for it.
  EXPECT_TRUE(Canonicalize(R"({"x":{"p":1,"q":2,"a":[]},"y":1,"z":2})", rules).has_value());
  EXPECT_EQ(CanonError(R"({"m":1,"n":2,"x":{"a":[]},"y":1})", rules), Errc::kInvalidArgument);
}

TEST(Canonicalize, ContainerLimitCountsElementsAfterANestedContainerAgainstTheirArray) {
  CanonicalRules rules;
  rules.max_container_size = 3;
  // At the limit: three elements, the first a full array or object.
  EXPECT_TRUE(Canonicalize("[[1,2,3],2,3]", rules).has_value());
  EXPECT_TRUE(Canonicalize("[[],2,3]", rules).has_value());
  EXPECT_TRUE(Canonicalize(R"([{"a":1,"b":2,"c":3},2,3])", rules).has_value());
  EXPECT_TRUE(Canonicalize(R"([{},2,3])", rules).has_value());
  // One past: four elements.
  EXPECT_EQ(CanonError("[[1,2,3],2,3,4]", rules), Errc::kInvalidArgument);
  EXPECT_EQ(CanonError("[[],2,3,4]", rules), Errc::kInvalidArgument);
  EXPECT_EQ(CanonError(R"([{"a":1,"b":2,"c":3},2,3,4])", rules), Errc::kInvalidArgument);
  EXPECT_EQ(CanonError(R"([{},2,3,4])", rules), Errc::kInvalidArgument);
  // The default limit: `n` elements, the first a nested array.
  const auto elements = [](std::string_view first, std::size_t n) {
    std::string json = "[" + std::string(first);
    for (std::size_t i = 1; i < n; ++i) json += ",0";
    return json + "]";
  };
  EXPECT_TRUE(Canonicalize(elements("[1,2,3]", limits::kJsonMaxContainerSize), CanonicalRules{})
                  .has_value());
  auto past = Canonicalize(elements("[]", limits::kJsonMaxContainerSize + 1), CanonicalRules{});
  ASSERT_FALSE(past.has_value()) << "4097 elements accepted";
  EXPECT_EQ(past.error().code, Errc::kInvalidArgument);
}

TEST(Canonicalize, IsIdempotent) {
  const CanonicalRules rules = PaymentRules();
  const std::string once = Canon(
      R"({"metadata":{"z":[1.50,"\u00e9"],"a":null},"amount":"12.30","trace_id":"t"})", rules);
  EXPECT_EQ(Canon(once, rules), once);
}

TEST(CanonicalScalar, ReadsExactNumbersAndStrings) {
  CanonicalRules rules;
  rules.money_fields = {"amount"};
  EXPECT_EQ(**CanonicalScalar(R"({"amount":"100.50"})", "amount", rules), "100.5");
  EXPECT_EQ(**CanonicalScalar(R"({"amount":12345678901234567890.10})", "amount", rules),
            "12345678901234567890.1");
  EXPECT_EQ(**CanonicalScalar(R"({"a":{"b":"x"}})", "a.b", rules), "x");
  EXPECT_FALSE(CanonicalScalar(R"({"a":{"b":"x"}})", "a", rules)->has_value());
  EXPECT_FALSE(CanonicalScalar(R"({})", "amount", rules)->has_value());
  EXPECT_EQ(CanonicalScalar(R"({"amount":"x"})", "amount", rules).error().code,
            Errc::kInvalidArgument);
}

}  // namespace
}  // namespace idem
