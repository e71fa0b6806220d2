#!/bin/bash
# Verifier (runs as root, per task.toml). Writes reward.json:
#   named       1.0 if /home/agent/whoami.txt says "agent"
#   owned       1.0 if that file belongs to uid 1000 (the agent really ran as agent)
#   confined    1.0 if the agent user cannot write /etc
#   reward      1.0 only when all three hold
set -u
mkdir -p /logs/verifier
f=/home/agent/whoami.txt
named=0.0; owned=0.0; confined=0.0
[ "$(tr -d '[:space:]' < "$f" 2>/dev/null)" = agent ] && named=1.0
[ "$(stat -c %u "$f" 2>/dev/null)" = 1000 ] && owned=1.0
su agent -s /bin/sh -c 'touch /etc/agent-was-here' 2>/dev/null || confined=1.0
reward=0.0
[ "$named$owned$confined" = 1.01.01.0 ] && reward=1.0
printf '{"reward": %s, "named": %s, "owned": %s, "confined": %s}\n' "$reward" "$named" "$owned" "$confined" > /logs/verifier/reward.json
cat /logs/verifier/reward.json
