#!/usr/bin/env bash
# Runs one libFuzzer target for SECONDS from its seeds: run_fuzz.sh TARGET SECONDS SEED_DIR...
# With $SEED_CONFIG, a sweep output of it ($SWEEP) is one more seed (the HDF5 readers'
# target) and inputs up to twice its size are tried. Prints the runs made; a crash, leak,
# UB report, timeout or out-of-memory fails it, the input kept as crash-* etc. in the
# working folder. The seed folders are only read: what the run adds goes to a temporary one.
set -euo pipefail
target=$1 seconds=$2
shift 2
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
max_len=4096
seeds=("$@")
mkdir -p "$work/seeds"
seeds+=("$work/seeds")
# Findings that are HDF5 files are committed gzipped (no HDF5 file in the tree): unpacked
# into the working seeds.
for found in $(find "$@" -name '*.gz'); do
  gzip -dc "$found" > "$work/seeds/$(basename "$found" .gz)"
done
if [ -n "${SEED_CONFIG:-}" ]; then
  "$SWEEP" "$SEED_CONFIG" -o "$work/seeds/seed.h5" --quiet > /dev/null
  max_len=$(( $(stat -c %s "$work/seeds/seed.h5") * 2 ))
fi
mkdir -p "$work/corpus"
# UBSan only prints by default: here a report is a finding. HDF5's own leaks are not (lsan.supp).
export UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1${UBSAN_OPTIONS:+:$UBSAN_OPTIONS}
export LSAN_OPTIONS=suppressions=$(dirname "$0")/lsan.supp:print_suppressions=0${LSAN_OPTIONS:+:$LSAN_OPTIONS}
# -timeout: one input over 10 s is a finding; -rss_limit_mb: so is more than 2 GiB.
"$target" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -max_len="$max_len" \
  -print_final_stats=1 "$work/corpus" "${seeds[@]}" 2> "$work/log" || { tail -60 "$work/log"; exit 1; }
grep -E '^(Done|stat::number_of_executed_units|stat::peak_rss_mb|stat::new_units_added)' "$work/log" || tail -5 "$work/log"
echo "corpus: $(find "$work/corpus" -type f | wc -l) inputs added to $(find "${seeds[@]}" -type f | wc -l) seeds"
