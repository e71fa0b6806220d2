#!/bin/bash
cd /work/calc || exit 0
reward=0
if [ "$(git cat-file -t v1.0.0 2>/dev/null)" = "tag" ] \
   && [ "$(git rev-parse 'v1.0.0^{commit}')" = "$(git rev-parse main)" ] \
   && [ "$(git tag -l --format='%(contents:subject)' v1.0.0)" = "First release" ]; then
  reward=1
fi
echo $reward > /logs/verifier/reward.txt
