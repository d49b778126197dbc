#!/usr/bin/env bash
# Unpack a device call's recording tarball (rec.tgz) here, replacing the tables it holds:
#   bash bench/unpack_recording.sh <files_at>/rec.tgz
# A call packs each recording whole (every table as the device had it: this tree's rows and the call's
# new ones) and compacted (`compact_and_finish` in bench/lib_pack.sh: each run's parts as one part under
# the name of its first). Untarring over the tree would leave a run's old parts beside its merged part
# wherever this tree held that run uncompacted (a call stopped before it compacted), and those rows would
# then be held twice. So each table folder the tarball holds is removed here first; everything else in the
# tarball (logs, gpu_verdicts.*) is unpacked over the tree as before.
set -eu
TARBALL=${1:?usage: bash bench/unpack_recording.sh RECORDING_TARBALL}
[ -f "$TARBALL" ] || { echo "error: $TARBALL is not a file" >&2; exit 2; }
listing=$(tar tzf "$TARBALL") || { echo "error: $TARBALL is not a readable tarball" >&2; exit 2; }
tables=$(echo "$listing" | grep -E '^[^/].*/(profiles|rewards|candidates)/$' | sort -u || true)
[ -n "$tables" ] || { echo "error: $TARBALL holds no recording table (profiles/, rewards/, candidates/)" >&2; exit 2; }
for table in $tables; do  # every path checked before any folder is removed
  case "$table" in
    ..*|*/../*) echo "error: $TARBALL names a path outside the tree: $table" >&2; exit 2 ;;
  esac
done
for table in $tables; do rm -rf "./$table"; done
tar xzf "$TARBALL"
echo "unpacked $TARBALL: $(echo "$tables" | wc -w) tables replaced ($(echo $tables | tr ' ' ','))"
