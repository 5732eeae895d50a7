#!/usr/bin/env bash
# Local Kubernetes control plane for dualsched: etcd + kube-apiserver + kube-controller-manager
# + kube-scheduler + KWOK (fake nodes), all on 127.0.0.1, built by tools/build-tools.sh.
#
# Usage:
#   tools/cluster.sh up [NODES_FILE]   start (idempotent) and wait until healthy and nodes Ready
#                                      NODES_FILE default: tools/kwok/dev-nodes.yaml; "none": no KWOK
#                                      and no fake nodes (the real node of tools/node.sh joins later)
#   tools/cluster.sh down              stop all processes (pid files) and remove the state dir
#   tools/cluster.sh status            show process / API / node status (exit 1 if not running)
#   tools/cluster.sh env               print `export KUBECONFIG=...` for eval
#   tools/cluster.sh pvs               top up the class-less static PVs (see Storage below; `up` does it too)
#   tools/cluster.sh smoke             prove it works: Deployment + DaemonSet on the GPU/CPU nodes,
#                                      NFS PV/PVC Bound, privileged pod rejected by PodSecurity
#
# Storage: there is no dynamic provisioner and no default StorageClass. `up` keeps
# DUALSCHED_LOCAL_PVS (default 4) class-less static PVs Available (hostPath under $DIR/volumes,
# ReadWriteOnce and ReadWriteMany, 50Gi, reclaim Retain, label dualsched.io/local-pv=true): a claim without a
# storageClassName binds to such a PV when the cluster has no default class. Released PVs are
# never reused (Retain); the next `up` tops the pool up with new ones.
#
# State: ${DUALSCHED_CLUSTER_DIR:-$HOME/.cache/dualsched-cluster}  (kubeconfig, pki, logs, pids, etcd data)
# Fake nodes' heartbeat: DUALSCHED_KWOK_NODE_LEASE_SECONDS (40) is each node's Lease, renewed every quarter of
#   it as a kubelet does; 0: no Lease, only KWOK's status heartbeat (20-45 s apart, which a loaded machine
#   pushed past the controller manager's 50 s grace: nodes went NotReady and their pods lost Ready for good).
# Ports (env): DUALSCHED_APISERVER_PORT (6443), DUALSCHED_ETCD_PORT (23790, peer = +1),
#              DUALSCHED_KCM_PORT (10257), DUALSCHED_SCHEDULER_PORT (10259)
# Binaries: ${DUALSCHED_TOOLS_CACHE:-$HOME/.cache/dualsched-tools}/<tool>-<version>/bin (tools/versions.env)
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=versions.env
source "$HERE/versions.env"
TOOLS_CACHE="${DUALSCHED_TOOLS_CACHE:-$HOME/.cache/dualsched-tools}"
DIR="${DUALSCHED_CLUSTER_DIR:-$HOME/.cache/dualsched-cluster}"
API_PORT="${DUALSCHED_APISERVER_PORT:-6443}"
ETCD_PORT="${DUALSCHED_ETCD_PORT:-23790}"
ETCD_PEER_PORT=$((ETCD_PORT + 1))
KCM_PORT="${DUALSCHED_KCM_PORT:-10257}"
SCHED_PORT="${DUALSCHED_SCHEDULER_PORT:-10259}"
SERVICE_CIDR="10.96.0.0/16"
KUBECONFIG_FILE="$DIR/kubeconfig"
DAEMONS=(etcd kube-apiserver kube-controller-manager kube-scheduler kwok)

log() { echo "[cluster] $*"; }
die() { echo "[cluster] ERROR: $*" >&2; exit 1; }
# shellcheck source=daemons.sh
source "$HERE/daemons.sh"

bin_of() {
  local t=$1 v
  case "$t" in
    etcd) v=$ETCD_VERSION ;;
    kwok) v=$KWOK_VERSION ;;
    kube-*|kubectl) v=$KUBERNETES_VERSION ;;
  esac
  local b="$TOOLS_CACHE/$t-$v/bin/$t"
  if [ -x "$b" ]; then echo "$b"; return; fi
  if [ "$t" = kubectl ] && command -v kubectl >/dev/null; then command -v kubectl; return; fi
  die "$t $v not built: run tools/build-tools.sh"
}

