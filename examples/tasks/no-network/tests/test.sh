#!/bin/bash
# Verifier (runs as root, cwd = workdir /app). Writes /logs/verifier/reward.json:
#   solved         1.0 if interfaces.txt lists exactly the interfaces in /proc/net/dev
#   isolated       1.0 if a TCP connect to 1.1.1.1:53 fails, i.e. no interface is
#                  usable for outside traffic (fail closed: a probe that crashes or
#                  prints anything unexpected counts as reachable)
#   only_loopback  1.0 if "lo" is the only interface (informational: a firewalled
#                  sandbox may keep an unusable eth0, so this does not gate reward)
#   reward         1.0 only when solved and isolated
# No `set -e`: a failed check must lower a score, never skip writing the reward.
set -u
mkdir -p /logs/verifier
ifaces=$(awk -F: 'NR > 2 { gsub(/ /, "", $1); print $1 }' /proc/net/dev | LC_ALL=C sort)
solved=0.0
[ -f interfaces.txt ] && [ "$(cat interfaces.txt)" = "$ifaces" ] && solved=1.0
probe=$(timeout 5 python3 -c '
import socket
try:
    socket.create_connection(("1.1.1.1", 53), timeout=3).close()
    print("reachable")
except OSError:
    print("unreachable")
' 2>/dev/null)
isolated=0.0
[ "$probe" = unreachable ] && isolated=1.0
only_loopback=0.0
[ "$ifaces" = lo ] && only_loopback=1.0
reward=0.0
[ "$solved$isolated" = 1.01.0 ] && reward=1.0
printf '{"reward": %s, "solved": %s, "isolated": %s, "only_loopback": %s}\n' \
  "$reward" "$solved" "$isolated" "$only_loopback" > /logs/verifier/reward.json
echo "interfaces: $(echo $ifaces); probe: ${probe:-<none>}"
cat /logs/verifier/reward.json
