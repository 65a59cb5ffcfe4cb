#include "experiments/sweep/cli.hpp"

int main(int argc, char** argv) { return roundoff::sweep::sweep_main(argc, argv); }
