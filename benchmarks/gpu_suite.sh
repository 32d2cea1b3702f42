#!/usr/bin/env bash
# On a GPU machine: run benchmarks/gpu_check.py on every bundle that benchmarks/gpu_bundles.py wrote.
#
#   bash benchmarks/gpu_suite.sh BUNDLES OUT
#
# Each bundle is checked launch by launch and as a whole model against the CPU backend and timed;
# a PET partial pair (partial-RULE-original / -composite) is also timed against each other in
# interleaved rounds (gpu_check.py --compare). Writes OUT/log.txt and OUT/results.tgz (one JSON per
# bundle); exits non-zero when any check failed.
set -u
bundles=$1
out=$2
here=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$out/json"
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.max.mem --format=csv >"$out/log.txt" 2>&1
status=0
for dir in "$bundles"/*/; do
    name=$(basename "$dir")
    extra=()
    if [[ $name == partial-*-original ]]; then
        extra=(--compare "$bundles/${name%-original}-composite")
        [[ -d "$bundles/${name%-original}-h200" ]] && extra+=("$bundles/${name%-original}-h200")
    fi
    echo "== $name" >>"$out/log.txt"
    timeout 150 python3 "$here/gpu_check.py" "$dir" --budget-s 20 --json "$out/json/$name.json" "${extra[@]}" >>"$out/log.txt" 2>&1
    rc=$?
    echo "== $name rc=$rc" >>"$out/log.txt"
    [[ $rc -ne 0 ]] && status=1
done
tar czf "$out/results.tgz" -C "$out" json && rm -rf "$out/json"
exit $status
