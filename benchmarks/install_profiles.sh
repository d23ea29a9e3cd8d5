#!/usr/bin/env bash
# Size and install time of each install profile (README "Install"): a fresh virtual
# environment per extra, `pip install -e ".[extra]"`, the venv's size over an empty one.
# Usage: bash benchmarks/install_profiles.sh [extra ...]   (default: every profile)
# Times depend on pip's cache and the network; sizes do not.
set -u
cd "$(dirname "$0")/.."
profiles=("$@")
[ ${#profiles[@]} -eq 0 ] && profiles=(core sim board hw pynq dse dev)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
python3 -m venv "$work/empty"
empty=$(du -sm "$work/empty" | cut -f1)
printf '%-8s %10s %10s %10s\n' profile "size MB" seconds packages
for profile in "${profiles[@]}"; do
  venv="$work/$profile"
  python3 -m venv "$venv"
  spec=".[$profile]"; [ "$profile" = core ] && spec="."
  start=$(date +%s)
  if ! "$venv/bin/pip" install -q -e "$spec" > "$work/$profile.log" 2>&1; then
    echo "$profile: pip install failed:"; tail -5 "$work/$profile.log"; continue
  fi
  took=$(( $(date +%s) - start ))
  size=$(( $(du -sm "$venv" | cut -f1) - empty ))
  packages=$("$venv/bin/pip" list 2>/dev/null | tail -n +3 | wc -l)
  printf '%-8s %10s %10s %10s\n' "$profile" "$size" "$took" "$packages"
  rm -rf "$venv"
done
