# Sourced by the launch scripts. `forward_signals MODE COMMAND...` runs COMMAND in the background, passes
# SIGTERM/SIGINT (a scheduler's preemption, Ctrl-C) on to the training processes, waits for them, and
# returns COMMAND's exit code: the ranks finish their step, save a checkpoint and exit 0.
#   MODE ranks:  COMMAND is the deepspeed launcher on one node, which does not forward signals (it would die
#                and orphan the ranks): the ranks, its grandchildren, are signalled themselves.
#   MODE direct: COMMAND is signalled (one training process, or the launcher across nodes, which forwards).
# The ranks get as long as they need to save; a scheduler's own kill timeout (SLURM's KillWait, Kubernetes'
# terminationGracePeriodSeconds) must leave room for a step and a checkpoint.
_fwd_pid=""
_fwd_mode=""
_fwd_interrupted=0

_forward_stop() {
  _fwd_interrupted=1
  if [ "$_fwd_mode" = ranks ]; then
    python - "$_fwd_pid" <<'PY' || kill -TERM "$_fwd_pid" 2>/dev/null
import signal, sys
import psutil
for launch in psutil.Process(int(sys.argv[1])).children():
    for rank in launch.children():
        rank.send_signal(signal.SIGTERM)
PY
  else
    kill -TERM "$_fwd_pid" 2>/dev/null || true
  fi
}

forward_signals() {
  _fwd_mode="$1"; shift
  "$@" &
  _fwd_pid=$!
  _fwd_interrupted=0
  local status=0
  trap _forward_stop TERM INT
  wait "$_fwd_pid" || status=$?
  # a signal interrupts `wait` (status 128+n): wait again for the command's own exit code
  while [ "$_fwd_interrupted" = 1 ]; do _fwd_interrupted=0; status=0; wait "$_fwd_pid" || status=$?; done
  trap - TERM INT
  return "$status"
}
