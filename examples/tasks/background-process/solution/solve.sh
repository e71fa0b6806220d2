#!/bin/bash
# Reference solution: write the loop to a script (avoids nested quoting in the
# tmux command), run it in a detached tmux session, and wait for the first
# heartbeat so a broken start fails here rather than only in the verifier.
# The tmux server daemonises, so it outlives this exec; the verifier checks it
# from a later, separate exec.
set -euo pipefail
dir=$PWD
cat > "$dir/ticker.sh" <<'LOOP'
#!/bin/bash
echo $$ > ticker.pid
i=0
while :; do
  i=$((i + 1))
  # write-then-rename so a reader never sees a half-written file
  echo "$i" > heartbeat.tmp && mv -f heartbeat.tmp heartbeat.txt
  sleep 1
done
LOOP
chmod +x "$dir/ticker.sh"
tmux kill-session -t ticker 2>/dev/null || true
tmux new-session -d -s ticker -c "$dir" "$dir/ticker.sh"
for _ in $(seq 50); do
  [ -s "$dir/heartbeat.txt" ] && [ -s "$dir/ticker.pid" ] && exit 0
  sleep 0.1
done
echo "ticker did not start" >&2
exit 1
