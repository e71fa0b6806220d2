#!/bin/bash
problems=()
[ "$(pwd)" = /srv/handoff ] || problems+=("the working directory is $(pwd), not /srv/handoff")
[ "$(stat -c '%U:%G %a' /srv/handoff/inbox 2>&1)" = "ubuntu:ubuntu 750" ] \
  || problems+=("inbox: $(stat -c '%U:%G %a' /srv/handoff/inbox 2>&1)")
[ "$(jq -r '.owner' manifest.json 2>&1)" = ubuntu ] || problems+=("manifest owner: $(jq -r '.owner' manifest.json 2>&1)")
[ "$(jq '.uid' manifest.json 2>&1)" = 1000 ] || problems+=("manifest uid: $(jq '.uid' manifest.json 2>&1)")
[ "$(jq -r '.inbox' manifest.json 2>&1)" = /srv/handoff/inbox ] || problems+=("manifest inbox: $(jq -r '.inbox' manifest.json 2>&1)")
su -s /bin/sh ubuntu -c 'touch /srv/handoff/inbox/probe' || problems+=("ubuntu cannot write into its inbox")

if [ ${#problems[@]} -eq 0 ]; then
  echo 1 > /logs/verifier/reward.txt
else
  printf '%s\n' "${problems[@]}"
  echo 0 > /logs/verifier/reward.txt
fi
