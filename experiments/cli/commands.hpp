// The emu calculator's subcommands. Each takes the arguments after its name, writes its
// results to `out` (one line per result) and throws UsageError for bad input.
#pragma once

#include <cstdio>
#include <string>
#include <vector>

namespace emu::cli {

// Buffered output: results are collected and written in large blocks (100,000 lines
// must not cost 100,000 writes).
class Output {
 public:
  explicit Output(std::FILE* file) : file_(file) {}
  ~Output() { flush(); }
  void line(const std::string& text);
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
