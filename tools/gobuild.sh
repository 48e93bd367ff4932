#!/bin/sh
# Build one test program from its Go module into the cache, once per version:
#   tools/gobuild.sh kubernetes|etcd|kwok|mig-parted|k8s-device-plugin|kueue|jobset|kustomize|pulumi|pulumi-kubernetes
# The binaries land in $GPUSHARE_BIN_CACHE/<name>-<version>/ (default ~/.cache/gpushare/bin); a stamp file marks a
# finished build, so a second call returns at once. Nothing is downloaded but Go modules from the module proxy.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
# A version set in the environment (make's command line exports it) wins over tools/versions.env.
overrides=$(env | grep -E '^[A-Z_]+_VERSION=' || true)
. "$here/versions.env"
[ -z "$overrides" ] || eval "$(printf '%s\n' "$overrides" | sed -n "s/^\([A-Z_]*_VERSION\)=\([0-9A-Za-z.+-]*\)$/\1='\2'/p")"
cache=${GPUSHARE_BIN_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/gpushare/bin}
name=$1
case $name in
  kubernetes) version=$KUBERNETES_VERSION ;;
  etcd) version=$ETCD_VERSION ;;
  kwok) version=$KWOK_VERSION ;;
  mig-parted) version=$MIG_PARTED_VERSION module=github.com/NVIDIA/mig-parted cmd=nvidia-mig-parted ;;
  k8s-device-plugin) version=$DEVICE_PLUGIN_VERSION module=github.com/NVIDIA/k8s-device-plugin cmd=nvidia-device-plugin ;;
  kueue) version=$KUEUE_VERSION module=sigs.k8s.io/kueue ;;
  jobset) version=$JOBSET_VERSION module=sigs.k8s.io/jobset ;;
  kustomize) version=$KUSTOMIZE_VERSION module=sigs.k8s.io/kustomize/kustomize/v5 ;;
  pulumi) version=$PULUMI_VERSION module=github.com/pulumi/pulumi/pkg/v3 cmd=pulumi ;;
  pulumi-kubernetes) version=$PULUMI_KUBERNETES_VERSION module=github.com/pulumi/pulumi-kubernetes/provider/v4
    cmd=pulumi-resource-kubernetes ;;
  *) echo "gobuild.sh: unknown program '$name' (kubernetes, etcd, kwok, mig-parted, k8s-device-plugin, kueue, jobset, kustomize, pulumi, pulumi-kubernetes)" >&2; exit 2 ;;
esac
out=$cache/$name-$version
# A Kubernetes build from before its version was stamped reports v0.0.0-master, which clients such as Kueue refuse.
[ -f "$out/.built" ] && { [ "$name" != kubernetes ] || "$out/kube-apiserver" --version | grep -qx "Kubernetes v$version"; } \
  && exit 0
if ! command -v go >/dev/null 2>&1; then
  echo "gobuild.sh: Go is needed to build $name $version for gpushare's tests:" >&2
  echo "  apt-get install golang-go (1.24 or newer), or Go from https://go.dev/dl/ on PATH" >&2
  exit 1
fi
work=$cache/.src/$name-$version
# module_path Dir|GoMod MODULE@VERSION: the module's folder or go.mod in the module cache, downloaded from the proxy;
# fails (never an empty path, which a copy would read as the root folder) when the proxy does not serve that version.
module_path() {
  path=$(go mod download -json "$2" | jq -r --arg field "$1" '.[$field] // empty') && [ -n "$path" ] \
    && [ -e "$path" ] && [ "$path" != / ] \
    || { echo "gobuild.sh: the module proxy has no $2 (go mod download -json $2)" >&2; return 1; }
  echo "$path"
}
rm -rf "$work"; mkdir -p "$work" "$out"
# The module proxy is the only source; its checksum database is not reachable from every machine, so go.sum is
# pinned in the checkout (tools/gosum/<name>-<version>.sum) once a build has produced it.
export GOFLAGS="-mod=mod -trimpath" GOSUMDB=off GOTOOLCHAIN=local CGO_ENABLED=0
ldflags="-s -w"
cd "$work"
case $name in
  kubernetes)
    # k8s.io/kubernetes refers to its staging modules as v0.0.0 with replace directives into its own tree; a module
    # that requires it maps each one to the published v0.<minor>.<patch> release instead.
    minor=${version#1.}
    go mod init gpushare.local/kubernetes >/dev/null 2>&1
    go mod edit -require=k8s.io/kubernetes@v$version
    proxy=$(go env GOPROXY); proxy=${proxy%%,*}
    curl -fsS "$proxy/k8s.io/kubernetes/@v/v$version.mod" \
      | sed -n 's/^[[:space:]]*\(k8s\.io\/[a-z0-9-]*\) v0\.0\.0$/\1/p' \
      | while read -r m; do go mod edit -replace="$m=$m@v0.$minor"; done
    cat > tools.go <<'GO'
//go:build tools

package tools

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kube-scheduler"
)
GO
    ;;
  etcd)
    go mod init gpushare.local/etcd >/dev/null 2>&1
    go mod edit -require=go.etcd.io/etcd/server/v3@v$version
    mkdir -p cmd/etcd
    cat > cmd/etcd/main.go <<'GO'
