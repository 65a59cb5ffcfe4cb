#!/usr/bin/env bash
# Runs a sweep as a Slurm job array of N shards and merges the shards into one file with a
# dependent job. Usage (from the folder paths are relative to, usually the repository):
#
#   scripts/slurm_sweep.sh CONFIG.yaml N [-o OUT.h5] [SBATCH_OPTION...]
#
#   N            number of shards = array tasks (sweep --shard auto in each)
#   -o OUT.h5    the merged output (default: the config's output); shard K is written to
#                OUT.shard-K-of-N.h5 and logs beside it (OUT.shard-K-of-N.log, OUT.merge.log)
#   SBATCH_OPTION...  passed to both sbatch calls, e.g. --partition=cpu --time=2:00:00
#                --cpus-per-task=32 (each task runs its shard on the CPUs Slurm gives it)
#
# The merge job runs once every task has ended (afterany), so a failed or timed-out task
# shows up in OUT.merge.log as `sweep merge` lists it: the missing runs and the exact
# command that computes or finishes them. Then merge again with the command this script
# prints. SWEEP=path/to/sweep overrides the program (default: build/sweep beside this
# script). Prints the two job ids; exit 2 on bad arguments or a bad config (checked with
# sweep --dry-run before anything is submitted).
set -euo pipefail

usage() {
  sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//' >&2
  exit 2
}

sweep=${SWEEP:-$(cd "$(dirname "$0")/.." && pwd)/build/sweep}
[[ $# -ge 2 ]] || usage
config=$1 tasks=$2
shift 2
[[ $tasks =~ ^[1-9][0-9]*$ ]] || { echo "slurm_sweep.sh: N must be a whole number >= 1, got '$tasks'" >&2; exit 2; }
output=
sbatch_options=()
while [[ $# -gt 0 ]]; do
  case $1 in
    -o|--output) [[ $# -ge 2 ]] || usage; output=$2; shift 2 ;;
    -h|--help) usage ;;
    *) sbatch_options+=("$1"); shift ;;
  esac
done
[[ -x $sweep ]] || { echo "slurm_sweep.sh: no sweep program at $sweep (build it, or set SWEEP)" >&2; exit 2; }
command -v sbatch > /dev/null || { echo "slurm_sweep.sh: sbatch not found (not on a Slurm cluster?)" >&2; exit 2; }

# Validates the config (exit 2 with its message) and learns its output.
output_args=()
[[ -n $output ]] && output_args=(-o "$output")
plan=$("$sweep" "$config" "${output_args[@]}" --dry-run) || exit $?
[[ -n $output ]] || output=$(sed -n 's/^output: //p' <<< "$plan")
stem=${output%.h5}

quote() { printf '%q' "$1"; }
shards=()
for ((k = 0; k < tasks; k++)); do shards+=("$(quote "$stem.shard-$k-of-$tasks.h5")"); done

# Array task K computes shard K of N (--shard auto reads SLURM_ARRAY_TASK_ID/COUNT).
array_job=$(sbatch --parsable --array=0-$((tasks - 1)) --job-name="sweep-$(basename "$stem")" \
  --output="$stem.shard-%a-of-$tasks.log" "${sbatch_options[@]}" <<EOF
#!/usr/bin/env bash
exec $(quote "$sweep") $(quote "$config") --shard auto -o $(quote "$stem").shard-\${SLURM_ARRAY_TASK_ID}-of-$tasks.h5 --quiet
EOF
)
array_job=${array_job%%;*}
merge_command="$(quote "$sweep") merge $(quote "$output") ${shards[*]}"
merge_job=$(sbatch --parsable --dependency="afterany:$array_job" --job-name="merge-$(basename "$stem")" \
  --output="$stem.merge.log" "${sbatch_options[@]}" <<EOF
#!/usr/bin/env bash
exec $merge_command
EOF
)
merge_job=${merge_job%%;*}

echo "array job $array_job: $tasks shards of $config -> $stem.shard-K-of-$tasks.h5"
echo "merge job $merge_job (after the array) -> $output; log $stem.merge.log"
echo "watch: squeue -j $array_job,$merge_job; merge again by hand: $merge_command"
