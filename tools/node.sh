#!/usr/bin/env bash
# A real Kubernetes node on this machine, joined to the control plane of tools/cluster.sh:
# containerd + runc (Debian), CNI bridge networking (Debian's plugins), kubelet and kube-proxy
# (built from k8s.io/kubernetes by tools/build-tools.sh), cluster DNS (CoreDNS, same), NetworkPolicy
# enforcement (kube-router's policy controller only: the bridge plugin enforces none), and the
# nvidia.com/gpu device plugin double (tools/gosrc/gpu-device-plugin-double). Images come from
# tools/images.sh (built here from Debian packages), imported into this node's containerd.
#
# Usage:
#   tools/node.sh up       start (idempotent) and wait until the node is Ready with its GPUs
#   tools/node.sh down     stop what `up` started and remove its state, network and cgroups
#   tools/node.sh status   show process and node status (exit 1 if not running)
#
# Env: DUALSCHED_CLUSTER_DIR (the control plane's state dir, as for cluster.sh),
#      DUALSCHED_NODE_NAME (default gpu-real-1), DUALSCHED_NODE_GPUS (default 4).
#
# One real node per machine: the kubelet's device-plugin socket directory
# (/var/lib/kubelet/device-plugins), host-network slurmd ports, the bridge and the DNS address are
# the host's. `up` refuses while another cluster dir's node runs (see /run/dualsched-node/owner).
#
# GPUs: like a real GPU node, the host gets a device file per GPU, /dev/nvidia0..N-1 (char 195:K,
# NVIDIA's numbers, no driver behind them), made by the device plugin double at start and kept while
# the node runs (a privileged container sees them all; others only what the kubelet allocated);
# `down` removes them. `up` refuses on a machine with NVIDIA's driver loaded (/proc/driver/nvidia).
#
# Choices forced by this machine (docs/real-node.md): the host has hybrid cgroup v1, so the
# kubelet runs with failCgroupV1: false and the cgroupfs driver; Debian's containerd is 1.6
# (kubelet 1.36 still talks to it; it logs that the RuntimeConfig call is unimplemented); runc
# cannot lower oom_score_adj without CAP_SYS_RESOURCE, so containerd restricts it.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=versions.env
source "$HERE/versions.env"
TOOLS_CACHE="${DUALSCHED_TOOLS_CACHE:-$HOME/.cache/dualsched-tools}"
CLUSTER_DIR="${DUALSCHED_CLUSTER_DIR:-$HOME/.cache/dualsched-cluster}"
DIR="$CLUSTER_DIR/node"
NODE="${DUALSCHED_NODE_NAME:-gpu-real-1}"
GPUS="${DUALSCHED_NODE_GPUS:-4}"
API_PORT="${DUALSCHED_APISERVER_PORT:-6443}"
OWNER_DIR=/run/dualsched-node
BRIDGE=dualsched0
POD_CIDR=10.244.0.0/24
CLUSTER_CIDR=10.244.0.0/16
SERVICE_CIDR=10.96.0.0/16   # as tools/cluster.sh gives the API server
DNS_IP=169.254.20.10
CGROUP_ROOT=/dualsched
GPU_DEV_DIR=/dev            # where the double makes the host's nvidiaK device files
KUBELET_DIR=/var/lib/kubelet
CNI_BIN=/usr/lib/cni
DEBS=(containerd runc containernetworking-plugins iptables conntrack ipset)
DAEMONS=(containerd kubelet gpu-device-plugin-double kube-proxy coredns kube-router)

log() { echo "[node] $*"; }
die() { echo "[node] ERROR: $*" >&2; exit 1; }
# shellcheck source=daemons.sh
source "$HERE/daemons.sh"

bin_of() { # bin_of TOOL VERSION
  local b="$TOOLS_CACHE/$1-$2/bin/$1"
  [ -x "$b" ] || die "$1 $2 not built: run tools/build-tools.sh"
  echo "$b"
}
kc() { "$(bin_of kubectl "$KUBERNETES_VERSION")" --kubeconfig "$CLUSTER_DIR/kubeconfig" "$@"; }
host_ip() { ip -4 route get 1.1.1.1 2>/dev/null | sed -n 's/.* src \([0-9.]*\).*/\1/p'; }

