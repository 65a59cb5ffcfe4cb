// build/emu: the command-line calculator. Exit status per CONTRACT.md: 0 success,
// 1 internal error (a bug) or a failed write to standard output ("emu: write error:
// ..."), 2 bad input.
#include <cstdio>
#include <exception>
#include <string>
#include <vector>

#include "commands.hpp"
#include "options.hpp"

int main(int argc, char** argv) {
  using namespace emu::cli;
  std::vector<std::string> args(argv + 1, argv + argc);
  std::string command;
  try {
    if (args.empty()) throw UsageError("emu: no subcommand (known: info round eval dot gemm quantize; see emu --help)");
    command = args.front();
    args.erase(args.begin());
    if (command == "--help" || command == "-h" || command == "help") {
      const char* text = help_text(args.empty() ? "" : args.front());
      if (text == nullptr) throw UsageError("emu help: unknown subcommand '" + args.front() + "'");
      Output out(stdout);
      out.text(text);
      out.flush();
      return 0;
    }
    if (help_text(command) == nullptr || command.empty())
      throw UsageError("emu: unknown subcommand '" + command + "' (known: info round eval dot gemm quantize; see emu --help)");
    for (const auto& a : args) {
      if (a == "--") break;
      if (a == "--help" || a == "-h") {
        Output out(stdout);
        out.text(help_text(command));
        out.flush();
        return 0;
      }
    }
    Output out(stdout);
    const int status = run_command(command, args, out);
    out.flush();  // a full disk or closed stdout is an error, not a success
    return status;
  } catch (const WriteError& e) {
    std::fprintf(stderr, "emu: write error: %s\n", e.what());
    return 1;
  } catch (const UsageError& e) {
    std::fflush(stdout);
    // Every message names the program and, where there is one, the subcommand.
    const std::string message = e.what();
    const bool named = message.compare(0, 4, "emu ") == 0 || message.compare(0, 4, "emu:") == 0;
    std::fprintf(stderr, "%s%s\n", named ? "" : ("emu " + command + ": ").c_str(), message.c_str());
    return 2;
  } catch (const std::exception& e) {
    std::fflush(stdout);
    std::fprintf(stderr, "emu: internal error (this is a bug in roundoff, please report it): %s\n", e.what());
    return 1;
  }
}
