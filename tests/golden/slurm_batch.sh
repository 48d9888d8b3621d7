#!/bin/bash
#SBATCH --job-name=monkey-0123456789ab-hpc
#SBATCH --output=/shared/me/monkey/logs/%j.out
#SBATCH --open-mode=append
#SBATCH --nodes=1
#SBATCH --ntasks=1
#SBATCH --partition=gpu
#SBATCH --account=lab42
#SBATCH --qos=normal
#SBATCH --time=2:00:00
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
mkdir -p "$root" "$(dirname "$sock")"
python3 -I -c 'import sys; sys.path.insert(0, sys.argv.pop(1)); from monkey.client_agent.agent import main; main()' /shared/me/monkey/agent/AGENT --root "$root" --socket "$sock" \
    --idle-timeout 600 --heartbeat 5 &
agent=$!
# Slurm's warning before a time limit or a preemption: the agent's jobs get SIGTERM
# (checkpoint, then exit), as on a spot notice.
notice='import json, socket, sys; s = socket.socket(socket.AF_UNIX); s.connect(sys.argv[1]); f = s.makefile("rw"); r = lambda m: (f.write(json.dumps(m) + "\n"), f.flush(), f.readline()); [r({"id": 2, "op": "signal", "juid": j["juid"], "attempt": j["attempt"], "signal": "TERM", "grace": 60}) for j in json.loads(r({"id": 1, "op": "jobs"})[2])["jobs"]]'
trap 'python3 -I -c "$notice" "$sock"' USR1
wait "$agent"; code=$?
while kill -0 "$agent" 2>/dev/null; do wait "$agent"; code=$?; done
exit "$code"
