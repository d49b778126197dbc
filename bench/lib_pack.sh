# Sourced by the recording scripts: pack what a call has recorded into one tarball under $OUT while it
# runs, so a call the device tool stops at its limit (a cold start leaves less time than the script's
# budget) still brings back every part written so far.
#   source bench/lib_pack.sh
#   start_packing "$OUT/rec.tgz" PATH...    # packs every 30 s (PACK_EVERY) in the background
#   ...the recording...
#   finish_packing                          # stops the background packer, packs once more
#   compact_and_finish RECORDING            # or: stops it, compacts the recording's tables, packs once more
# Table parts are written atomically (a hidden .tmp, then a rename), so the pack leaves .tmp files out
# and holds whole parts only; each pack goes to its own .part file, then is renamed over the tarball.
pack_now() {  # pack_now TARBALL PATH...
  local dest=$1; shift
  local part="$dest.$BASHPID.part" rc=0 paths=() path
  for path in "$@"; do [ -e "$path" ] && paths+=("$path"); done  # a path not made yet: not an error
  [ ${#paths[@]} -gt 0 ] || return 0
  tar czf "$part" --exclude=.timing.lock --exclude='.*.tmp' "${paths[@]}" 2>/dev/null || rc=$?
  # GNU tar exits 1 when a file appeared or went while it read (a part renamed in, a merged table's old
  # parts removed): the archive is whole, and every part in it is a whole part
  if [ "$rc" -le 1 ]; then mv -f "$part" "$dest"; else rm -f "$part"; fi
}
start_packing() {  # start_packing TARBALL PATH...
  PACK_ARGS=("$@")
  # stderr off: the loop's shell reports its sleep killed by stop_packing as "Terminated"
  ( while sleep "${PACK_EVERY:-30}"; do pack_now "${PACK_ARGS[@]}"; done ) 2>/dev/null &
  PACKER=$!
  trap stop_packing EXIT
}
stop_packing() {
  [ -n "${PACKER:-}" ] || return 0
  pkill -P "$PACKER" 2>/dev/null; kill "$PACKER" 2>/dev/null; wait "$PACKER" 2>/dev/null
  rm -f "${PACK_ARGS[0]}".*.part; PACKER=
}
finish_packing() { stop_packing; pack_now "${PACK_ARGS[@]}"; }
compact_and_finish() {  # compact_and_finish RECORDING: each run's parts as one (every row kept), then pack
  # The packer is stopped first, so no pack reads a run while its parts are merged. Every run brought back
  # is compacted, so unpacking here puts a merged part over the same name, never beside its old parts.
  stop_packing
  python3 -m autoprofiler.cli compact "$1" | sed 's/^/compact: /'
  pack_now "${PACK_ARGS[@]}"
}
