# shellcheck shell=bash
# Source me: puts the dualsched tools on PATH and configures Pulumi for offline use against
# the local cluster (tools/cluster.sh up).
#
#   source tools/pulumi-env.sh
#   pulumi login "file://$PWD/.pulumi-state"      # or any local backend dir
#   export PULUMI_CONFIG_PASSPHRASE=...            # local backend secrets
#
# What it sets:
#   PATH       += tool bin dirs ($DUALSCHED_TOOLS_CACHE/env.sh, written by tools/build-tools.sh)
#                 -> pulumi, pulumi-language-python(+ -exec), pulumi-resource-{kubernetes,random}, kube*, etcd, kwok
#   PULUMI_SKIP_UPDATE_CHECK=true, PULUMI_DISABLE_AUTOMATIC_PLUGIN_ACQUISITION=true
#   KUBECONFIG (if unset) = $DUALSCHED_CLUSTER_DIR/kubeconfig
# Plugins: the provider binaries are both on PATH (ambient plugins, which the engine prefers) and
# installed in "${PULUMI_HOME:-~/.pulumi}/plugins" at the versions the Python packages request
# (dualsched_install_plugins, run by build-tools.sh; call it again after changing PULUMI_HOME).
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
export KUBECONFIG="${KUBECONFIG:-${DUALSCHED_CLUSTER_DIR:-$HOME/.cache/dualsched-cluster}/kubeconfig}"

# Install the built provider plugins into the Pulumi plugin cache ($PULUMI_HOME/plugins)
# at the exact versions the pinned Python packages ask for.
dualsched_install_plugins() {
  local name ver bin dst
  for spec in "kubernetes $PULUMI_K8S_PROVIDER_VERSION" "random $PULUMI_RANDOM_PROVIDER_VERSION"; do
    read -r name ver <<<"$spec"
    bin="$(command -v "pulumi-resource-$name")" || { echo "[pulumi-env] pulumi-resource-$name not on PATH" >&2; return 1; }
    dst="${PULUMI_HOME:-$HOME/.pulumi}/plugins/resource-$name-v$ver/pulumi-resource-$name"
    if [ -f "$dst" ] && cmp -s "$bin" "$dst"; then continue; fi
    pulumi plugin install resource "$name" "$ver" --file "$bin" --reinstall >/dev/null || return 1
  done
}
unset _ds_here _ds_cache
