#!/usr/bin/env bash
# Every mermaid diagram in the docs parses (hack/docscheck/mermaid/check.mjs:
# mermaid's own parser under jsdom, the versions pinned by its
# package-lock.json). The npm modules are installed once per machine, in a
# cache directory named after the lock file's hash.
#
# Usage: hack/docscheck/mermaid.sh [FILE.md...]   (default: every tracked
#   Markdown file holding a ```mermaid block)
# Environment: VHOSTMQ_MERMAID_CACHE (default /var/cache/vhostmq/mermaid)
set -euo pipefail
cd "$(dirname "$0")/../.."
src=hack/docscheck/mermaid
if ! command -v node >/dev/null || ! command -v npm >/dev/null; then
    echo "mermaid: node and npm are needed (hack/install-deps.sh installs nodejs)" >&2
    exit 1
fi
lock=$(sha256sum "$src/package-lock.json" | cut -c1-16)
dir=${VHOSTMQ_MERMAID_CACHE:-/var/cache/vhostmq/mermaid}/$lock
if [[ ! -f $dir/.installed ]]; then
    rm -rf "$dir" && mkdir -p "$dir"
    cp "$src/package.json" "$src/package-lock.json" "$dir/"
    echo "mermaid: npm ci into $dir"
    if ! timeout 600 npm ci --prefix "$dir" --no-audit --no-fund >"$dir/npm.log" 2>&1; then
        tail -20 "$dir/npm.log" >&2
        echo "mermaid: npm ci failed (log: $dir/npm.log)" >&2
        exit 1
    fi
    touch "$dir/.installed"
fi
cp "$src/check.mjs" "$dir/check.mjs"
if (($# == 0)); then
    mapfile -t files < <(git grep -l '^```mermaid' -- '*.md')
    set -- "${files[@]}"
fi
timeout 120 node "$dir/check.mjs" "$@"