// etcd's server, started the way its own main does.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() { etcdmain.Main(os.Args) }
GO
    ;;
  kwok)
    go mod init gpushare.local/kwok >/dev/null 2>&1
    go mod edit -require=sigs.k8s.io/kwok@v$version
    cat > tools.go <<'GO'
//go:build tools

package tools

import _ "sigs.k8s.io/kwok/cmd/kwok"
GO
    ;;
  mig-parted|k8s-device-plugin)
    # go-nvml binds NVML through cgo (it opens libnvidia-ml.so.1 only at run time, so no NVIDIA library is needed).
    if ! command -v gcc >/dev/null 2>&1; then
      echo "gobuild.sh: $name needs a C compiler for go-nvml (cgo): apt-get install gcc" >&2; exit 1
    fi
    go mod init "gpushare.local/$name" >/dev/null 2>&1
    go mod edit -require="$module@v$version"
    cat > tools.go <<GO
//go:build tools

package tools

import _ "$module/cmd/$cmd"
GO
    ;;
  kueue|jobset)
    # Kueue requires k8s.io/kubernetes, whose staging modules a requiring module cannot resolve (v0.0.0); built as
    # its own main module instead, from the module proxy's zip, so its own go.mod and go.sum pick every version
    # (JobSet too: its main package is the module's root, which a requiring module cannot build either).
    src=$(module_path Dir "$module@v$version")
    cp -R "$src/." . && chmod -R u+w .
    ;;
  kustomize)
    go mod init gpushare.local/kustomize >/dev/null 2>&1
    go mod edit -require="$module@v$version"
    cat > tools.go <<GO
//go:build tools

package tools

import _ "$module"
GO
    ;;
  pulumi)
    # A wrapper module requiring the release: its replace directives do not apply to a requiring module, so the
    # ones that name another module (not a path of its own repository) are copied here, as a main module needs them.
    go mod init "gpushare.local/$name" >/dev/null 2>&1
    go mod edit -require="$module@v$version"
    gomod=$(module_path GoMod "$module@v$version")
    go mod edit -json "$gomod" | jq -r '.Replace[]? | select(.New.Version != null)
      | "-replace=\(.Old.Path)\(if .Old.Version then "@"+.Old.Version else "" end)=\(.New.Path)@\(.New.Version)"' \
      | xargs -r go mod edit
    # Not the usual "tools" tag: hcl/v2's own tools.go carries it and imports a program.
    cat > tools.go <<GO
//go:build gpushare_tools

package tools

import _ "$module/cmd/$cmd"
GO
    ;;
  pulumi-kubernetes)
    # Built as its own main module (its go.mod and go.sum pick every version, and go generate needs a writable
    # tree): the one replace pointing into its repository (../sdk, the Go SDK its yaml/v2 and helm/v4 components
    # use) takes the sdk/v4 release the provider's go.mod requires, from the proxy, instead.
    src=$(module_path Dir "$module@$PULUMI_KUBERNETES_MODULE_VERSION")
    cp -R "$src/." . && chmod -R u+w .
    go mod edit -dropreplace=github.com/pulumi/pulumi-kubernetes/sdk/v4
    ;;