kc() { "$(bin_of kubectl)" --kubeconfig "$KUBECONFIG_FILE" "$@"; }

etcd_healthy() { curl -fsS --max-time 2 "http://127.0.0.1:$ETCD_PORT/health" -o /dev/null 2>/dev/null; }

api_healthy() {
  [ -f "$DIR/pki/admin.crt" ] || return 1
  curl -fsS --max-time 3 --cacert "$DIR/pki/ca.crt" --cert "$DIR/pki/admin.crt" --key "$DIR/pki/admin.key" \
    "https://127.0.0.1:$API_PORT/readyz" >/dev/null 2>&1
}

port_busy() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

start_proc() { # start_proc NAME [PORT...] -- CMD...   (refuses to start if a PORT is taken)
  local name=$1 port; shift
  local ports=()
  while [ "$1" != "--" ]; do ports+=("$1"); shift; done; shift
  if pid_alive "$name"; then log "$name already running (pid $(cat "$DIR/pids/$name.pid"))"; return; fi
  for port in "${ports[@]}"; do
    port_busy "$port" && die "cannot start $name: 127.0.0.1:$port is already in use (another cluster with a different DUALSCHED_CLUSTER_DIR? change the DUALSCHED_*_PORT variables)"
  done
  start_daemon "$name" "$@"
}