install_debs() {
  local missing=() p
  for p in "${DEBS[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  [ ${#missing[@]} -eq 0 ] && return
  log "installing ${missing[*]} (Debian packages)"
  # Keep package scripts from starting the packaged containerd: this node runs its own.
  local policy=/usr/sbin/policy-rc.d created=""
  if [ ! -e "$policy" ]; then printf '#!/bin/sh\nexit 101\n' >"$policy"; chmod 755 "$policy"; created=1; fi
  DEBIAN_FRONTEND=noninteractive apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  [ -n "$created" ] && rm -f "$policy"
  return 0
}

# ------------------------------------------------------------------ certificates
sign_client() { # sign_client NAME SUBJECT
  local p="$CLUSTER_DIR/pki"
  [ -f "$DIR/pki/$1.crt" ] && return
  openssl req -newkey rsa:2048 -nodes -keyout "$DIR/pki/$1.key" -out "$DIR/pki/$1.csr" -subj "$2" 2>/dev/null
  openssl x509 -req -in "$DIR/pki/$1.csr" -CA "$p/ca.crt" -CAkey "$p/ca.key" -CAcreateserial \
    -out "$DIR/pki/$1.crt" -days 3650 -extfile "$p/client.ext" 2>/dev/null
  rm -f "$DIR/pki/$1.csr"; chmod 600 "$DIR/pki/$1.key"
}

kubeconfig_for() { # kubeconfig_for NAME -> $DIR/NAME.kubeconfig
  cat >"$DIR/$1.kubeconfig" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: dualsched-local
  cluster: {server: "https://127.0.0.1:$API_PORT", certificate-authority: "$CLUSTER_DIR/pki/ca.crt"}
users:
- name: $1
  user: {client-certificate: "$DIR/pki/$1.crt", client-key: "$DIR/pki/$1.key"}
contexts:
- name: dualsched-local
  context: {cluster: dualsched-local, user: $1}
current-context: dualsched-local
EOF
  chmod 600 "$DIR/$1.kubeconfig"
}

gen_pki() {
  mkdir -p "$DIR/pki"; chmod 700 "$DIR/pki"
  # the Node authorizer and NodeRestriction know a kubelet by this name and group
  sign_client kubelet "/O=system:nodes/CN=system:node:$NODE"
  sign_client kube-proxy "/CN=system:kube-proxy"          # bound to system:node-proxier by default
  sign_client coredns "/CN=dualsched:coredns"             # bound below to read-only discovery
  sign_client kube-router "/CN=dualsched:kube-router"     # bound below to read-only policy inputs
  # kubelet serving certificate (apiserver -> kubelet for logs and exec)
  if [ ! -f "$DIR/pki/kubelet-serving.crt" ]; then
    printf 'basicConstraints=CA:FALSE\nkeyUsage=digitalSignature,keyEncipherment\nextendedKeyUsage=serverAuth\nsubjectAltName=IP:%s,IP:127.0.0.1,DNS:%s\n' \
      "$(host_ip)" "$NODE" >"$DIR/pki/serving.ext"
    openssl req -newkey rsa:2048 -nodes -keyout "$DIR/pki/kubelet-serving.key" -out "$DIR/pki/kubelet-serving.csr" \
      -subj "/CN=$NODE" 2>/dev/null
    openssl x509 -req -in "$DIR/pki/kubelet-serving.csr" -CA "$CLUSTER_DIR/pki/ca.crt" -CAkey "$CLUSTER_DIR/pki/ca.key" \
      -CAcreateserial -out "$DIR/pki/kubelet-serving.crt" -days 3650 -extfile "$DIR/pki/serving.ext" 2>/dev/null
    rm -f "$DIR/pki/kubelet-serving.csr"; chmod 600 "$DIR/pki/kubelet-serving.key"
  fi
  local n; for n in kubelet kube-proxy coredns kube-router; do kubeconfig_for "$n"; done
}

