// The bytes MPI ranks exchange: work items and run outcomes, in a fixed little-endian
// layout (every rank runs the same build, but the layout does not depend on that). Kept
// apart from MPI so that it is tested in every build.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "runner.hpp"

namespace roundoff::sweep {

std::string encode_items(const std::vector<WorkItem>& items);
std::vector<WorkItem> decode_items(std::string_view bytes);

// Every field of the outcome: item, kind, message, and the result's metrics, traces and
// flags. Decoding checks the layout (std::runtime_error when truncated or malformed).
std::string encode_outcome(const ItemOutcome& outcome);
ItemOutcome decode_outcome(std::string_view bytes);

// What rank 0 sends to start the workers: the threads per rank (-j) and the config.
struct StartMessage {
  std::int32_t threads = 0;
  std::string config_path, config_text;
};
std::string encode_start(const StartMessage& start);
StartMessage decode_start(std::string_view bytes);

}  // namespace roundoff::sweep
