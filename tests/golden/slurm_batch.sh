#!/bin/bash
#SBATCH --job-name=monkey-0123456789ab-hpc
#SBATCH --output=/shared/me/monkey/logs/%j.out
#SBATCH --open-mode=append
#SBATCH --nodes=1
#SBATCH --ntasks=1
#SBATCH --partition=gpu
#SBATCH --account=lab42
#SBATCH --qos=normal
#SBATCH --time=1:03:00
#SBATCH --constraint=a100
#SBATCH --cpus-per-task=4
#SBATCH --mem=16384M
#SBATCH --gres=gpu:2
#SBATCH --signal=B:USR1@120
#SBATCH --requeue
#SBATCH --nice=10
#SBATCH --comment=from monkey
# monkey: this allocation runs monkey's agent, which runs one attempt of a monkey
# job; its logs, events and exit code are in the attempt's run directory.
root=/shared/me/monkey/alloc/"$SLURM_JOB_ID"
sock=/shared/me/monkey/alloc/"$SLURM_JOB_ID"/agent.sock
mkdir -p "$root"
(umask 077 && mkdir -p "$(dirname "$sock")")  # private: maybe /tmp/monkey-UID
python3 -I -c 'import sys; sys.path.insert(0, sys.argv.pop(1)); from monkey.client_agent.agent import main; main()' /shared/me/monkey/agent/AGENT --root "$root" --socket "$sock" \
    --idle-timeout 600 --heartbeat 5 --term-notice 30 \
    --slurm-log /shared/me/monkey/logs/"$SLURM_JOB_ID".out &  # where Slurm says why it ends the allocation
agent=$!
# Slurm's warning 120s before the time limit, and its SIGTERM on a requeue or a
# preemption: the agent's jobs get SIGTERM (checkpoint, then exit), as on a spot
# notice, and end `preempted`; monkey resumes them as their next attempt. A
# scancel's SIGTERM stops them too, and they end `failed` (retried as a failure).
notice='import json, socket, sys; s = socket.socket(socket.AF_UNIX); s.connect(sys.argv[1]); s.sendall(json.dumps({"id": 1, "op": "notice", "kind": "slurm", "lead": float(sys.argv[2]), "detail": sys.argv[3]}).encode() + b"\n"); s.recv(65536)'
trap 'python3 -I -c "$notice" "$sock" 120 "Slurm: time limit of allocation $SLURM_JOB_ID in 120s"' USR1
trap 'kill -TERM "$agent" 2>/dev/null' TERM
wait "$agent"; code=$?
while kill -0 "$agent" 2>/dev/null; do wait "$agent"; code=$?; done
exit "$code"
