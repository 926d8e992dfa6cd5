#!/usr/bin/env bash
# Static checks: gofmt, go vet, staticcheck. Reports every failure, then
# exits non-zero if any check failed.
set -uo pipefail
cd "$(dirname "$0")/.."
version=${1:-v0.8.2}
fail=0
unformatted=$(gofmt -l $(git ls-files '*.go' 2>/dev/null || find . -name '*.go'))
if [[ -n $unformatted ]]; then
    echo "gofmt: these files need formatting:"; echo "$unformatted"; fail=1
fi
go vet ./... || fail=1
sc=$(go env GOPATH)/bin/staticcheck
if [[ ! -x $sc ]] || ! "$sc" -version 2>/dev/null | grep -q "${version#v}"; then
    GOFLAGS= go install "honnef.co/go/tools/cmd/staticcheck@$version" || { echo "staticcheck: cannot install $version"; fail=1; }
fi
if [[ -x $sc ]]; then "$sc" ./... || fail=1; fi
if ((fail)); then echo "verify: FAILED"; exit 1; fi
echo "verify: ok"
