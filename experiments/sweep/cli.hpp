// The `sweep` command line, callable in-process (tests register their own experiments and
// call it). Exit status: 0 ok, 1 internal error (a bug), 2 bad input, 130 interrupted.
#pragma once

namespace roundoff::sweep {

int sweep_main(int argc, char** argv);

}  // namespace roundoff::sweep
