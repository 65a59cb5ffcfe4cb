#!/bin/bash
# A real one-node Slurm cluster runs scripts/slurm_sweep.sh:
#   slurm_test.sh SWEEP_EXE SOURCE_ROOT
# 1. starts munged, slurmctld and slurmd (Debian's munge and slurm-wlm) in the foreground
#    of a temporary folder: their own key, socket, ports, state and logs, no systemd;
# 2. submits scripts/slurm_sweep.sh on a small summation config in 3 shards, waits for the
#    array and the dependent merge job;
# 3. compares the merged file with a single-machine run of the config, dataset by dataset
#    and bit for bit (every attribute too, but `created`);
# 4. stops the daemons (trap), whatever happened.
# Exit 77 (meson: skipped), saying why, when the programs are missing or the daemons cannot
# start here; a job or comparison that goes wrong fails.
set -euo pipefail

sweep=${1:?usage: slurm_test.sh SWEEP_EXE SOURCE_ROOT}
root=${2:?usage: slurm_test.sh SWEEP_EXE SOURCE_ROOT}
python=/usr/bin/python3

skip() {
  echo "SKIP: $*"
  exit 77
}
fail() {
  echo "FAIL: $*"
  exit 1
}

for program in munged slurmctld slurmd sbatch squeue scontrol sinfo; do
  command -v "$program" > /dev/null || [[ -x /usr/sbin/$program ]] ||
    skip "$program not found: install Slurm with scripts/setup --slurm (Debian slurm-wlm and munge)"
done
PATH=$PATH:/usr/sbin

