#!/usr/bin/env bash
# A real Kubernetes node on this machine, joined to the control plane of tools/cluster.sh:
# containerd + runc (Debian), CNI bridge networking (Debian's plugins), kubelet and kube-proxy
# (built from k8s.io/kubernetes by tools/build-tools.sh), cluster DNS (CoreDNS, same), NetworkPolicy
# enforcement (kube-router's policy controller only: the bridge plugin enforces none), and the
# nvidia.com/gpu device plugin double (tools/gosrc/gpu-device-plugin-double). Images come from
# tools/images.sh (built here from Debian packages), imported into this node's containerd.
#
# Usage:
#   tools/node.sh up       start (idempotent) and wait until the node(s) are Ready with their GPUs
#   tools/node.sh down     stop what `up` started and remove its state, network and cgroups
#   tools/node.sh status   show process and node status (exit 1 if not running)
#   tools/node.sh fail NODE     namespaced NODE goes away as in a power loss: its link cut, its
#                               daemons stopped, every process of its pods killed
#   tools/node.sh recover NODE  it comes back: daemons resumed, link restored, the kubelet starts
#                               the pods' containers anew; Ready
#
# Env: DUALSCHED_CLUSTER_DIR (the control plane's state dir, as for cluster.sh),
#      DUALSCHED_NODE_GPUS (GPUs per node, default 4),
#      DUALSCHED_NODES     N: N real nodes gpu-real-1..N, each in network and mount namespaces of its
#                          own (see "Namespaced nodes" below; `make up` runs 3). Unset: one node,
#                          DUALSCHED_NODE_NAME (default gpu-real-1), that is this machine itself.
#
# One host node and one set of namespaced nodes per machine, side by side: the host node's kubelet
# directory (/var/lib/kubelet), bridge, pod range 10.244.0.0/24, DNS address and /dev/nvidiaK are the
# machine's; the namespaced nodes' link bridge, addresses and pod ranges 10.244.K.0/24 (K >= 1) are fixed.
# Neither kind touches the other's (their daemons, iptables rules and ipsets, mounts and cgroups live
# in the root namespace or in the nodes' own, never both), so the real-node and multi-node test tiers
# run at once. `up` refuses while another cluster dir's nodes of the same kind run (see
# /run/dualsched-node/host-node and /run/dualsched-node/namespaced-nodes).
#
# Namespaced nodes: node K has a network namespace (address 10.250.0.(10+K) on the link bridge
# dsnodes, whose root-side address 10.250.0.1 reaches the API server; its pods on 10.244.K.0/24,
# routed through the root namespace, not masqueraded, so NetworkPolicies see pod addresses across
# nodes) and a mount namespace in which its containerd, kubelet and device plugin run: its own
# /var/lib/kubelet, /var/log/pods, /run/netns, /var/lib/enroot (the stack's hostPath directories)
# and /dev (a copy of the machine's with the node's own /dev/nvidiaK), all under
# $DUALSCHED_CLUSTER_DIR/nodes/<node>/. Every other directory is the machine's, so the local
# stack's hostPath shared directory is one file system seen by every node. Host-network pods
# (slurmd) get the node's address; srun, step I/O and rendezvous cross real (virtual) links.
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
NODES="${DUALSCHED_NODES:-}"
API_PORT="${DUALSCHED_APISERVER_PORT:-6443}"
OWNER_DIR=/run/dualsched-node
BRIDGE=dualsched0
POD_CIDR=10.244.0.0/24
CLUSTER_CIDR=10.244.0.0/16
SERVICE_CIDR=10.96.0.0/16   # as tools/cluster.sh gives the API server
DNS_IP=169.254.20.10
CGROUP_ROOT=/dualsched
GPU_DEV_DIR=/dev            # where the double makes the host's nvidiaK device files
HOST_GPU_DEV_DIR=$GPU_DEV_DIR   # the same directory as this script sees it
KUBELET_DIR=/var/lib/kubelet
HOST_KUBELET_DIR=$KUBELET_DIR
IN=()                       # the command prefix that runs in the node (namespaced nodes: nsenter)
API_SERVER="https://127.0.0.1:$API_PORT"
LINK_BRIDGE=dsnodes
LINK_NET=10.250.0
NODE_DIRS=(kubelet:/var/lib/kubelet log-pods:/var/log/pods log-containers:/var/log/containers
           netns:/run/netns enroot:/var/lib/enroot)
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
NODE_IP=""   # set by use_host_node / use_namespaced_node

