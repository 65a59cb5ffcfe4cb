// SHA-256 (FIPS 180-4) of a byte string, as 64 lower-case hex digits. Used to recognise
// the config that produced an output file; small enough not to need a crypto library.
#pragma once

#include <string>
#include <string_view>

namespace roundoff::sweep {

std::string sha256_hex(std::string_view bytes);

}  // namespace roundoff::sweep
