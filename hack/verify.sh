#!/usr/bin/env bash
# Static checks: gofmt, go vet, staticcheck. Reports every failure, then
# exits non-zero if any check failed.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
version=${1:-v0.8.2}
fail=0
mapfile -t gofiles < <(git ls-files '*.go' 2>/dev/null || find . -name '*.go')
unformatted=$(gofmt -l "${gofiles[@]}")
if [[ -n $unformatted ]]; then
    echo "gofmt: these files need formatting:"; echo "$unformatted"; fail=1
fi
go vet ./... || fail=1
sc=$(go env GOPATH)/bin/staticcheck
if [[ ! -x $sc ]] || ! "$sc" -version 2>/dev/null | grep -q "${version#v}"; then
    GOFLAGS="" go install "honnef.co/go/tools/cmd/staticcheck@$version" || { echo "staticcheck: cannot install $version"; fail=1; }
fi
if [[ -x $sc ]]; then "$sc" ./... || fail=1; fi
if command -v shellcheck >/dev/null; then
    mapfile -t scripts < <(git ls-files 'hack/*.sh' 'hack/guest/*' .ci/run)
    shellcheck "${scripts[@]}" || fail=1
else
    echo "verify: shellcheck not installed (hack/install-deps.sh --with-shellcheck); scripts not checked"
fi
# The committed generated code must match the .proto files.
if command -v protoc >/dev/null; then
    gendirs=(dataplane/api/v1 cni/kubevirt/hookapi)
    tmp=$(mktemp -d)
    for d in "${gendirs[@]}"; do mkdir -p "$tmp/$d" && cp -a "$d/." "$tmp/$d/"; done
    hack/generate.sh >/dev/null
    for d in "${gendirs[@]}"; do
        if ! diff -r -q "$tmp/$d" "$d" >/dev/null; then
            echo "verify: $d is stale: run make generate and commit the result"
            cp -a "$tmp/$d/." "$d/"
            fail=1
        fi
    done
    rm -rf "$tmp"
fi
if ((fail)); then echo "verify: FAILED"; exit 1; fi
echo "verify: ok"