# ------------------------------------------------------------------ containerd and CNI
write_containerd_config() {
  mkdir -p "$DIR/containerd" "$DIR/cni/net.d"
  cat >"$DIR/containerd/config.toml" <<EOF
version = 2
root = "$DIR/containerd/root"
state = "$DIR/containerd/state"
[grpc]
  address = "$DIR/containerd/containerd.sock"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "dualsched.local/pause:1"
  # runc cannot lower oom_score_adj here (no CAP_SYS_RESOURCE): "can't get final child's PID from pipe"
  restrict_oom_score_adj = true
  enable_selinux = false
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "$CNI_BIN"
    conf_dir = "$DIR/cni/net.d"
EOF
  cat >"$DIR/cni/net.d/10-dualsched.conflist" <<EOF
{
  "cniVersion": "1.0.0",
  "name": "dualsched",
  "plugins": [
    {"type": "bridge", "bridge": "$BRIDGE", "isGateway": true, "ipMasq": true, "hairpinMode": true,
     "ipam": {"type": "host-local", "ranges": [[{"subnet": "$POD_CIDR"}]], "routes": [{"dst": "0.0.0.0/0"}],
              "dataDir": "$DIR/cni/ipam"}},
    {"type": "portmap", "capabilities": {"portMappings": true}},
    {"type": "loopback"}
  ]
}
EOF
}

containerd_ready() { ctr --address "$DIR/containerd/containerd.sock" version >/dev/null 2>&1; }

# ------------------------------------------------------------------ kernel and host setup
host_setup() {
  # Services from pods across the bridge need bridged traffic to pass iptables, and forwarding.
  [ -e /proc/sys/net/bridge/bridge-nf-call-iptables ] || modprobe br_netfilter 2>/dev/null ||
    die "bridged traffic is not seen by iptables (no br_netfilter): Services would not work"
  echo 1 >/proc/sys/net/bridge/bridge-nf-call-iptables
  echo 1 >/proc/sys/net/ipv4/ip_forward
  # Cluster DNS listens on a link-local address of its own (like NodeLocal DNSCache), reachable
  # from every pod through the bridge gateway and from host-network pods (slurmd) directly. It sits
  # on the loopback interface: this kernel has no dummy interfaces.
  ip addr show dev lo | grep -q "$DNS_IP/32" || ip addr add "$DNS_IP/32" dev lo
  # The kubelet's cgroup root must exist in every v1 hierarchy it uses.
  local c; for c in /sys/fs/cgroup/*/; do
    case "$c" in */unified/) continue ;; esac
    mkdir -p "$c${CGROUP_ROOT#/}" 2>/dev/null || true
  done
  mkdir -p "$KUBELET_DIR/device-plugins"
}

# ------------------------------------------------------------------ kubelet, kube-proxy, DNS
write_kubelet_config() {
  cat >"$DIR/kubelet-config.yaml" <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
# This host has hybrid cgroup v1 (KEP-5573: from 1.35 the kubelet refuses v1 unless told).
failCgroupV1: false
cgroupDriver: cgroupfs
cgroupRoot: $CGROUP_ROOT
containerRuntimeEndpoint: unix://$DIR/containerd/containerd.sock
address: $(host_ip)
port: 10250
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: 10248
tlsCertFile: $DIR/pki/kubelet-serving.crt
tlsPrivateKeyFile: $DIR/pki/kubelet-serving.key
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: false}
  x509: {clientCAFile: $CLUSTER_DIR/pki/ca.crt}
# Only holders of a certificate from the cluster's CA reach the kubelet API at all.
authorization: {mode: AlwaysAllow}
clusterDomain: cluster.local
clusterDNS: [$DNS_IP]
resolvConf: /etc/resolv.conf
failSwapOn: false
# The kubelet cannot read file-system stats of this VM's disk: evict on memory only.
evictionHard: {memory.available: "200Mi"}
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
serializeImagePulls: false
maxPods: 40
EOF
}

write_kube_proxy_config() {
  cat >"$DIR/kube-proxy-config.yaml" <<EOF
apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
mode: iptables
clientConnection: {kubeconfig: $DIR/kube-proxy.kubeconfig}
hostnameOverride: $NODE
clusterCIDR: $CLUSTER_CIDR
bindAddress: 127.0.0.1
healthzBindAddress: 127.0.0.1:10256
metricsBindAddress: 127.0.0.1:10249
# leave the host's conntrack sysctls alone
conntrack: {maxPerCore: 0}
EOF
}

