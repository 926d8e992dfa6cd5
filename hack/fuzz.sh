#!/usr/bin/env bash
# Runs every fuzz target in the module for the given time each (default
# 30s) and prints the executions each one ran.
set -euo pipefail
cd "$(dirname "$0")/.."
fuzztime=${1:-30s}
mapfile -t pkgs < <(go list ./...)
for pkg in "${pkgs[@]}"; do
    dir=$(go list -f '{{.Dir}}' "$pkg")
    while read -r t; do
        [[ -n $t ]] || continue
        echo "== $pkg $t ($fuzztime)"
        go test -run='^$' -fuzz="^$t\$" -fuzztime="$fuzztime" -fuzzminimizetime=200x "$pkg" 2>&1 | tail -n 3
    done < <(grep -ho '^func Fuzz[A-Za-z0-9_]*' "$dir"/*_test.go 2>/dev/null | sed 's/^func //')
done
