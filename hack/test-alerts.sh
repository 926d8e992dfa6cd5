#!/usr/bin/env bash
# The chart's alerts (charts/vhostmq/files/alerts.yaml) checked and tested
# with promtool (Debian's prometheus package): `promtool check rules`, then
# `promtool test rules hack/testdata/alerts_test.yaml`, in which every alert
# fires for one series and stays quiet for a neighbour, with its rendered
# summary and description; and the chart's PrometheusRule carries exactly
# those groups. Prints what it runs; exits non-zero on the first failure.
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source-path=SCRIPTDIR source=lib.sh
source "$HERE/lib.sh"
VMQ_TAG=test-alerts

command -v promtool >/dev/null || vmq_die "promtool missing: hack/install-deps.sh installs Debian's prometheus package"
RULES=$VMQ_REPO_ROOT/charts/vhostmq/files/alerts.yaml
vmq_log "$(promtool --version 2>&1 | head -n 1)"
promtool check rules "$RULES"
(cd "$HERE/testdata" && promtool test rules alerts_test.yaml)

helm=${VHOSTMQ_TOOLS:-/var/cache/vhostmq/tools}/helm-v3.22.0
[[ -x $helm ]] || "$HERE/manifests.sh" >/dev/null
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
"$helm" template x "$VMQ_REPO_ROOT/charts/vhostmq" --kube-version 1.37.2 \
    --set metrics.enabled=true,metrics.prometheusRule.enabled=true >"$work/chart.yaml"
python3 - "$work/chart.yaml" "$RULES" "$work/rendered.yaml" <<'PY'
import sys, yaml
docs = [d for d in yaml.safe_load_all(open(sys.argv[1])) if d and d.get("kind") == "PrometheusRule"]
if len(docs) != 1:
    sys.exit("want one PrometheusRule in the chart, got %d" % len(docs))
want = yaml.safe_load(open(sys.argv[2]))
if docs[0]["spec"] != want:
    sys.exit("the chart's PrometheusRule spec differs from " + sys.argv[2])
yaml.safe_dump(docs[0]["spec"], open(sys.argv[3], "w"))
PY
promtool check rules "$work/rendered.yaml" >/dev/null
vmq_log "the chart's PrometheusRule carries the tested groups ($(grep -c 'alert:' "$RULES") alerts)"