write_corefile() {
  cat >"$DIR/Corefile" <<EOF
.:53 {
    bind $DNS_IP
    errors
    kubernetes cluster.local in-addr.arpa ip6.arpa {
        kubeconfig $DIR/coredns.kubeconfig
        pods insecure
        fallthrough in-addr.arpa ip6.arpa
    }
    cache 30
    loop
    reload
    loadbalance
}
EOF
  # No forward: pods here never need names outside the cluster, so nothing leaves the machine.
  kc apply -f - >/dev/null <<EOF
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: "dualsched:coredns"}
rules:
- {apiGroups: [""], resources: [endpoints, services, pods, namespaces], verbs: [list, watch]}
- {apiGroups: [discovery.k8s.io], resources: [endpointslices], verbs: [list, watch]}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: "dualsched:coredns"}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: "dualsched:coredns"}
subjects: [{apiGroup: rbac.authorization.k8s.io, kind: User, name: "dualsched:coredns"}]
EOF
}

# kube-router's NetworkPolicy controller: pods, namespaces and policies become iptables rules and
# ipsets on this node. It only reads: its informers watch these kinds (pkg/cmd/kube-router.go, v2.1.0).
start_kube_router() {
  kc apply -f - >/dev/null <<EOF
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: "dualsched:kube-router"}
rules:
- {apiGroups: [""], resources: [pods, namespaces, services, endpoints], verbs: [list, watch]}
- {apiGroups: [""], resources: [nodes], verbs: [get, list, watch]}   # its own node's address
- {apiGroups: [discovery.k8s.io], resources: [endpointslices], verbs: [list, watch]}
- {apiGroups: [networking.k8s.io], resources: [networkpolicies], verbs: [list, watch]}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: "dualsched:kube-router"}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: "dualsched:kube-router"}
subjects: [{apiGroup: rbac.authorization.k8s.io, kind: User, name: "dualsched:kube-router"}]
EOF
  start_daemon kube-router "$(bin_of kube-router "$KUBE_ROUTER_VERSION")" \
    --kubeconfig "$DIR/kube-router.kubeconfig" --hostname-override "$NODE" \
    --run-firewall=true --run-router=false --run-service-proxy=false --enable-cni=false \
    --service-cluster-ip-range "$SERVICE_CIDR" --health-port 0 --metrics-port 0 --v 1
}
policies_enforced() { iptables -S KUBE-ROUTER-FORWARD >/dev/null 2>&1; }

node_registered() { kc get node "$NODE" -o name >/dev/null 2>&1; }
node_ready() {
  [ "$(kc get node "$NODE" -o jsonpath='{.status.conditions[?(@.type=="Ready")].status}' 2>/dev/null)" = True ]
}
node_has_gpus() {
  [ "$(kc get node "$NODE" -o jsonpath='{.status.allocatable.nvidia\.com/gpu}' 2>/dev/null)" = "$GPUS" ]
}
dns_answers() {
  getent ahostsv4 kubernetes.default.svc.cluster.local >/dev/null 2>&1 && return 0
  # the host's resolver is not ours: ask CoreDNS directly
  python3 - "$DNS_IP" <<'PY' 2>/dev/null
import socket, struct, sys
q = struct.pack(">HHHHHH", 1, 0x0100, 1, 0, 0, 0) + b"".join(
    bytes([len(p)]) + p.encode() for p in "kubernetes.default.svc.cluster.local".split(".")) + b"\0" + struct.pack(">HH", 1, 1)
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.settimeout(2); s.sendto(q, (sys.argv[1], 53))
r = s.recv(512); sys.exit(0 if struct.unpack(">H", r[6:8])[0] > 0 else 1)
PY
}

# The double's host device files /dev/nvidiaK are char 195:K; anything else of that name is not ours.
gpu_device_files() {
  local f
  for f in "$GPU_DEV_DIR"/nvidia[0-9]*; do
    [ -c "$f" ] && [ "$(stat -c %t "$f")" = c3 ] && [ "$((16#$(stat -c %T "$f")))" = "${f#"$GPU_DEV_DIR"/nvidia}" ] && echo "$f"
  done
  return 0
}
no_nvidia_driver() { [ ! -e /proc/driver/nvidia ]; }