use_host_node() { NODE_IP=$(host_ip); }

use_namespaced_node() { # use_namespaced_node K: the variables above, for node gpu-real-K
  local k=$1
  NODE="gpu-real-$k"
  DIR="$CLUSTER_DIR/nodes/$NODE"
  NETNS="dualsched-$NODE"
  NODE_IP="$LINK_NET.$((10 + k))"
  POD_CIDR="10.244.$k.0/24"
  CGROUP_ROOT="/dualsched-$NODE"
  HOST_GPU_DEV_DIR="$DIR/dev"
  HOST_KUBELET_DIR="$DIR/kubelet"
  # the API server listens on every address of the root namespace; the link bridge's is the node's way in
  API_SERVER="https://$LINK_NET.1:$API_PORT"
  IN=(nsenter "--net=/run/netns/$NETNS" "--mount=$DIR/ns/mnt" "--uts=$DIR/ns/uts" --)
}

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
  # the API server's certificate names 127.0.0.1 and `kubernetes`, not the link bridge's address
  local tls_name=""; [ -z "$NODES" ] || tls_name=", tls-server-name: kubernetes"
  cat >"$DIR/$1.kubeconfig" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: dualsched-local
  cluster: {server: "$API_SERVER", certificate-authority: "$CLUSTER_DIR/pki/ca.crt"$tls_name}
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
      "$NODE_IP" "$NODE" >"$DIR/pki/serving.ext"
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
  # Namespaced nodes route pod addresses between them: a pod's traffic keeps its source address.
  local masquerade=true; [ -z "$NODES" ] || masquerade=false
  cat >"$DIR/cni/net.d/10-dualsched.conflist" <<EOF
{
  "cniVersion": "1.0.0",
  "name": "dualsched",
  "plugins": [
    {"type": "bridge", "bridge": "$BRIDGE", "isGateway": true, "ipMasq": $masquerade, "hairpinMode": true,
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
node_sysctl() { "${IN[@]}" sh -c "echo $2 >/proc/sys/$1"; }   # per network namespace

host_setup() {
  # Services from pods across the bridge need bridged traffic to pass iptables, and forwarding.
  [ -e /proc/sys/net/bridge/bridge-nf-call-iptables ] || modprobe br_netfilter 2>/dev/null ||
    die "bridged traffic is not seen by iptables (no br_netfilter): Services would not work"
  node_sysctl net/bridge/bridge-nf-call-iptables 1
  node_sysctl net/ipv4/ip_forward 1
  # Cluster DNS listens on a link-local address of its own (like NodeLocal DNSCache), reachable
  # from every pod through the bridge gateway and from host-network pods (slurmd) directly. It sits
  # on the loopback interface: this kernel has no dummy interfaces.
  "${IN[@]}" ip addr show dev lo | grep -q "$DNS_IP/32" || "${IN[@]}" ip addr add "$DNS_IP/32" dev lo
  # The kubelet's cgroup root must exist in every v1 hierarchy it uses.
  local c; for c in /sys/fs/cgroup/*/; do
    case "$c" in */unified/) continue ;; esac
    mkdir -p "$c${CGROUP_ROOT#/}" 2>/dev/null || true
  done
  mkdir -p "$HOST_KUBELET_DIR/device-plugins"
}

# /run/netns a mount point of its own, shared, before any node of either kind starts. `ip netns add` (the
# namespaced nodes) makes it one when it is not, by binding it onto itself with what is mounted in it
# (iproute2's netns_add: MS_BIND|MS_REC): each network namespace a containerd had mounted there before is then
# mounted twice, its first mount left under the new one. containerd unmounts the one it sees when the pod ends
# and cannot unlink the file (EBUSY: still a mount point in this namespace), so the pod never ends: the one-node
# tier's login pod stayed Terminating after the multi-node tier started beside it on a fresh machine, and its
# Deployment (Recreate) never got a new pod. Made here first, under a lock, nothing is under it yet.
netns_dir_setup() {
  mkdir -p /run/netns "$OWNER_DIR"
  flock "$OWNER_DIR/netns.lock" sh -c 'mountpoint -q /run/netns || mount --bind /run/netns /run/netns'
  mount --make-shared /run/netns
}

# ------------------------------------------------------------------ namespaced nodes
# The root namespace's side: one bridge for every node's link, its address the nodes' way to the API
# server, and a route to each node's pods through that node.
link_setup() {
  ip link show "$LINK_BRIDGE" >/dev/null 2>&1 || ip link add "$LINK_BRIDGE" type bridge
  ip addr show dev "$LINK_BRIDGE" | grep -q "$LINK_NET.1/24" || ip addr add "$LINK_NET.1/24" dev "$LINK_BRIDGE"
  ip link set "$LINK_BRIDGE" up
  echo 1 >/proc/sys/net/ipv4/ip_forward
  # the nodes' traffic crosses the root namespace's FORWARD chain (bridged and routed)
  local rule; for rule in "-i $LINK_BRIDGE" "-o $LINK_BRIDGE"; do
    # shellcheck disable=SC2086
    iptables -w -C FORWARD $rule -j ACCEPT 2>/dev/null || iptables -w -I FORWARD $rule -j ACCEPT
  done
}

link_teardown() {
  ip link delete "$LINK_BRIDGE" 2>/dev/null || true
  local rule; for rule in "-i $LINK_BRIDGE" "-o $LINK_BRIDGE"; do
    # shellcheck disable=SC2086
    iptables -w -D FORWARD $rule -j ACCEPT 2>/dev/null || true
  done
}

# The node's network namespace: one link to the bridge, its own loopback (cluster DNS, health ports).
netns_setup() {
  local veth="dsv-${NODE#gpu-real-}"
  ip netns list | grep -qw "$NETNS" || ip netns add "$NETNS"
  if ! ip link show "$veth" >/dev/null 2>&1; then
    ip link add "$veth" type veth peer name eth0 netns "$NETNS"
  fi
  ip link set "$veth" master "$LINK_BRIDGE" up
  ip -n "$NETNS" link set lo up
  ip -n "$NETNS" addr show dev eth0 | grep -q "$NODE_IP/24" || ip -n "$NETNS" addr add "$NODE_IP/24" dev eth0
  ip -n "$NETNS" link set eth0 up
  ip -n "$NETNS" route replace default via "$LINK_NET.1"
  ip route replace "$POD_CIDR" via "$NODE_IP"
}

# The node's mount and UTS namespaces, kept by bind mounts of their nsfs files: the node's own directories
# (NODE_DIRS) and /dev over the machine's, the rest the machine's file system (the shared directory among
# it); its own host name, which host-network pods (slurmd, job steps) share as on a real node.
mountns_setup() {
  [ -e "$DIR/ns/mnt" ] && mountpoint -q "$DIR/ns/mnt" && return
  mkdir -p "$DIR/ns"
  # an nsfs file can only be bind-mounted on a private mount
  mountpoint -q "$DIR/ns" || { mount --bind "$DIR/ns" "$DIR/ns"; mount --make-private "$DIR/ns"; }
  touch "$DIR/ns/mnt" "$DIR/ns/uts"
  unshare --uts="$DIR/ns/uts" hostname "$NODE"
  local pair binds=()
  for pair in "${NODE_DIRS[@]}"; do
    mkdir -p "$DIR/${pair%%:*}" "${pair#*:}"
    binds+=("$DIR/${pair%%:*}" "${pair#*:}")
  done
  node_dev
  unshare --mount="$DIR/ns/mnt" --propagation slave sh -euc '
    dev=$1; shift
    while [ $# -gt 0 ]; do mount --bind "$1" "$2"; shift 2; done
    # /dev: the copy, with the machine'"'"'s terminals and message queues and a /dev/shm of its own
    mount --bind /dev/pts "$dev/pts"
    mount -t tmpfs -o mode=1777,nosuid,nodev shm "$dev/shm"
    [ ! -d /dev/mqueue ] || mount --bind /dev/mqueue "$dev/mqueue"
    mount --rbind "$dev" /dev
  ' sh "$DIR/dev" "${binds[@]}"
}

# The node's /dev: the machine's device files and links (not its GPUs: the node's double makes its own)
node_dev() {
  [ -e "$DIR/dev/null" ] && return
  mkdir -p "$DIR/dev"
  cp -a --one-file-system /dev/. "$DIR/dev/"
  rm -f "$DIR"/dev/nvidia*
  mkdir -p "$DIR/dev/pts" "$DIR/dev/shm" "$DIR/dev/mqueue"
}

namespaces_teardown() {
  ip route del "$POD_CIDR" 2>/dev/null || true
  ip link delete "dsv-${NODE#gpu-real-}" 2>/dev/null || true
  ip netns delete "$NETNS" 2>/dev/null || true
  umount "$DIR/ns/mnt" 2>/dev/null || true
  umount "$DIR/ns/uts" 2>/dev/null || true
  umount "$DIR/ns" 2>/dev/null || true
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
address: $NODE_IP
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
# A pod's ConfigMap and Secret volumes follow their objects at its next sync: every 10 s here, not the default
# minute, so that a config change (slurm.conf, a moved window) reaches the pods of this small cluster in seconds.
syncFrequency: 10s
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
cluster.local:53 in-addr.arpa:53 ip6.arpa:53 {
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
.:53 {
    bind $DNS_IP
    errors
    template ANY ANY {
        rcode NXDOMAIN
    }
}
EOF
  # No forward: pods here never need names outside the cluster, so nothing leaves the machine. Every other
  # name (a node's, gpu-real-1: none resolves here) gets NXDOMAIN, as a site's DNS answers a name it does not
  # know. Without that block CoreDNS refused them, which a resolver reports as a temporary failure
  # (EAI_AGAIN): Debian's Slurm 24.11 retries those with growing pauses, and a slurmctld restarted before
  # its nodes registered spent minutes resolving their names (the multi-node tier's 24.11 controllers then
  # took control from each other until `pulumi up` timed out).
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
  start_daemon kube-router "${IN[@]}" "$(bin_of kube-router "$KUBE_ROUTER_VERSION")" \
    --kubeconfig "$DIR/kube-router.kubeconfig" --hostname-override "$NODE" \
    --run-firewall=true --run-router=false --run-service-proxy=false --enable-cni=false \
    --service-cluster-ip-range "$SERVICE_CIDR" --health-port 0 --metrics-port 0 --v 1
}
policies_enforced() { "${IN[@]}" iptables -S KUBE-ROUTER-FORWARD >/dev/null 2>&1; }

node_registered() { kc get node "$NODE" -o name >/dev/null 2>&1; }
node_ready() {
  [ "$(kc get node "$NODE" -o jsonpath='{.status.conditions[?(@.type=="Ready")].status}' 2>/dev/null)" = True ]
}
node_has_gpus() {
  [ "$(kc get node "$NODE" -o jsonpath='{.status.allocatable.nvidia\.com/gpu}' 2>/dev/null)" = "$GPUS" ]
}
dns_answers() {
  [ -z "$NODES" ] && getent ahostsv4 kubernetes.default.svc.cluster.local >/dev/null 2>&1 && return 0
  # the host's resolver is not ours: ask CoreDNS directly
  "${IN[@]}" python3 - "$DNS_IP" <<'PY' 2>/dev/null
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
  for f in "$HOST_GPU_DEV_DIR"/nvidia[0-9]*; do
    [ -c "$f" ] && [ "$(stat -c %t "$f")" = c3 ] && [ "$((16#$(stat -c %T "$f")))" = "${f#"$HOST_GPU_DEV_DIR"/nvidia}" ] && echo "$f"
  done
  return 0
}
no_nvidia_driver() { [ ! -e /proc/driver/nvidia ]; }

# The kinds of node: host (this machine itself) and namespaced (gpu-real-1..N); one of each per machine.
owner_file() { if [ "$1" = host ]; then echo "$OWNER_DIR/host-node"; else echo "$OWNER_DIR/namespaced-nodes"; fi; }
owner_of() { cat "$(owner_file "$1")" 2>/dev/null || true; }
node_dirs_of() { # node_dirs_of CLUSTER_DIR KIND: where that cluster's nodes of that kind keep their pids
  if [ "$2" = host ]; then echo "$1/node"; else echo "$1"/nodes/gpu-real-*; fi
}

# nodes_running CLUSTER_DIR KIND: a kubelet of that cluster's nodes of that kind is alive
nodes_running() {
  local d; for d in $(node_dirs_of "$1" "$2"); do
    [ -f "$d/pids/kubelet.pid" ] && kill -0 "$(cat "$d/pids/kubelet.pid")" 2>/dev/null && return 0
  done
  return 1
}

# refuse_foreign KIND: what down removes of that kind is the machine's (kubelet dir, bridges, cgroups,
# /dev/nvidiaK): never under another cluster dir's running nodes
refuse_foreign() {
  local owner; owner=$(owner_of "$1")
  if [ -n "$owner" ] && [ "$owner" != "$CLUSTER_DIR" ] && nodes_running "$owner" "$1"; then
    die "the $1 nodes running on this machine are $owner's, not $CLUSTER_DIR's (one set of each kind per machine): not touching them; DUALSCHED_CLUSTER_DIR=$owner tools/node.sh down stops them"
  fi
}

# claim_machine KIND: this cluster dir's nodes of that kind are the machine's; another's, stopped, are cleaned up
claim_machine() {
  local kind=$1 other; other=$(owner_of "$kind")
  mkdir -p "$OWNER_DIR"
  refuse_foreign "$kind"
  if [ -n "$other" ] && [ "$other" != "$CLUSTER_DIR" ]; then
    # its processes are gone (killed, machine restarted) but its mounts, network and cgroups may not be
    log "cleaning up after the stopped $kind nodes of $other"
    DUALSCHED_CLUSTER_DIR="$other" "$HERE/node.sh" down
  fi
  echo "$CLUSTER_DIR" >"$(owner_file "$kind")"
}

release_machine() { [ "$(owner_of "$1")" != "$CLUSTER_DIR" ] || rm -f "$(owner_file "$1")"; }

cmd_up() {
  [ "$(id -u)" -eq 0 ] || die "a real node needs root (containerd, network namespaces, cgroups)"
  [ -f "$CLUSTER_DIR/kubeconfig" ] || die "no control plane in $CLUSTER_DIR: run tools/cluster.sh up none"
  no_nvidia_driver || die "NVIDIA's driver is loaded here (/proc/driver/nvidia): the GPU double's /dev/nvidiaK would stand in for real GPUs"
  [ -z "$NODES" ] || [[ "$NODES" =~ ^[1-9][0-9]?$ ]] || die "DUALSCHED_NODES must be a number of nodes, 1 to 99 (got $NODES)"
  install_debs
  netns_dir_setup
  if [ -z "$NODES" ]; then
    claim_machine host
    use_host_node
    node_up
    return
  fi
  [ ! -d "$CLUSTER_DIR/node" ] || die "this cluster already has a host node ($CLUSTER_DIR/node): tools/node.sh down first"
  claim_machine namespaced
  link_setup
  local k; for k in $(seq 1 "$NODES"); do
    use_namespaced_node "$k"
    mkdir -p "$DIR"
    netns_setup
    mountns_setup
    node_up
  done
}

node_up() {
  local t0; t0=$(date +%s)
  mkdir -p "$DIR"/{logs,pids}
  gen_pki
  host_setup
  write_containerd_config
  start_daemon containerd "${IN[@]}" containerd --config "$DIR/containerd/config.toml"
  wait_for 60 "containerd" containerd_ready
  "$HERE/images.sh" import --address "$DIR/containerd/containerd.sock"

  write_kubelet_config
  start_daemon kubelet "${IN[@]}" "$(bin_of kubelet "$KUBERNETES_VERSION")" \
    --config "$DIR/kubelet-config.yaml" --kubeconfig "$DIR/kubelet.kubeconfig" \
    --root-dir "$KUBELET_DIR" --hostname-override "$NODE" --node-ip "$NODE_IP" \
    --node-labels "dualsched.io/real-node=true" --v 1
  wait_for 120 "node $NODE to register" node_registered
  start_daemon gpu-device-plugin-double "${IN[@]}" "$(bin_of gpu-device-plugin-double "$GPU_DEVICE_PLUGIN_DOUBLE_VERSION")" \
    --count "$GPUS" --device-dir "$GPU_DEV_DIR" --kubelet-dir "$KUBELET_DIR/device-plugins"
  write_kube_proxy_config
  start_daemon kube-proxy "${IN[@]}" "$(bin_of kube-proxy "$KUBERNETES_VERSION")" --config "$DIR/kube-proxy-config.yaml" --v 1
  write_corefile
  start_daemon coredns "${IN[@]}" "$(bin_of coredns "$COREDNS_VERSION")" -conf "$DIR/Corefile"
  start_kube_router
  wait_for 180 "node $NODE Ready" node_ready
  wait_for 60 "nvidia.com/gpu=$GPUS allocatable on $NODE (device plugin double)" node_has_gpus
  [ "$(gpu_device_files | wc -l)" -ge "$GPUS" ] || die "the GPU double made no $GPU_DEV_DIR/nvidia0..$((GPUS - 1)) (log: $DIR/logs/gpu-device-plugin-double.log)"
  wait_for 60 "cluster DNS on $DNS_IP" dns_answers
  wait_for 60 "NetworkPolicy enforcement (kube-router's chains)" policies_enforced
  log "up in $(( $(date +%s) - t0 ))s: node $NODE ($NODE_IP) Ready, $GPUS GPUs (double), DNS $DNS_IP, pods on $POD_CIDR"
}

# The namespaced nodes of this cluster dir, by number (1 2 3 ...)
namespaced_nodes() {
  local d; for d in "$CLUSTER_DIR"/nodes/gpu-real-*; do [ -d "$d" ] && echo "${d##*/gpu-real-}"; done | sort -n
}

cmd_down() {
  local k found=""
  [ -z "$(namespaced_nodes)" ] || refuse_foreign namespaced
  [ ! -d "$CLUSTER_DIR/node" ] || refuse_foreign host
  for k in $(namespaced_nodes); do
    NODES=$k; use_namespaced_node "$k"; node_down; found=1
  done
  [ -z "$found" ] || { link_teardown; rmdir "$CLUSTER_DIR/nodes" 2>/dev/null || true; }
  NODES=""; DIR="$CLUSTER_DIR/node"
  if [ -d "$DIR" ]; then node_down; found=1; fi
  [ -n "$found" ] || log "no node in $CLUSTER_DIR"
  release_machine namespaced; release_machine host
}

node_down() {
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
  [ -z "$NODES" ] || { namespaced_node_down; return; }
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
sys.stdout.write("".join(l for l in sys.stdin if not ours.search(l)))' | iptables-restore -w -T "$table" 2>/dev/null || true
  done
  # kube-router's ipsets (KUBE-SRC-/KUBE-DST-..., kube-router-...), unreferenced now that its chains are gone
  local name; for name in $(ipset list -n 2>/dev/null); do
    case "$name" in KUBE-*|kube-router*) ipset destroy "$name" 2>/dev/null || true ;; esac
  done
  node_cgroups_down
  # the host's GPU device files the double made (never with NVIDIA's driver loaded: then they are real)
  if no_nvidia_driver; then
    local f; for f in $(gpu_device_files); do rm -f "$f"; done
  fi
  # The kubelet directory's contents, never the directory: each namespaced node has its own mounted on this
  # path, and removing a mount point detaches the mounts on it in every other mount namespace (the nodes'
  # kubelets then shared this machine's directory and removed each other's pod volumes).
  find "$KUBELET_DIR" -mindepth 1 -maxdepth 1 -exec rm -rf {} + 2>/dev/null || true
  rm -rf "$DIR"
  log "down"
}

# A namespaced node's network, iptables, ipsets, DNS address and mounts go with its namespaces.
namespaced_node_down() {
  node_cgroups_down
  namespaces_teardown
  rm -rf "$DIR"
  log "$NODE down"
}

node_cgroups_down() {
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
}

container_task_ids() { ctr --address "$DIR/containerd/containerd.sock" -n k8s.io tasks ls -q 2>/dev/null || true; }

cmd_status() {
  local k rc=0
  for k in $(namespaced_nodes); do
    NODES=$k; use_namespaced_node "$k"; node_status || rc=1
  done
  NODES=""; DIR="$CLUSTER_DIR/node"
  if [ -d "$DIR" ] || [ -z "$(namespaced_nodes)" ]; then node_status || rc=1; fi
  return $rc
}

node_status() {
  local d rc=0
  for d in "${DAEMONS[@]}"; do
    if pid_alive "$d"; then log "$d: running (pid $(cat "$DIR/pids/$d.pid"))"; else log "$d: not running"; rc=1; fi
  done
  log "GPU device files: $(gpu_device_files | tr '\n' ' ')"
  if node_ready; then log "node $NODE: Ready, nvidia.com/gpu=$(kc get node "$NODE" -o jsonpath='{.status.allocatable.nvidia\.com/gpu}')"
  else log "node $NODE: not Ready"; rc=1; fi
  return $rc
}

# ------------------------------------------------------------------ a node lost and back
use_node_named() { # use_node_named gpu-real-K: a namespaced node of this cluster
  local k=${1#gpu-real-}
  [[ "$k" =~ ^[0-9]+$ ]] && [ -d "$CLUSTER_DIR/nodes/$1" ] || die "no namespaced node $1 in $CLUSTER_DIR/nodes"
  NODES=$k; use_namespaced_node "$k"
}

node_daemons_signal() { local d; for d in "${DAEMONS[@]}"; do pid_alive "$d" && kill "-$1" "$(cat "$DIR/pids/$d.pid")"; done; return 0; }

cmd_fail() {
  use_node_named "$1"
  ip link set "dsv-${NODE#gpu-real-}" down   # nothing reaches it, nothing leaves it
  node_daemons_signal STOP                  # its kubelet stops reporting: NotReady after the grace period
  local p; for p in $(find /sys/fs/cgroup/pids/"${CGROUP_ROOT#/}" -name cgroup.procs -exec cat {} + 2>/dev/null | sort -u); do
    kill -KILL "$p" 2>/dev/null || true      # its pods' processes die with it (their locks and sockets too)
  done
  log "$NODE failed: link down, daemons stopped, pods' processes killed"
}

cmd_recover() {
  use_node_named "$1"
  node_daemons_signal CONT
  ip link set "dsv-${NODE#gpu-real-}" up
  wait_for 180 "node $NODE Ready again" node_ready
  log "$NODE recovered: its pods' containers restarted by the kubelet"
}

case "${1:-}" in
  up) cmd_up ;;
  down) cmd_down ;;
  status) cmd_status ;;
  fail) cmd_fail "${2:?node name}" ;;
  recover) cmd_recover "${2:?node name}" ;;
  *) echo "usage: $0 up | down | status | fail NODE | recover NODE" >&2; exit 2 ;;
esac
