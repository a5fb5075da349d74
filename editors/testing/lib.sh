# Shared by the editor tests (sourced): the stub OpenAI server and small helpers.

# start_stub LOG: starts editors/testing/stub_openai.py on a free port; sets STUB_URL and STUB_PID.
start_stub() {
  local log="$1" dir
  dir="$(mktemp -d)"
  python3 "$(dirname "${BASH_SOURCE[0]}")/stub_openai.py" --port-file "$dir/port" --log "$log" 2> "$log.stderr" &
  STUB_PID=$!
  for _ in $(seq 100); do
    [ -s "$dir/port" ] && break
    sleep 0.1
  done
  if [ ! -s "$dir/port" ]; then
    echo "the stub OpenAI server did not start" >&2
    return 1
  fi
  STUB_URL="http://127.0.0.1:$(cat "$dir/port")/v1"
  rm -rf "$dir"
}

stop_stub() {
  if [ -n "${STUB_PID:-}" ]; then
    kill "$STUB_PID" 2>/dev/null || true
    wait "$STUB_PID" 2>/dev/null || true
    STUB_PID=
  fi
}
