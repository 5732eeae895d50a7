# shellcheck shell=bash
# Source me: puts the dualsched tools on PATH and configures Pulumi for offline use against the
# local cluster (tools/cluster.sh up). Requires tools/build-tools.sh to have run.
#
#   source tools/pulumi-env.sh
#   pulumi login "file://$PWD/.pulumi-state"      # any local backend dir
#   export PULUMI_CONFIG_PASSPHRASE=...            # local backend secrets
#
# Sets:
#   PATH += pulumi (with pulumi-language-python + -exec linked next to it), kubectl (if built),
#           kube-apiserver/controller-manager/scheduler, etcd, kwok   (from $DUALSCHED_TOOLS_CACHE/env.sh)
#   PULUMI_SKIP_UPDATE_CHECK=true
#   PULUMI_DISABLE_AUTOMATIC_PLUGIN_ACQUISITION=true   (a missing plugin is an error, never a download)
#   PULUMI_IGNORE_AMBIENT_PLUGINS=true                 (providers come from the plugin cache at exact versions)
#   KUBECONFIG (only if unset) = ${DUALSCHED_CLUSTER_DIR:-~/.cache/dualsched-cluster}/kubeconfig
# and installs the built provider plugins into ${PULUMI_HOME:-~/.pulumi}/plugins at the versions
# the pinned Python packages request (kubernetes $PULUMI_K8S_PROVIDER_VERSION, random
# $PULUMI_RANDOM_PROVIDER_VERSION) if they are not there yet. After changing PULUMI_HOME, run
# `dualsched_install_plugins` again.
_ds_here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=versions.env
source "$_ds_here/versions.env"
_ds_cache="${DUALSCHED_TOOLS_CACHE:-$HOME/.cache/dualsched-tools}"
if [ -f "$_ds_cache/env.sh" ]; then
  # shellcheck disable=SC1091
  source "$_ds_cache/env.sh"
else
  echo "[pulumi-env] $_ds_cache/env.sh missing: run tools/build-tools.sh first" >&2
fi
export PULUMI_SKIP_UPDATE_CHECK=true
export PULUMI_DISABLE_AUTOMATIC_PLUGIN_ACQUISITION=true
export PULUMI_IGNORE_AMBIENT_PLUGINS=true
export KUBECONFIG="${KUBECONFIG:-${DUALSCHED_CLUSTER_DIR:-$HOME/.cache/dualsched-cluster}/kubeconfig}"

# Install the built provider plugins into the Pulumi plugin cache ($PULUMI_HOME/plugins) at the
# exact versions the pinned Python packages ask for (idempotent; only copies what differs).
dualsched_install_plugins() {
  local name ver bin dst spec
  for spec in "kubernetes $PULUMI_K8S_PROVIDER_VERSION $DUALSCHED_PULUMI_KUBERNETES_BIN" \
              "random $PULUMI_RANDOM_PROVIDER_VERSION $DUALSCHED_PULUMI_RANDOM_BIN"; do
    read -r name ver bin <<<"$spec"
    if [ ! -x "$bin" ]; then echo "[pulumi-env] $bin not built: run tools/build-tools.sh" >&2; return 1; fi
    dst="${PULUMI_HOME:-$HOME/.pulumi}/plugins/resource-$name-v$ver/pulumi-resource-$name"
    if [ -f "$dst" ] && cmp -s "$bin" "$dst"; then continue; fi
    local out
    if ! out=$(pulumi plugin install resource "$name" "$ver" --file "$bin" --reinstall 2>&1); then
      echo "$out" >&2; return 1
    fi
  done
}
if command -v pulumi >/dev/null 2>&1; then
  dualsched_install_plugins || echo "[pulumi-env] WARNING: could not install provider plugins" >&2
fi
unset _ds_here _ds_cache
