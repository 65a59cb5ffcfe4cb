// The emu calculator's subcommands. Each takes the arguments after its name, writes its
// results to `out` (one line per result) and throws UsageError for bad input.
#pragma once

#include <cstdio>
#include <stdexcept>
#include <string>
#include <vector>

namespace emu::cli {

// Writing the results failed (disk full, closed file): what() is the system's reason.
class WriteError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Buffered output: results are collected and written in large blocks (100,000 lines
// must not cost 100,000 writes).
class Output {
 public:
  explicit Output(std::FILE* file) : file_(file) {}
  // Flushes what is left, ignoring errors (call flush() first to hear of them).
  ~Output();
  void line(const std::string& text);
  void text(const std::string& text) { buffer_ += text; }  // as it is, no newline added
  // Writes the buffer and flushes the file; throws WriteError if either fails.
  void flush();

 private:
  std::FILE* file_;
  std::string buffer_;
};

// Usage text of a subcommand ("" = the program), or nullptr for an unknown one.
const char* help_text(const std::string& command);

// Runs `emu COMMAND ARGS...`; returns the exit status. Throws UsageError (exit 2);
// any other exception is a bug (exit 1).
int run_command(const std::string& command, const std::vector<std::string>& args, Output& out);

}  // namespace emu::cli