# ------------------------------------------------------------------ PKI
gen_pki() {
  local p="$DIR/pki"
  [ -f "$p/.done" ] && return
  mkdir -p "$p"; chmod 700 "$p"
  log "generating certificates in $p"
  (
    cd "$p"
    openssl req -x509 -newkey rsa:2048 -nodes -keyout ca.key -out ca.crt -days 3650 \
      -subj "/CN=dualsched-local-ca" 2>/dev/null
    # kube-apiserver serving cert
    cat >apiserver.ext <<EOF
basicConstraints=CA:FALSE
keyUsage=digitalSignature,keyEncipherment
extendedKeyUsage=serverAuth
subjectAltName=IP:127.0.0.1,IP:10.96.0.1,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local
EOF
    client_ext='basicConstraints=CA:FALSE
keyUsage=digitalSignature,keyEncipherment
extendedKeyUsage=clientAuth'
    echo "$client_ext" >client.ext
    sign() { # sign NAME SUBJECT EXTFILE
      openssl req -newkey rsa:2048 -nodes -keyout "$1.key" -out "$1.csr" -subj "$2" 2>/dev/null
      openssl x509 -req -in "$1.csr" -CA ca.crt -CAkey ca.key -CAcreateserial -out "$1.crt" -days 3650 \
        -extfile "$3" 2>/dev/null
      rm -f "$1.csr"
    }
    sign apiserver "/CN=kube-apiserver" apiserver.ext
    sign admin "/O=system:masters/CN=dualsched-admin" client.ext
    sign controller-manager "/CN=system:kube-controller-manager" client.ext
    sign scheduler "/CN=system:kube-scheduler" client.ext
    sign kwok "/O=system:masters/CN=kwok-controller" client.ext
    # kube-apiserver -> kubelet (logs, exec): the name kubeadm gives it
    sign apiserver-kubelet-client "/CN=kube-apiserver-kubelet-client" client.ext
    # service-account token signing key pair
    openssl genrsa -out sa.key 2048 2>/dev/null
    openssl rsa -in sa.key -pubout -out sa.pub 2>/dev/null
    chmod 600 ./*.key
    touch .done
  )
}

# front-proxy (request-header) CA + client cert: lets components/aggregated APIs trust the
# apiserver's proxied requests (and silences "missing content for CA bundle requestheader").
gen_front_proxy_pki() {
  local p="$DIR/pki"
  [ -f "$p/front-proxy-client.crt" ] && return
  (
    cd "$p"
    openssl req -x509 -newkey rsa:2048 -nodes -keyout front-proxy-ca.key -out front-proxy-ca.crt -days 3650 \
      -subj "/CN=dualsched-front-proxy-ca" 2>/dev/null
    openssl req -newkey rsa:2048 -nodes -keyout front-proxy-client.key -out front-proxy-client.csr \
      -subj "/CN=front-proxy-client" 2>/dev/null
    openssl x509 -req -in front-proxy-client.csr -CA front-proxy-ca.crt -CAkey front-proxy-ca.key \
      -CAcreateserial -out front-proxy-client.crt -days 3650 -extfile client.ext 2>/dev/null
    rm -f front-proxy-client.csr; chmod 600 ./*.key
  )
}

write_kubeconfig() { # write_kubeconfig FILE CERTNAME USER
  local f=$1 c=$2 u=$3 p="$DIR/pki"
  cat >"$f" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: dualsched-local
  cluster:
    server: https://127.0.0.1:$API_PORT
    certificate-authority-data: $(base64 -w0 "$p/ca.crt")
users:
- name: $u
  user:
    client-certificate-data: $(base64 -w0 "$p/$c.crt")
    client-key-data: $(base64 -w0 "$p/$c.key")
contexts:
- name: dualsched-local
  context: {cluster: dualsched-local, user: $u}
current-context: dualsched-local
EOF
  chmod 600 "$f"
}

# ------------------------------------------------------------------ nodes
render_nodes() { # render_nodes NODES_FILE -> Node manifests (JSON List) on stdout
  python3 - "$1" <<'PY'
import json, sys
path = sys.argv[1]
text = open(path).read()
try:
    import yaml
    doc = yaml.safe_load(text)
except ImportError:
    doc = json.loads(text)
defaults = (doc or {}).get("defaults") or {}
items = []
for n in (doc or {}).get("nodes") or []:
    name = n["name"]
    cap = dict(defaults.get("capacity") or {})
    cap.update({k: str(v) for k, v in (n.get("capacity") or {}).items()})
    cap = {k: str(v) for k, v in cap.items()}
    alloc = dict(cap)
    alloc.update({k: str(v) for k, v in (n.get("allocatable") or {}).items()})
    labels = {"kubernetes.io/hostname": name, "kubernetes.io/os": "linux", "kubernetes.io/arch": "amd64",
              "type": "kwok"}
    labels.update({k: ("" if v is None else str(v)) for k, v in (n.get("labels") or {}).items()})
    ann = {"kwok.x-k8s.io/node": "fake", "node.alpha.kubernetes.io/ttl": "0"}
    ann.update({k: str(v) for k, v in (n.get("annotations") or {}).items()})
    items.append({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name, "labels": labels, "annotations": ann},
        "spec": {},
        "status": {"capacity": cap, "allocatable": alloc, "phase": "Running",
                   "nodeInfo": {"architecture": "amd64", "operatingSystem": "linux",
                                "kubeletVersion": "fake", "kubeProxyVersion": "fake",
                                "containerRuntimeVersion": "kwok", "kernelVersion": "kwok",
                                "osImage": "kwok", "bootID": "", "machineID": "", "systemUUID": ""}},
    })
if not items:
    sys.exit("no nodes in " + path)
print(json.dumps({"apiVersion": "v1", "kind": "List", "items": items}))
PY
}

create_nodes() { # create missing nodes (existing ones are left alone: Pulumi patches labels/taints)
  local file=$1 have missing
  render_nodes "$file" >"$DIR/nodes.json" || die "cannot parse nodes file $file"
  python3 -c 'import json,sys; print(" ".join(i["metadata"]["name"] for i in json.load(open(sys.argv[1]))["items"]))' \
    "$DIR/nodes.json" >"$DIR/nodes.txt"
  have=$(kc get nodes -o name 2>/dev/null | sed 's#node/##' | tr '\n' ' ')
  missing=$(python3 -c '
import json, sys
doc = json.load(open(sys.argv[1])); have = set(sys.argv[2].split())
doc["items"] = [i for i in doc["items"] if i["metadata"]["name"] not in have]
print(json.dumps(doc) if doc["items"] else "")' "$DIR/nodes.json" "$have")
  if [ -n "$missing" ]; then
    log "creating nodes from $file"
    kc create -f - <<<"$missing" >/dev/null
  fi
}

# Keep $LOCAL_PVS class-less static PVs Available for claims without a storageClassName
# (controller state, accounting database): no default StorageClass + storageClassName "" on the PV.
LOCAL_PVS="${DUALSCHED_LOCAL_PVS:-4}"
ensure_local_pvs() {
  local available last n name added=""
  available=$(kc get pv -l dualsched.io/local-pv=true \
    -o jsonpath='{range .items[?(@.status.phase=="Available")]}{.metadata.name}{"\n"}{end}' | grep -c . || true)
  last=$(kc get pv -l dualsched.io/local-pv=true -o name | sed -n 's#.*/local-pv-0*##p' | sort -n | tail -1)
  n=${last:-0}
  while [ "$available" -lt "$LOCAL_PVS" ]; do
    n=$((n + 1)); name=$(printf 'local-pv-%03d' "$n")
    mkdir -p "$DIR/volumes/$name"
    # Like a local-path provisioner: the pod's own user (mysql, slurm) must be able to write it;
    # fsGroup does not apply to hostPath volumes. ReadWriteMany too: a directory of this machine is
    # the same directory on every real node (tools/node.sh), so slurmctld's backup shares the state.
    chmod 0777 "$DIR/volumes/$name"
    kc create -f - >/dev/null <<EOF
apiVersion: v1
kind: PersistentVolume
metadata: {name: $name, labels: {dualsched.io/local-pv: "true"}}
spec:
  capacity: {storage: 50Gi}
  accessModes: [ReadWriteOnce, ReadWriteMany]
  storageClassName: ""
  persistentVolumeReclaimPolicy: Retain
  hostPath: {path: $DIR/volumes/$name, type: DirectoryOrCreate}
EOF
    available=$((available + 1)); added+=" $name"
  done
  if [ -n "$added" ]; then log "created class-less static PVs:$added"; fi
}

sa_ready() { kc get serviceaccount default -n default -o name >/dev/null 2>&1; }

nodes_ready() {
  local n ok=0 total=0
  for n in $(cat "$DIR/nodes.txt"); do
    total=$((total + 1))
    [ "$(kc get node "$n" -o jsonpath='{.status.conditions[?(@.type=="Ready")].status}' 2>/dev/null)" = True ] && ok=$((ok + 1))
  done
  [ "$total" -gt 0 ] && [ "$ok" -eq "$total" ]
}

# ------------------------------------------------------------------ commands
cmd_up() {
  local nodes_file="${1:-$HERE/kwok/dev-nodes.yaml}"
  if [ "$nodes_file" = none ]; then DAEMONS=(etcd kube-apiserver kube-controller-manager kube-scheduler); fi
  [ "$nodes_file" = none ] || [ -f "$nodes_file" ] || die "nodes file not found: $nodes_file"
  local t0; t0=$(date +%s)
  local all=1 c
  for c in "${DAEMONS[@]}"; do pid_alive "$c" || all=0; done
  if [ $all = 1 ] && api_healthy; then
    log "cluster already running in $DIR"
  fi
  mkdir -p "$DIR"/{logs,pids,etcd}
  gen_pki
  gen_front_proxy_pki
  local p="$DIR/pki"
  write_kubeconfig "$KUBECONFIG_FILE" admin dualsched-admin
  write_kubeconfig "$DIR/controller-manager.kubeconfig" controller-manager system:kube-controller-manager
  write_kubeconfig "$DIR/scheduler.kubeconfig" scheduler system:kube-scheduler
  write_kubeconfig "$DIR/kwok.kubeconfig" kwok kwok-controller

  start_proc etcd "$ETCD_PORT" "$ETCD_PEER_PORT" -- "$(bin_of etcd)" --name dualsched --data-dir "$DIR/etcd" \
    --listen-client-urls "http://127.0.0.1:$ETCD_PORT" --advertise-client-urls "http://127.0.0.1:$ETCD_PORT" \
    --listen-peer-urls "http://127.0.0.1:$ETCD_PEER_PORT" --initial-advertise-peer-urls "http://127.0.0.1:$ETCD_PEER_PORT" \
    --initial-cluster "dualsched=http://127.0.0.1:$ETCD_PEER_PORT" --listen-metrics-urls "" \
    --unsafe-no-fsync --log-level warn
  wait_for 60 "etcd" etcd_healthy

  # With KWOK nothing in a pod calls the API. A real node's pods do (the token minter's TokenReview):
  # they reach it through the `kubernetes` Service, whose endpoint must be this host's address.
  local api_address=(--bind-address 127.0.0.1 --advertise-address 127.0.0.1) api_endpoints=(--endpoint-reconciler-type none)
  if [ "$nodes_file" = none ]; then
    local address; address="$(ip -4 route get 1.1.1.1 2>/dev/null | sed -n 's/.* src \([0-9.]*\).*/\1/p')"
    [ -n "$address" ] || die "no IPv4 address with a default route: the node's pods could not reach the API server"
    api_address=(--bind-address 0.0.0.0 --advertise-address "$address") api_endpoints=(--endpoint-reconciler-type lease)
  fi
  start_proc kube-apiserver "$API_PORT" -- "$(bin_of kube-apiserver)" \
    --etcd-servers "http://127.0.0.1:$ETCD_PORT" \
    "${api_address[@]}" --secure-port "$API_PORT" \
    --tls-cert-file "$p/apiserver.crt" --tls-private-key-file "$p/apiserver.key" \
    --client-ca-file "$p/ca.crt" \
    --service-account-key-file "$p/sa.pub" --service-account-signing-key-file "$p/sa.key" \
    --service-account-issuer https://kubernetes.default.svc.cluster.local \
    --api-audiences https://kubernetes.default.svc.cluster.local \
    --service-cluster-ip-range "$SERVICE_CIDR" \
    --authorization-mode Node,RBAC \
    --kubelet-preferred-address-types InternalIP,Hostname \
    --kubelet-client-certificate "$p/apiserver-kubelet-client.crt" --kubelet-client-key "$p/apiserver-kubelet-client.key" \
    --enable-admission-plugins NodeRestriction,NamespaceLifecycle,LimitRanger,ServiceAccount,DefaultStorageClass,DefaultTolerationSeconds,PodSecurity,Priority,ResourceQuota,StorageObjectInUseProtection,PersistentVolumeClaimResize,RuntimeClass,MutatingAdmissionWebhook,ValidatingAdmissionWebhook,ValidatingAdmissionPolicy \
    --allow-privileged=true \
    --requestheader-client-ca-file "$p/front-proxy-ca.crt" --requestheader-allowed-names front-proxy-client \
    --requestheader-username-headers X-Remote-User --requestheader-group-headers X-Remote-Group \
    --requestheader-extra-headers-prefix X-Remote-Extra- \
    --proxy-client-cert-file "$p/front-proxy-client.crt" --proxy-client-key-file "$p/front-proxy-client.key" \
    "${api_endpoints[@]}" \
    --profiling=false --v 1
  wait_for 120 "kube-apiserver /readyz" api_healthy

  start_proc kube-controller-manager "$KCM_PORT" -- "$(bin_of kube-controller-manager)" \
    --kubeconfig "$DIR/controller-manager.kubeconfig" \
    --authentication-kubeconfig "$DIR/controller-manager.kubeconfig" \
    --authorization-kubeconfig "$DIR/controller-manager.kubeconfig" \
    --bind-address 127.0.0.1 --secure-port "$KCM_PORT" \
    --service-account-private-key-file "$p/sa.key" --root-ca-file "$p/ca.crt" \
    --cluster-signing-cert-file "$p/ca.crt" --cluster-signing-key-file "$p/ca.key" \
    --use-service-account-credentials=true --service-cluster-ip-range "$SERVICE_CIDR" \
    --controllers '*' --leader-elect=false --profiling=false --v 1
  start_proc kube-scheduler "$SCHED_PORT" -- "$(bin_of kube-scheduler)" \
    --kubeconfig "$DIR/scheduler.kubeconfig" \
    --authentication-kubeconfig "$DIR/scheduler.kubeconfig" \
    --authorization-kubeconfig "$DIR/scheduler.kubeconfig" \
    --bind-address 127.0.0.1 --secure-port "$SCHED_PORT" \
    --leader-elect=false --profiling=false --v 1
  if [ "$nodes_file" = none ]; then
    wait_for 120 "default service account" sa_ready
    ensure_local_pvs
    log "up in $(( $(date +%s) - t0 ))s: https://127.0.0.1:$API_PORT, no KWOK nodes (add a real one: tools/node.sh up)"
    log "export KUBECONFIG=$KUBECONFIG_FILE"
    return
  fi
  start_proc kwok -- "$(bin_of kwok)" \
    --kubeconfig "$DIR/kwok.kubeconfig" \
    --config "$HERE/kwok/stages.yaml" \
    --manage-all-nodes=false \
    --manage-nodes-with-annotation-selector kwok.x-k8s.io/node=fake \
    --node-lease-duration-seconds "${DUALSCHED_KWOK_NODE_LEASE_SECONDS:-40}" \
    --node-ip 10.0.0.1 --cidr 10.244.0.1/16

  create_nodes "$nodes_file"
  wait_for 120 "nodes Ready ($(cat "$DIR/nodes.txt"))" nodes_ready
  wait_for 120 "default service account" sa_ready
  ensure_local_pvs
  for c in "${DAEMONS[@]}"; do pid_alive "$c" || die "$c exited; see $DIR/logs/$c.log"; done
  log "up in $(( $(date +%s) - t0 ))s: https://127.0.0.1:$API_PORT, nodes Ready: $(cat "$DIR/nodes.txt")"
  log "export KUBECONFIG=$KUBECONFIG_FILE"
}

cmd_down() {
  local i
  for ((i = ${#DAEMONS[@]} - 1; i >= 0; i--)); do stop_daemon "${DAEMONS[$i]}"; done
  if [ -d "$DIR" ]; then log "removing $DIR"; rm -rf "$DIR"; fi
  log "down"
}

cmd_status() {
  local c rc=0
  for c in "${DAEMONS[@]}"; do
    # a cluster started with `up none` has no KWOK
    if [ "$c" = kwok ] && [ ! -f "$DIR/pids/kwok.pid" ]; then continue; fi
    if pid_alive "$c"; then log "$c: running (pid $(cat "$DIR/pids/$c.pid"))"; else log "$c: not running"; rc=1; fi
  done
  if api_healthy; then
    log "kube-apiserver: healthy at https://127.0.0.1:$API_PORT (KUBECONFIG=$KUBECONFIG_FILE)"
    kc get nodes -L dualsched.io/pool 2>/dev/null | sed 's/^/[cluster]   /'
  else
    log "kube-apiserver: not healthy"; rc=1
  fi
  return $rc
}

cmd_smoke() { # needs GPU nodes (nvidia.com/gpu.present=true) and CPU nodes (node-role.kubernetes.io/cpu)
  api_healthy || die "cluster not running"
  local ns=dualsched-smoke rns=dualsched-smoke-restricted ok=1
  kc delete ns "$ns" "$rns" --ignore-not-found --wait=true >/dev/null 2>&1 || true
  kc delete pv dualsched-smoke-pv --ignore-not-found >/dev/null 2>&1 || true
  kc apply -f - >/dev/null <<EOF
apiVersion: v1
kind: Namespace
metadata: {name: $ns}
---
apiVersion: v1
kind: Namespace
metadata: {name: $rns, labels: {pod-security.kubernetes.io/enforce: restricted}}
---
apiVersion: apps/v1
kind: Deployment
metadata: {name: smoke-gpu, namespace: $ns}
spec:
  replicas: 2
  selector: {matchLabels: {app: smoke-gpu}}
  template:
    metadata: {labels: {app: smoke-gpu}}
    spec:
      nodeSelector: {nvidia.com/gpu.present: "true"}
      containers: [{name: c, image: busybox, resources: {limits: {nvidia.com/gpu: "1"}}}]
---
apiVersion: apps/v1
kind: DaemonSet
metadata: {name: smoke-cpu, namespace: $ns}
spec:
  selector: {matchLabels: {app: smoke-cpu}}
  template:
    metadata: {labels: {app: smoke-cpu}}
    spec:
      nodeSelector: {node-role.kubernetes.io/cpu: ""}
      containers: [{name: c, image: busybox}]
---
apiVersion: v1
kind: PersistentVolume
metadata: {name: dualsched-smoke-pv}
spec:
  capacity: {storage: 1Gi}
  accessModes: [ReadWriteMany]
  storageClassName: smoke
  nfs: {server: nfs.invalid, path: /exports/smoke}
---
apiVersion: v1
kind: PersistentVolumeClaim
metadata: {name: smoke-pvc, namespace: $ns}
spec:
  accessModes: [ReadWriteMany]
  storageClassName: smoke
  resources: {requests: {storage: 1Gi}}
EOF
  if ! kc -n "$ns" rollout status deploy/smoke-gpu --timeout=90s >/dev/null ||
     ! kc -n "$ns" rollout status ds/smoke-cpu --timeout=90s >/dev/null; then
    log "FAIL: workloads not ready"; ok=0
  fi
  local pod node gpus
  while read -r pod node; do
    gpus=$(kc get node "$node" -o jsonpath='{.status.capacity.nvidia\.com/gpu}')
    log "pod $pod Running on $node (nvidia.com/gpu=${gpus:-0})"
    case "$pod" in smoke-gpu*) [ -n "$gpus" ] || ok=0 ;; smoke-cpu*) [ -z "$gpus" ] || ok=0 ;; esac
  done < <(kc -n "$ns" get pods --field-selector=status.phase=Running \
             -o jsonpath='{range .items[*]}{.metadata.name} {.spec.nodeName}{"\n"}{end}')
  SMOKE_NS=$ns wait_for 60 "PVC Bound" pvc_bound
  log "PVC smoke-pvc Bound to PV $(kc -n "$ns" get pvc smoke-pvc -o jsonpath='{.spec.volumeName}')"
  if kc -n "$rns" run priv --image=busybox --restart=Never \
      --overrides='{"spec":{"containers":[{"name":"priv","image":"busybox","securityContext":{"privileged":true}}]}}' \
      >/dev/null 2>"$DIR/smoke-psa.err"; then
    log "FAIL: privileged pod was admitted in $rns"; ok=0
  elif grep -q 'violates PodSecurity' "$DIR/smoke-psa.err"; then
    log "privileged pod rejected: $(grep -o 'violates PodSecurity "[^"]*"' "$DIR/smoke-psa.err" | head -1)"
  else
    log "FAIL: privileged pod failed for another reason: $(cat "$DIR/smoke-psa.err")"; ok=0
  fi
  kc delete ns "$ns" "$rns" --wait=false >/dev/null; kc delete pv dualsched-smoke-pv --wait=false >/dev/null
  if [ $ok = 1 ]; then log "smoke: OK"; else log "smoke: FAILED"; return 1; fi
}

pvc_bound() { [ "$(kc -n "$SMOKE_NS" get pvc smoke-pvc -o jsonpath='{.status.phase}' 2>/dev/null)" = Bound ]; }

case "${1:-}" in
  up) shift; cmd_up "$@" ;;
  down) cmd_down ;;
  status) cmd_status ;;
  env) echo "export KUBECONFIG=$KUBECONFIG_FILE" ;;
  smoke) cmd_smoke ;;
  pvs) api_healthy || die "cluster not running"; ensure_local_pvs ;;
  *) echo "usage: $0 up [NODES_FILE] | down | status | env | smoke | pvs" >&2; exit 2 ;;
esac
