#!/bin/bash
reward=1
expect() {
  local want=$1; shift
  local got
  got=$(/app/payment.sh "$@" 2>/dev/null)
  # bc writes ".84" for values below one: compare as numbers, to the cent.
  if ! awk -v got="$got" -v want="$want" 'BEGIN { d = got - want; exit !(got != "" && d < 0.005 && d > -0.005) }'; then
    echo "payment.sh $*: got '$got', want $want"; reward=0
  fi
}
expect 1264.14 200000 6.5 30
expect 840.12 10000 1.5 1
expect 100.00 1200 0 1
expect 0.84 10 0.5 1
echo $reward > /logs/verifier/reward.txt
