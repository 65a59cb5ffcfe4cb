// Small pieces of the sweep runner: SHA-256 against the FIPS 180-2 test vectors, and the
// edit distance behind "did you mean".
#include <catch2/catch.hpp>

#include "experiments/sweep/config.hpp"
#include "experiments/sweep/sha256.hpp"

using roundoff::sweep::did_you_mean;
using roundoff::sweep::edit_distance;
using roundoff::sweep::sha256_hex;

TEST_CASE("SHA-256 matches the FIPS 180-2 examples", "[sweep]") {
  // FIPS 180-2, Appendix B.1 (one block), B.2 (two blocks: 448-bit message), B.3 (10^6 'a').
  CHECK(sha256_hex("abc") == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  CHECK(sha256_hex("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq") ==
        "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
  CHECK(sha256_hex(std::string(1000000, 'a')) == "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
  // The empty message (NIST CSRC example values): padding-only block.
  CHECK(sha256_hex("") == "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
}

TEST_CASE("edit distance and did-you-mean", "[sweep]") {
  CHECK(edit_distance("kitten", "sitting") == 3);
  CHECK(edit_distance("", "abc") == 3);
  CHECK(edit_distance("replicas", "replicas") == 0);
  CHECK(did_you_mean("replica", {"seed", "replicas", "grid"}) == " (did you mean 'replicas'?)");
  CHECK(did_you_mean("formt", {"format", "rounding"}) == " (did you mean 'format'?)");
  CHECK(did_you_mean("zzzzzz", {"format", "rounding"}).empty());
}
