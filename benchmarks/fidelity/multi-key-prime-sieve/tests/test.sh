#!/bin/bash
# Two keys in reward.json: correctness (share of right answers) and performance (1 or 0).
cd /app

right=0
cases=0
for pair in "1 0" "2 0" "3 1" "10 4" "100 25" "7919 999" "1000000 78498"; do
  set -- $pair
  cases=$((cases + 1))
  got=$(timeout 20 python3 /app/count_primes.py "$1" 2>/dev/null)
  if [ "$got" = "$2" ]; then right=$((right + 1)); else echo "N=$1: got '$got', want $2"; fi
done
correctness=$(python3 -c "print(round($right / $cases, 4))")

performance=0
start=$(date +%s.%N)
got=$(timeout 10 python3 /app/count_primes.py 5000000 2>/dev/null)
status=$?
elapsed=$(python3 -c "print(round($(date +%s.%N) - $start, 2))")
if [ $status -eq 0 ] && [ "$got" = "348513" ]; then performance=1; fi
echo "N=5000000 took ${elapsed}s (status $status, output '$got')"

printf '{"correctness": %s, "performance": %s}\n' "$correctness" "$performance" > /logs/verifier/reward.json
cat /logs/verifier/reward.json
