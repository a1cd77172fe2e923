# Sourced by the peer scripts: wait_up PORT PID waits (up to 240 s) until the server on PORT answers
# /health, and fails at once when process PID (the server) is gone.
wait_up() {
  for _ in $(seq 1 240); do
    curl -sf "http://127.0.0.1:$1/health" >/dev/null && return 0
    kill -0 "$2" 2>/dev/null || return 1
    sleep 1
  done
  return 1
}
