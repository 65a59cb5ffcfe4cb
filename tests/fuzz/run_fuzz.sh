#!/usr/bin/env bash
# Runs one libFuzzer target for SECONDS from its seeds: run_fuzz.sh TARGET SECONDS [SEED_DIR].
# No SEED_DIR: the seed is a small sweep output ($SWEEP on $SEED_CONFIG). Prints the runs
# made; a crash, leak, timeout or out-of-memory fails it, the input kept as crash-* etc.
# in the working folder.
set -euo pipefail
target=$1 seconds=$2 seeds=${3:-}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
max_len=4096
if [ -z "$seeds" ]; then
  seeds=$work/seeds
  mkdir -p "$seeds"
  "$SWEEP" "$SEED_CONFIG" -o "$seeds/seed.h5" --quiet > /dev/null
  max_len=$(( $(stat -c %s "$seeds/seed.h5") * 2 ))
fi
mkdir -p "$work/corpus"
# -timeout: one input over 10 s is a finding; -rss_limit_mb: so is more than 2 GiB.
"$target" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -max_len="$max_len" \
  -print_final_stats=1 "$work/corpus" "$seeds" 2> "$work/log" || { tail -60 "$work/log"; exit 1; }
grep -E '^(Done|stat::number_of_executed_units|stat::peak_rss_mb|stat::new_units_added)' "$work/log" || tail -5 "$work/log"
