// The signer against AWS's published Signature Version 4 examples: the S3 "GET Object" example of
// the S3 API reference (sig-v4-header-based-auth), and get-vanilla-query-order-key-case from the
// SigV4 test suite (docs.aws.amazon.com/general/latest/gr/signature-v4-test-suite.html).
#include <gtest/gtest.h>

#include "kiln/storage/sigv4.h"

namespace kiln {
namespace {

constexpr const char* kEmptySha256 = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";

TEST(SigV4, Sha256AndHmacKnownAnswers) {
  EXPECT_EQ(sha256_hex(""), kEmptySha256);
  EXPECT_EQ(sha256_hex("abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");  // FIPS 180-2
  // RFC 4231 test case 2.
  EXPECT_EQ(to_hex(hmac_sha256("Jefe", "what do ya want for nothing?")),
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843");
}

TEST(SigV4, UriEncodingKeepsUnreservedAndOptionallySlash) {
  EXPECT_EQ(uri_encode("a-b_c.d~e/f g", true), "a-b_c.d~e/f%20g");
  EXPECT_EQ(uri_encode("a/b=c&d+", false), "a%2Fb%3Dc%26d%2B");
  EXPECT_EQ(uri_encode("\xc3\xa9", false), "%C3%A9");
}

TEST(SigV4, MatchesTheS3GetObjectExample) {
  SigV4Request request;
  request.path = "/test.txt";
  request.payload_sha256 = kEmptySha256;
  request.headers = {{"Host", "examplebucket.s3.amazonaws.com"},
                     {"Range", "bytes=0-9"},
                     {"x-amz-content-sha256", kEmptySha256},
                     {"x-amz-date", "20130524T000000Z"}};
  EXPECT_EQ(canonical_request(request),
            "GET\n/test.txt\n\nhost:examplebucket.s3.amazonaws.com\nrange:bytes=0-9\n"
            "x-amz-content-sha256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855\n"
            "x-amz-date:20130524T000000Z\n\nhost;range;x-amz-content-sha256;x-amz-date\n"
            "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  const SigV4Scope scope{"us-east-1", "s3"};
  EXPECT_EQ(string_to_sign(request, scope, "20130524T000000Z"),
            "AWS4-HMAC-SHA256\n20130524T000000Z\n20130524/us-east-1/s3/aws4_request\n"
            "7344ae5b7ee6c3e7e6b0fe0640412a37625d1fbfff95c48bbb2dc43964946972");
  const SigV4Credentials credentials{"AKIAIOSFODNN7EXAMPLE", "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY", ""};
  EXPECT_EQ(authorization_header(request, credentials, scope, "20130524T000000Z"),
            "AWS4-HMAC-SHA256 Credential=AKIAIOSFODNN7EXAMPLE/20130524/us-east-1/s3/aws4_request,"
            "SignedHeaders=host;range;x-amz-content-sha256;x-amz-date,"
            "Signature=f0e8bdb87c964420e857bd35b5d6ed310bd44f0170aba48dd91039c6036bdb41");
}

TEST(SigV4, MatchesTheTestSuiteQueryOrderExample) {
  SigV4Request request;
  request.path = "/";
  request.query = {{"Param2", "value2"}, {"Param1", "value1"}};  // sorted by the signer
  request.payload_sha256 = kEmptySha256;
  request.headers = {{"Host", "example.amazonaws.com"}, {"X-Amz-Date", "20150830T123600Z"}};
  EXPECT_EQ(canonical_request(request),
            "GET\n/\nParam1=value1&Param2=value2\nhost:example.amazonaws.com\nx-amz-date:20150830T123600Z\n\n"
            "host;x-amz-date\ne3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  const SigV4Credentials credentials{"AKIDEXAMPLE", "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY", ""};
  EXPECT_EQ(authorization_header(request, credentials, {"us-east-1", "service"}, "20150830T123600Z"),
            "AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20150830/us-east-1/service/aws4_request,"
            "SignedHeaders=host;x-amz-date,"
            "Signature=b97d918cfa904a5beff61c982a1b6f458b799221646efd99d3219ec94cdf2500");
}

TEST(SigV4, HeaderValuesAreTrimmedAndNamesLowerCased) {
  SigV4Request request;
  request.payload_sha256 = kEmptySha256;
  request.headers = {{"X-Amz-Date", "20150830T123600Z"}, {"Host", "  example.amazonaws.com  "},
                     {"My-Header1", "a   b  c"}};
  EXPECT_NE(canonical_request(request).find("host:example.amazonaws.com\nmy-header1:a b c\n"), std::string::npos);
}

TEST(SigV4, RejectsAMalformedDate) {
  SigV4Request request;
  EXPECT_THROW(authorization_header(request, {"id", "secret", ""}, {}, "2015-08-30"), std::exception);
}

}  // namespace
}  // namespace kiln