claim_machine() {
  mkdir -p "$OWNER_DIR"
  if [ -f "$OWNER_DIR/owner" ] && [ "$(cat "$OWNER_DIR/owner")" != "$CLUSTER_DIR" ]; then
    local other; other=$(cat "$OWNER_DIR/owner")
    if [ -f "$other/node/pids/kubelet.pid" ] && kill -0 "$(cat "$other/node/pids/kubelet.pid")" 2>/dev/null; then
      die "a real node of $other already runs on this machine (one per machine): DUALSCHED_CLUSTER_DIR=$other tools/node.sh down"
    fi
    # its processes are gone (killed, machine restarted) but its mounts, network and cgroups may not be
    log "cleaning up after the stopped node of $other"
    DUALSCHED_CLUSTER_DIR="$other" "$HERE/node.sh" down
  fi
  echo "$CLUSTER_DIR" >"$OWNER_DIR/owner"
}

cmd_up() {
  [ "$(id -u)" -eq 0 ] || die "a real node needs root (containerd, network namespaces, cgroups)"
  [ -f "$CLUSTER_DIR/kubeconfig" ] || die "no control plane in $CLUSTER_DIR: run tools/cluster.sh up none"
  no_nvidia_driver || die "NVIDIA's driver is loaded here (/proc/driver/nvidia): the GPU double's /dev/nvidiaK would stand in for real GPUs"
  local t0; t0=$(date +%s)
  install_debs
  claim_machine
  mkdir -p "$DIR"/{logs,pids}
  gen_pki
  host_setup
  write_containerd_config
  start_daemon containerd containerd --config "$DIR/containerd/config.toml"
  wait_for 60 "containerd" containerd_ready
  "$HERE/images.sh" import --address "$DIR/containerd/containerd.sock"

  write_kubelet_config
  start_daemon kubelet "$(bin_of kubelet "$KUBERNETES_VERSION")" \
    --config "$DIR/kubelet-config.yaml" --kubeconfig "$DIR/kubelet.kubeconfig" \
    --root-dir "$KUBELET_DIR" --hostname-override "$NODE" --node-ip "$(host_ip)" \
    --node-labels "dualsched.io/real-node=true" --v 1
  wait_for 120 "node $NODE to register" node_registered
  start_daemon gpu-device-plugin-double "$(bin_of gpu-device-plugin-double "$GPU_DEVICE_PLUGIN_DOUBLE_VERSION")" \
    --count "$GPUS" --device-dir "$GPU_DEV_DIR" --kubelet-dir "$KUBELET_DIR/device-plugins"
  write_kube_proxy_config
  start_daemon kube-proxy "$(bin_of kube-proxy "$KUBERNETES_VERSION")" --config "$DIR/kube-proxy-config.yaml" --v 1
  write_corefile
  start_daemon coredns "$(bin_of coredns "$COREDNS_VERSION")" -conf "$DIR/Corefile"
  start_kube_router
  wait_for 180 "node $NODE Ready" node_ready
  wait_for 60 "nvidia.com/gpu=$GPUS allocatable on $NODE (device plugin double)" node_has_gpus
  [ "$(gpu_device_files | wc -l)" -ge "$GPUS" ] || die "the GPU double made no $GPU_DEV_DIR/nvidia0..$((GPUS - 1)) (log: $DIR/logs/gpu-device-plugin-double.log)"
  wait_for 60 "cluster DNS on $DNS_IP" dns_answers
  wait_for 60 "NetworkPolicy enforcement (kube-router's chains)" policies_enforced
  log "up in $(( $(date +%s) - t0 ))s: node $NODE Ready, $GPUS GPUs (double), DNS $DNS_IP, pods on $POD_CIDR"
}