work=$(mktemp -d)
pids=()
stop_daemons() {
  for ((i = ${#pids[@]} - 1; i >= 0; i--)); do kill "${pids[i]}" 2> /dev/null || true; done
  for pid in "${pids[@]}"; do wait "$pid" 2> /dev/null || true; done
  rm -rf "$work"
}
trap stop_daemons EXIT
mkdir -p "$work/state" "$work/spool" "$work/log" "$work/run"
cd "$work"

show_logs() {
  for f in log/*; do
    echo "--- $f"
    tail -n 15 "$f"
  done
}

# Two free TCP ports for slurmctld and slurmd.
read -r ctld_port slurmd_port < <("$python" -c '
import socket
s = [socket.socket() for _ in range(2)]
for x in s: x.bind(("127.0.0.1", 0))
print(*(x.getsockname()[1] for x in s))')

# munge: a fresh key readable by this user only, and its own socket.
head -c 1024 /dev/urandom > munge.key
chmod 600 munge.key
munged --foreground --force --key-file="$work/munge.key" --socket="$work/run/munge.sock" \
  --pid-file="$work/run/munged.pid" --seed-file="$work/run/munged.seed" --log-file="$work/log/munged.log" \
  > log/munged.out 2>&1 &
pids+=($!)
for _ in $(seq 50); do [[ -S run/munge.sock ]] && break; sleep 0.1; done
[[ -S run/munge.sock ]] || { show_logs; skip "munged did not start here"; }

user=$(id -un)
node=$(hostname -s)
cpus=$(nproc)
cat > slurm.conf <<EOF
ClusterName=roundofftest
SlurmctldHost=$node(127.0.0.1)
SlurmctldPort=$ctld_port
SlurmdPort=$slurmd_port
AuthType=auth/munge
AuthInfo=socket=$work/run/munge.sock
CredType=cred/munge
SlurmUser=$user
SlurmdUser=$user
StateSaveLocation=$work/state
SlurmdSpoolDir=$work/spool
SlurmctldPidFile=$work/run/slurmctld.pid
SlurmdPidFile=$work/run/slurmd.pid
SlurmctldLogFile=$work/log/slurmctld.log
SlurmdLogFile=$work/log/slurmd.log
ProctrackType=proctrack/pgid
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SchedulerType=sched/builtin
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
ReturnToService=2
MpiDefault=none
NodeName=$node NodeAddr=127.0.0.1 CPUs=$cpus State=UNKNOWN
PartitionName=test Nodes=$node Default=YES MaxTime=10 State=UP
EOF
export SLURM_CONF=$work/slurm.conf

slurmctld -D -i > log/slurmctld.out 2>&1 &
pids+=($!)
slurmd -D -N "$node" > log/slurmd.out 2>&1 &
pids+=($!)
state=
for _ in $(seq 100); do
  state=$(sinfo -h -N -o %T 2> /dev/null || true)
  [[ $state == idle ]] && break
  sleep 0.2
done
[[ $state == idle ]] || { show_logs; skip "the one-node Slurm cluster did not come up here (node state '${state:-none}')"; }

# The sweep: 16 points x 3 replicas, so that shard boundaries split points.
cat > sum.yaml <<'EOF'
experiment: summation
seed: 3
replicas: 3
output: sum.h5
grid:
  series: [harmonic, uniform01]
  format: [fp16, bf16]
  rounding: [rne, sr]
  n: [100, 1000]
  trace_every: 50
EOF
"$sweep" sum.yaml -o reference.h5 --quiet -j 2 > /dev/null || fail "the single-machine run"

submitted=$(SWEEP=$sweep "$root/scripts/slurm_sweep.sh" sum.yaml 3 -o merged.h5 --time=5) ||
  { show_logs; fail "scripts/slurm_sweep.sh"; }
echo "$submitted"
array_job=$(sed -n 's/^array job \([0-9]*\):.*/\1/p' <<< "$submitted")
merge_job=$(sed -n 's/^merge job \([0-9]*\) .*/\1/p' <<< "$submitted")
[[ -n $array_job && -n $merge_job ]] || fail "no job ids in the script's output"

job_state() { scontrol show job -o "$1" 2> /dev/null | grep -o 'JobState=[A-Z_]*' | head -n 1 | cut -d= -f2; }
merge_state=
for _ in $(seq 450); do
  merge_state=$(job_state "$merge_job")
  case $merge_state in COMPLETED | FAILED | CANCELLED | TIMEOUT | NODE_FAIL | OUT_OF_MEMORY) break ;; esac
  sleep 0.2
done
echo "merge job $merge_job: ${merge_state:-unknown}"
for k in 0 1 2; do
  [[ -f merged.shard-$k-of-3.h5 ]] || { show_logs; cat ./*.log 2> /dev/null || true; fail "shard $k/3 was not written"; }
done
[[ $merge_state == COMPLETED ]] || { show_logs; cat merged.merge.log 2> /dev/null || true; fail "the merge job ended ${merge_state:-never}"; }
grep -q "wrote merged.h5 from 3 shards" merged.merge.log || fail "the merge log does not report the merge"

"$python" - reference.h5 merged.h5 <<'EOF'
"""Bit-for-bit comparison of two sweep outputs: the same objects, attributes (root
`created` aside), dataset shapes, types and bytes (strings by text)."""
import sys
import h5py
import numpy as np

def values(x):
    data = x[()] if isinstance(x, h5py.Dataset) else x
    if isinstance(x, h5py.Dataset) and h5py.check_string_dtype(x.dtype):
        return [str(s) for s in x.asstr()[()].ravel()]
    array = np.asarray(data)
    if array.dtype.kind == "O":
        return [v.decode() if isinstance(v, bytes) else v for v in array.ravel()]
    return (array.shape, array.dtype.str, np.ascontiguousarray(array).tobytes())

with h5py.File(sys.argv[1], "r") as a, h5py.File(sys.argv[2], "r") as b:
    names_a, names_b = [], []
    a.visit(names_a.append)
    b.visit(names_b.append)
    assert sorted(names_a) == sorted(names_b), (names_a, names_b)
    for name in [None] + names_a:
        x, y = (a, b) if name is None else (a[name], b[name])
        assert sorted(x.attrs) == sorted(y.attrs), (name, list(x.attrs), list(y.attrs))
        for key in x.attrs:
            if name is None and key == "created":
                continue
            assert values(x.attrs[key]) == values(y.attrs[key]), (name, key)
        if isinstance(x, h5py.Dataset):
            assert x.shape == y.shape and x.dtype == y.dtype, name
            assert values(x) == values(y), name
    assert b.attrs["status"] == "complete"
print("merged.h5 equals the single-machine run: %d objects" % len(names_a))
EOF
