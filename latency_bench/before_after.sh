#!/usr/bin/env bash
# Before and after a change, in one sitting: served motion-to-photon over WebRTC, fMP4 and LiveKit, the engine
# alone at 1, 2 and 4 sessions, and the hostile list (`make attack`), for two checkouts one after the other.
#
#   latency_bench/before_after.sh BEFORE_DIR AFTER_DIR OUT_DIR [SECONDS]
#   SKIP_ATTACK=1 latency_bench/before_after.sh AFTER_DIR BEFORE_DIR OUT_DIR   # a second sitting, reversed
#
# Each checkout needs a Python environment in DIR/.venv where `worldcast` is that checkout (an editable install)
# and a built demo (DIR/web_demo/dist); LiveKit needs `make livekit-server`. The runs alternate nothing: the
# checkouts run in order, so a machine that changes its speed between them shows in the engine-alone rows,
# which are the calibration (run it again reversed to cancel a drift). Output: OUT_DIR/<first|second>-<commit>/*.log
# and each run's report folder.
set -euo pipefail
before=$1 after=$2 out=$3 seconds=${4:-10}
mkdir -p "$out"
for side in before after; do
  dir=${!side}
  py="$dir/.venv/bin/python"
  d="$out/$([ "$side" = before ] && echo first || echo second)-$(git -C "$dir" rev-parse --short HEAD)"
  mkdir -p "$d"
  echo "== $side: $(git -C "$dir" rev-parse --short HEAD) ($dir)"
  (cd "$dir" && "$py" -m worldcast.latency_bench mtp --transport fmp4 --seconds "$seconds" --out "$d/fmp4" \
      > "$d/mtp_fmp4.log" 2>&1) || echo "   mtp fmp4 failed: $d/mtp_fmp4.log"
  (cd "$dir" && "$py" -m worldcast.latency_bench mtp --transport livekit --seconds "$seconds" --out "$d/livekit" \
      > "$d/mtp_livekit.log" 2>&1) || echo "   mtp livekit failed: $d/mtp_livekit.log"
  for n in 1 2 4; do
    (cd "$dir" && "$py" -m worldcast.latency_bench.engine_bench --sessions "$n" --seconds "$seconds" --modes on \
        > "$d/engine_$n.log" 2>&1) || echo "   engine_bench $n failed: $d/engine_$n.log"
  done
  if [ -z "${SKIP_ATTACK:-}" ]; then
    (cd "$dir" && "$py" -m tests.attack --out "$d/attack_report.json" > "$d/attack.log" 2>&1) \
        || echo "   attack: a case failed (or the run did): $d/attack.log"
  fi
done
echo "done: $out"