cmd_down() {
  [ -d "$DIR" ] || { log "no node in $DIR"; return 0; }
  # what down removes is the machine's (kubelet dir, bridge, cgroups, /dev/nvidiaK): never under another running node
  local owner; owner=$(cat "$OWNER_DIR/owner" 2>/dev/null || true)
  if [ -n "$owner" ] && [ "$owner" != "$CLUSTER_DIR" ] && [ -f "$owner/node/pids/kubelet.pid" ] &&
     kill -0 "$(cat "$owner/node/pids/kubelet.pid")" 2>/dev/null; then
    die "the node running on this machine is $owner's, not $CLUSTER_DIR's: not touching it"
  fi
  local sock="$DIR/containerd/containerd.sock" id
  stop_daemon kube-router; stop_daemon coredns; stop_daemon kube-proxy; stop_daemon gpu-device-plugin-double; stop_daemon kubelet
  if containerd_ready; then
    # every pod sandbox of this node, so their network namespaces and mounts go too
    for id in $(container_task_ids); do
      ctr --address "$sock" -n k8s.io tasks kill -s KILL "$id" >/dev/null 2>&1 || true
    done
  fi
  stop_daemon containerd
  # containerd-shim processes of this node's containers (they outlive containerd by design)
  pkill -KILL -f "containerd-shim-runc-v2 -namespace k8s.io -id .* -address $sock" 2>/dev/null || true
  sleep 1
  # mounts under this node's directories, deepest first (the kubelet also bind-mounts its root dir on itself)
  awk -v a="$DIR" -v b="$KUBELET_DIR" '$2 == a || $2 == b || index($2, a "/") == 1 || index($2, b "/") == 1 {print $2}' \
    /proc/mounts | sort -r | while read -r m; do umount -l "$m" 2>/dev/null || true; done
  local ns; for ns in $(ip netns list 2>/dev/null | awk '/^cni-/{print $1}'); do ip netns delete "$ns" 2>/dev/null || true; done
  ip link delete "$BRIDGE" 2>/dev/null || true
  ip addr del "$DNS_IP/32" dev lo 2>/dev/null || true
  # iptables rules and chains of kube-proxy, kube-router, the kubelet and the CNI plugins: each table is saved,
  # stripped of the KUBE-*/CNI-* chains and the rules that jump to them, and restored whole.
  local table; for table in filter nat mangle; do
    iptables-save -t "$table" 2>/dev/null | python3 -c '
import re, sys
ours = re.compile(r"(^:|-j |-A )(KUBE-|CNI-)")
sys.stdout.write("".join(l for l in sys.stdin if not ours.search(l)))' | iptables-restore -T "$table" 2>/dev/null || true
  done
  # kube-router's ipsets (KUBE-SRC-/KUBE-DST-..., kube-router-...), unreferenced now that its chains are gone
  local name; for name in $(ipset list -n 2>/dev/null); do
    case "$name" in KUBE-*|kube-router*) ipset destroy "$name" 2>/dev/null || true ;; esac
  done
  # What is still in this node's cgroups (Slurm's slurm_<node>/... among them, nested in slurmd's
  # container) was not stopped through containerd (its socket gone...): it goes by its pids.
  local cgroups=(/sys/fs/cgroup/*/"${CGROUP_ROOT#/}") c p
  for p in $(find "${cgroups[@]}" -name cgroup.procs -exec cat {} + 2>/dev/null | sort -u); do
    kill -KILL "$p" 2>/dev/null || true
  done
  sleep 0.5
  for c in "${cgroups[@]}"; do
    [ -d "$c" ] && find "$c" -depth -type d -exec rmdir {} \; 2>/dev/null || true
  done
  kc delete node "$NODE" --ignore-not-found --wait=false >/dev/null 2>&1 || true
  # the host's GPU device files the double made (never with NVIDIA's driver loaded: then they are real)
  if no_nvidia_driver; then
    local f; for f in $(gpu_device_files); do rm -f "$f"; done
  fi
  rm -rf "$KUBELET_DIR" "$DIR"
  [ "$(cat "$OWNER_DIR/owner" 2>/dev/null)" = "$CLUSTER_DIR" ] && rm -f "$OWNER_DIR/owner"
  log "down"
}

container_task_ids() { ctr --address "$DIR/containerd/containerd.sock" -n k8s.io tasks ls -q 2>/dev/null || true; }

cmd_status() {
  local d rc=0
  for d in "${DAEMONS[@]}"; do
    if pid_alive "$d"; then log "$d: running (pid $(cat "$DIR/pids/$d.pid"))"; else log "$d: not running"; rc=1; fi
  done
  log "GPU device files: $(gpu_device_files | tr '\n' ' ')"
  if node_ready; then log "node $NODE: Ready, nvidia.com/gpu=$(kc get node "$NODE" -o jsonpath='{.status.allocatable.nvidia\.com/gpu}')"
  else log "node $NODE: not Ready"; rc=1; fi
  return $rc
}

case "${1:-}" in
  up) cmd_up ;;
  down) cmd_down ;;
  status) cmd_status ;;
  *) echo "usage: $0 up | down | status" >&2; exit 2 ;;
esac
