#!/bin/bash
cd /app
pass=0
total=0

run_case() {
  local want=$1; shift
  total=$((total + 1))
  local got
  got=$(python /app/convert.py "$@" 2>/dev/null)
  if [ "$got" = "$want" ]; then pass=$((pass + 1)); else echo "convert.py $*: got '$got', want '$want'"; fi
}

run_case 30.48 1 --from ft --to cm
run_case 2.5 2500 --from m --to km
run_case 3 36 --from in --to ft
run_case 0.0394 1 --from mm --to in
run_case 1000000 1 --from km --to mm

total=$((total + 1))
python /app/convert.py 1 --from parsec --to m >/dev/null 2>&1
if [ $? -eq 2 ]; then pass=$((pass + 1)); else echo "an unknown unit must exit with 2"; fi

echo "$pass/$total checks passed"
if [ "$pass" -eq "$total" ]; then echo 1; else echo 0; fi > /logs/verifier/reward.txt
