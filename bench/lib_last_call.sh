# Sourced by the recording scripts: refuse a device call that would measure again what the last call
# into the same recording measured. REC/last_call.json names the git sha (AUTOPROFILER_GIT_SHA, computed
# on the sending machine) of the last call that recorded there; it is packed with the rows. The same sha
# again means the tree was sent before that call's rec.tgz was unpacked and committed, so the rows it
# wrote are missing here and would be measured twice. SAME_SHA_OK=1 records anyway.
#   source bench/lib_last_call.sh
#   check_last_call REC || exit 2      # before any work
#   mark_last_call REC                 # when the recording starts
check_last_call() {
  local rec=$1
  [ -n "${AUTOPROFILER_GIT_SHA:-}" ] && [ "${SAME_SHA_OK:-0}" != 1 ] && [ -f "$rec/last_call.json" ] || return 0
  if grep -q "\"git_sha\": \"$AUTOPROFILER_GIT_SHA\"" "$rec/last_call.json"; then
    echo "the last call into $rec was sent git sha $AUTOPROFILER_GIT_SHA too: unpack and commit its rec.tgz first"
    return 1
  fi
}
mark_last_call() {
  printf '{"git_sha": "%s", "gpu": "%s", "started": "%s"}\n' "${AUTOPROFILER_GIT_SHA:-}" \
    "$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)" \
    "$(date -u +%Y-%m-%dT%H:%M:%SZ)" > "$1/last_call.json"
}
