#!/bin/bash
# Verifier (runs as root, cwd = workdir /app, in a separate exec after the
# agent/solution has returned). Writes /logs/verifier/reward.json:
#   session   1.0 if tmux session "ticker" still exists
#   pid_alive 1.0 if the PID in ticker.pid is a live process
#   output    1.0 if heartbeat.txt exists and holds an integer
#   updating  1.0 if heartbeat.txt increased over ~2.5 s (the writer really runs)
#   reward    1.0 only when all four hold
# No `set -e`: a failed check must lower a score, never skip writing the reward.
set -u
mkdir -p /logs/verifier
session=0.0; pid_alive=0.0; output=0.0; updating=0.0
tmux has-session -t ticker 2>/dev/null && session=1.0
pid=$(tr -d '[:space:]' < ticker.pid 2>/dev/null)
[[ "$pid" =~ ^[0-9]+$ ]] && kill -0 "$pid" 2>/dev/null && pid_alive=1.0
a=$(cat heartbeat.txt 2>/dev/null)
if [[ "$a" =~ ^[0-9]+$ ]]; then
  output=1.0
  sleep 2.5
  b=$(cat heartbeat.txt 2>/dev/null)
  [[ "$b" =~ ^[0-9]+$ ]] && [ "$b" -gt "$a" ] && updating=1.0
fi
reward=0.0
[ "$session$pid_alive$output$updating" = 1.01.01.01.0 ] && reward=1.0
printf '{"reward": %s, "session": %s, "pid_alive": %s, "output": %s, "updating": %s}\n' \
  "$reward" "$session" "$pid_alive" "$output" "$updating" > /logs/verifier/reward.json
cat /logs/verifier/reward.json