esac
[ -f "$here/gosum/$name-$version.sum" ] && cp "$here/gosum/$name-$version.sum" go.sum
echo "building $name $version into $out (first time on this machine: minutes)" >&2
start=$(date +%s)
case $name in
  kubernetes)
    go mod tidy -e >/dev/null 2>&1 || true
    # The version stamped as Kubernetes' own build does (hack/lib/version.sh): /version answers v$version, not
    # v0.0.0-master. Each binary is built aside and moved into place, so a running one is never overwritten.
    stamp=""
    for p in k8s.io/client-go/pkg/version k8s.io/component-base/version; do
      stamp="$stamp -X $p.gitVersion=v$version -X $p.gitMajor=${version%%.*} -X $p.gitMinor=$(echo "$version" | cut -d. -f2)"
      stamp="$stamp -X $p.gitTreeState=clean"
    done
    # One go build for the three programs, so each one's link overlaps the others' compiles.
    cmds="kube-apiserver kube-controller-manager kube-scheduler"
    mkdir -p "$work/bin"
    # shellcheck disable=SC2046 # one package path per program
    go build -tags tools -ldflags "$ldflags$stamp" -o "$work/bin/" $(printf 'k8s.io/kubernetes/cmd/%s ' $cmds)
    for c in $cmds; do mv -f "$work/bin/$c" "$out/$c"; done ;;
  etcd)
    go mod tidy >/dev/null
    go build -ldflags "$ldflags" -o "$out/etcd" ./cmd/etcd ;;
  kwok)
    go mod tidy -e >/dev/null 2>&1 || true
    go build -tags tools -ldflags "$ldflags" -o "$out/kwok" sigs.k8s.io/kwok/cmd/kwok ;;
  mig-parted|k8s-device-plugin)
    # Linked as NVIDIA's Makefiles link them: lazy binding for the NVML symbols, the version in internal/info.
    go mod tidy >/dev/null
    CGO_ENABLED=1 go build -tags tools -ldflags "$ldflags -extldflags=-Wl,-z,lazy -X $module/internal/info.version=v$version" \
      -o "$out/$cmd" "$module/cmd/$cmd" 2>"$work/build.log" || { cat "$work/build.log" >&2; exit 1; } ;;
  kueue)
    # The version variables Kueue's Makefile sets (the manager logs them and exports them as kueue_build_info).
    go build -ldflags "$ldflags -X $module/pkg/version.GitVersion=v$version" -o "$out/kueue" ./cmd/kueue
    # Kueue's own install manifest (CRDs with their conversion webhooks, RBAC, webhook configurations) from the same
    # module, as its release manifest is made: kustomize build config/default.
    "$here/gobuild.sh" kustomize
    "$cache/kustomize-$KUSTOMIZE_VERSION/kustomize" build config/default > "$out/kueue-install.yaml" ;;
  jobset)
    # As JobSet's Makefile builds the manager (its main package is the module's root), the version in pkg/version.
    go build -ldflags "$ldflags -X $module/pkg/version.GitVersion=v$version" -o "$out/jobset" .
    # JobSet's own install manifest (CRDs, RBAC, webhook configurations), as its release manifest is made.
    "$here/gobuild.sh" kustomize
    "$cache/kustomize-$KUSTOMIZE_VERSION/kustomize" build config/default > "$out/jobset-install.yaml" ;;
  kustomize)
    go mod tidy >/dev/null
    go build -tags tools -ldflags "$ldflags" -o "$out/kustomize" "$module" ;;
  pulumi)
    # As Pulumi's Makefile builds the CLI: the version in sdk/v3's version package (plugins and `pulumi version`).
    go mod tidy >/dev/null
    go build -ldflags "$ldflags -X github.com/pulumi/pulumi/sdk/v3/go/common/version.Version=v$version" \
      -o "$out/pulumi" "$module/cmd/$cmd" ;;
  pulumi-kubernetes)
    # As the provider's Makefile builds it: go generate writes the schema (with this version) and the Terraform
    # mapping the binary embeds, then the version goes into pkg/version.
    go mod tidy >/dev/null
    (cd "cmd/$cmd" && VERSION=$version go generate ./main.go)
    go build -ldflags "$ldflags -X $module/pkg/version.Version=$version" -o "$out/$cmd" "./cmd/$cmd" ;;
esac
mkdir -p "$here/gosum"; [ -f "$here/gosum/$name-$version.sum" ] || cp go.sum "$here/gosum/$name-$version.sum"
echo "built $name $version in $(( $(date +%s) - start )) s" >&2
touch "$out/.built"
