package main

import (
	"bytes"
	"context"
	"errors"
	"io/fs"
	"log"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

// syncBuffer collects the plugin's log (written from several goroutines).
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// fakeKubelet is a Registration server that does what the kubelet's does before answering:
// dial the plugin's endpoint (relative to its directory) and call GetDevicePluginOptions.
type fakeKubelet struct {
	pluginapi.UnimplementedRegistrationServer
	dir  string
	reqs chan *pluginapi.RegisterRequest
	opts chan *pluginapi.DevicePluginOptions
}

func (f *fakeKubelet) Register(ctx context.Context, r *pluginapi.RegisterRequest) (*pluginapi.Empty, error) {
	conn, err := grpc.NewClient("unix://"+filepath.Join(f.dir, r.GetEndpoint()),
		grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	opts, err := pluginapi.NewDevicePluginClient(conn).GetDevicePluginOptions(ctx, &pluginapi.Empty{})
	if err != nil {
		return nil, err
	}
	f.reqs <- r
	f.opts <- opts
	return &pluginapi.Empty{}, nil
}

func startFakeKubelet(t *testing.T, dir string) *fakeKubelet {
	t.Helper()
	ln, err := net.Listen("unix", filepath.Join(dir, "kubelet.sock"))
	if err != nil {
		t.Fatal(err)
	}
	f := &fakeKubelet{dir: dir, reqs: make(chan *pluginapi.RegisterRequest, 10), opts: make(chan *pluginapi.DevicePluginOptions, 10)}
	srv := grpc.NewServer()
	pluginapi.RegisterRegistrationServer(srv, f)
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(srv.Stop)
	return f
}

func (f *fakeKubelet) waitRegister(t *testing.T, within time.Duration) *pluginapi.RegisterRequest {
	t.Helper()
	select {
	case r := <-f.reqs:
		if o := <-f.opts; !o.GetGetPreferredAllocationAvailable() {
			t.Errorf("GetDevicePluginOptions: GetPreferredAllocationAvailable = false")
		}
		return r
	case <-time.After(within):
		t.Fatalf("no RegisterRequest within %s", within)
		return nil
	}
}

func requireRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("mknod of char devices needs root (CAP_MKNOD)")
	}
}

func checkDeviceNode(t *testing.T, path string, minor int) {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Lstat(path, &st); err != nil {
		t.Fatalf("device node %s: %v", path, err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFCHR {
		t.Errorf("%s: not a char device (mode %o)", path, st.Mode)
	}
	if maj, min := unix.Major(uint64(st.Rdev)), unix.Minor(uint64(st.Rdev)); maj != devMajor || min != uint32(minor) {
		t.Errorf("%s: device %d:%d, want %d:%d", path, maj, min, devMajor, minor)
	}
	if perm := st.Mode & 0o777; perm != 0o666 {
		t.Errorf("%s: mode %o, want 666", path, perm)
	}
}

func TestIndex(t *testing.T) {
	p := newPlugin(config{count: 4, deviceDir: "/d", kubeletDir: "/k"}, log.New(&syncBuffer{}, "", 0))
	for id, want := range map[string]int{"gpu0": 0, "gpu3": 3} {
		if k, err := p.index(id); err != nil || k != want {
			t.Errorf("index(%q) = %d, %v; want %d", id, k, err, want)
		}
	}
	for _, id := range []string{"gpu4", "gpu01", "gpu-1", "gpu+1", "nvidia0", "gpu", "", "GPU0"} {
		if _, err := p.index(id); err == nil {
			t.Errorf("index(%q): no error", id)
		}
	}
}

func TestDeviceNodes(t *testing.T) {
	requireRoot(t)
	dir := filepath.Join(t.TempDir(), "dev")
	p := newPlugin(config{count: 3, deviceDir: dir, kubeletDir: t.TempDir()}, log.New(&syncBuffer{}, "", 0))
	if n, err := p.ensureDeviceNodes(); err != nil || n != 3 {
		t.Fatalf("first ensureDeviceNodes = %d, %v; want 3 created", n, err)
	}
	for k := 0; k < 3; k++ { // the host's GPU files, named as NVIDIA's driver names them
		checkDeviceNode(t, filepath.Join(dir, "nvidia"+strconv.Itoa(k)), k)
	}
	before, _ := os.Stat(filepath.Join(dir, "nvidia0"))
	// a regular file in the way is replaced; existing char devices 195:K are kept as they are
	// (a wrong mode is corrected)
	if err := os.Remove(filepath.Join(dir, "nvidia1")); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "nvidia1"), []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(filepath.Join(dir, "nvidia2"), 0o600); err != nil {
		t.Fatal(err)
	}
	if n, err := p.ensureDeviceNodes(); err != nil || n != 1 {
		t.Fatalf("second ensureDeviceNodes = %d, %v; want 1 created", n, err)
	}
	after, _ := os.Stat(filepath.Join(dir, "nvidia0"))
	if !os.SameFile(before, after) {
		t.Errorf("existing nvidia0 was recreated")
	}
	for k := 0; k < 3; k++ {
		checkDeviceNode(t, filepath.Join(dir, "nvidia"+strconv.Itoa(k)), k)
	}
	// no file of another name: the host has exactly the GPUs' device files
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	if want := []string{"nvidia0", "nvidia1", "nvidia2"}; !slices.Equal(names, want) {
		t.Errorf("device dir holds %v, want %v", names, want)
	}

	// a device with other numbers is someone else's (a real GPU's, /dev/null...): never replaced
	if err := os.Remove(filepath.Join(dir, "nvidia1")); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mknod(filepath.Join(dir, "nvidia1"), unix.S_IFCHR|0o666, int(unix.Mkdev(1, 3))); err != nil {
		t.Fatal(err)
	}
	if _, err := p.ensureDeviceNodes(); err == nil || !strings.Contains(err.Error(), "refusing") {
		t.Errorf("ensureDeviceNodes over char 1:3: err = %v, want a refusal", err)
	}
	var st unix.Stat_t
	if err := unix.Lstat(filepath.Join(dir, "nvidia1"), &st); err != nil || st.Rdev != unix.Mkdev(1, 3) {
		t.Errorf("the foreign device was touched: %v, rdev %x", err, st.Rdev)
	}
}

func TestOpeningADeviceWithoutDriverGivesENXIO(t *testing.T) {
	// ENXIO means the device cgroup admitted the open and no driver answers 195:K: the real-node
	// tests tell "may open this GPU" (ENXIO) from "refused by the device cgroup" (EPERM) by it
	requireRoot(t)
	dir := t.TempDir()
	p := newPlugin(config{count: 1, deviceDir: dir, kubeletDir: t.TempDir()}, log.New(&syncBuffer{}, "", 0))
	if _, err := p.ensureDeviceNodes(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat("/proc/driver/nvidia"); err == nil {
		t.Skip("an NVIDIA driver is loaded here: 195:0 has a driver")
	}
	f, err := os.OpenFile(filepath.Join(dir, "nvidia0"), os.O_RDWR, 0)
	if err == nil {
		f.Close()
		t.Fatal("opening 195:0 succeeded: some driver serves it")
	}
	if !errors.Is(err, unix.ENXIO) {
		t.Errorf("open 195:0: %v, want ENXIO", err)
	}
}

func TestPluginWithFakeKubelet(t *testing.T) {
	requireRoot(t)
	const count = 4
	kdir, ddir := t.TempDir(), filepath.Join(t.TempDir(), "dev")
	logs := &syncBuffer{}
	t.Cleanup(func() { t.Logf("plugin log:\n%s", logs) })
	p := newPlugin(config{count: count, deviceDir: ddir, kubeletDir: kdir}, log.New(logs, "", log.Lmicroseconds))

	// a stale socket file from an earlier run must not stop the plugin
	if err := os.WriteFile(p.socketPath, nil, 0o600); err != nil {
		t.Fatal(err)
	}

	// the plugin starts before the kubelet (Register is retried)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	runErr := make(chan error, 1)
	go func() { runErr <- p.Run(ctx) }()
	time.Sleep(1500 * time.Millisecond)
	kubelet := startFakeKubelet(t, kdir)

	r := kubelet.waitRegister(t, 5*time.Second)
	if r.GetResourceName() != "nvidia.com/gpu" || r.GetVersion() != "v1beta1" || r.GetEndpoint() != "dualsched-gpu-double.sock" {
		t.Errorf("RegisterRequest = %v", r)
	}
	if !r.GetOptions().GetGetPreferredAllocationAvailable() {
		t.Errorf("RegisterRequest.Options.GetPreferredAllocationAvailable = false")
	}
	for k := 0; k < count; k++ {
		checkDeviceNode(t, filepath.Join(ddir, "nvidia"+strconv.Itoa(k)), k)
	}

	conn, err := grpc.NewClient("unix://"+p.socketPath, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	client := pluginapi.NewDevicePluginClient(conn)

	// ListAndWatch: all devices healthy once, then the stream stays open
	lwCtx, lwCancel := context.WithCancel(ctx)
	defer lwCancel()
	stream, err := client.ListAndWatch(lwCtx, &pluginapi.Empty{})
	if err != nil {
		t.Fatal(err)
	}
	lw, err := stream.Recv()
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, d := range lw.GetDevices() {
		if d.GetHealth() != pluginapi.Healthy {
			t.Errorf("device %s: health %q", d.GetID(), d.GetHealth())
		}
		ids = append(ids, d.GetID())
	}
	if want := []string{"gpu0", "gpu1", "gpu2", "gpu3"}; !slices.Equal(ids, want) {
		t.Errorf("ListAndWatch devices = %v, want %v", ids, want)
	}
	streamEnd := make(chan error, 1)
	go func() { _, err := stream.Recv(); streamEnd <- err }()
	select {
	case err := <-streamEnd:
		t.Fatalf("ListAndWatch stream ended early: %v", err)
	case <-time.After(300 * time.Millisecond):
	}

	// Allocate: two containers, disjoint sets, IDs not in order
	ar, err := client.Allocate(ctx, &pluginapi.AllocateRequest{ContainerRequests: []*pluginapi.ContainerAllocateRequest{
		{DevicesIds: []string{"gpu2", "gpu0"}},
		{DevicesIds: []string{"gpu3"}},
	}})
	if err != nil {
		t.Fatal(err)
	}
	if n := len(ar.GetContainerResponses()); n != 2 {
		t.Fatalf("Allocate: %d container responses, want 2", n)
	}
	for i, want := range [][]int{{0, 2}, {3}} {
		cr := ar.GetContainerResponses()[i]
		var got, wantSpecs []string
		for _, d := range cr.GetDevices() {
			got = append(got, d.GetHostPath()+" "+d.GetContainerPath()+" "+d.GetPermissions())
		}
		var visible []string
		for j, k := range want {
			// the host's /dev/nvidiaK (as the real plugin's DeviceSpecs), renumbered in the container
			wantSpecs = append(wantSpecs, filepath.Join(ddir, "nvidia"+strconv.Itoa(k))+" /dev/nvidia"+strconv.Itoa(j)+" rw")
			visible = append(visible, strconv.Itoa(k))
		}
		if !slices.Equal(got, wantSpecs) {
			t.Errorf("container %d DeviceSpecs = %q, want %q", i, got, wantSpecs)
		}
		if v := cr.GetEnvs()["NVIDIA_VISIBLE_DEVICES"]; v != strings.Join(visible, ",") {
			t.Errorf("container %d NVIDIA_VISIBLE_DEVICES = %q, want %q", i, v, strings.Join(visible, ","))
		}
		if v := cr.GetEnvs()["DUALSCHED_GPU_DOUBLE"]; v != "1" {
			t.Errorf("container %d DUALSCHED_GPU_DOUBLE = %q", i, v)
		}
	}

	// Allocate: an unknown ID is an error
	if _, err := client.Allocate(ctx, &pluginapi.AllocateRequest{ContainerRequests: []*pluginapi.ContainerAllocateRequest{
		{DevicesIds: []string{"gpu1", "gpu7"}},
	}}); err == nil || !strings.Contains(err.Error(), "gpu7") {
		t.Errorf("Allocate(gpu7): err = %v, want an error naming gpu7", err)
	}

	// GetPreferredAllocation: lowest free IDs, must-include honoured
	pr, err := client.GetPreferredAllocation(ctx, &pluginapi.PreferredAllocationRequest{ContainerRequests: []*pluginapi.ContainerPreferredAllocationRequest{
		{AvailableDeviceIDs: []string{"gpu3", "gpu1", "gpu2"}, AllocationSize: 2},
		{AvailableDeviceIDs: []string{"gpu3", "gpu2", "gpu1", "gpu0"}, MustIncludeDeviceIDs: []string{"gpu3"}, AllocationSize: 2},
		{AvailableDeviceIDs: []string{"gpu3", "gpu2", "gpu1", "gpu0"}, AllocationSize: 1},
	}})
	if err != nil {
		t.Fatal(err)
	}
	for i, want := range [][]string{{"gpu1", "gpu2"}, {"gpu0", "gpu3"}, {"gpu0"}} {
		if got := pr.GetContainerResponses()[i].GetDeviceIDs(); !slices.Equal(got, want) {
			t.Errorf("GetPreferredAllocation[%d] = %v, want %v", i, got, want)
		}
	}

	if _, err := client.PreStartContainer(ctx, &pluginapi.PreStartContainerRequest{DevicesIds: []string{"gpu0"}}); err != nil {
		t.Errorf("PreStartContainer: %v", err)
	}

	// the kubelet restarting deletes every socket in its directory: the plugin re-registers
	if err := os.Remove(p.socketPath); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	r = kubelet.waitRegister(t, 5*time.Second)
	t.Logf("re-registered %s after the socket was removed", time.Since(start).Round(time.Millisecond))
	if r.GetResourceName() != "nvidia.com/gpu" || r.GetEndpoint() != "dualsched-gpu-double.sock" {
		t.Errorf("second RegisterRequest = %v", r)
	}
	select {
	case <-streamEnd: // the old server's ListAndWatch stream ends with it
	case <-time.After(3 * time.Second):
		t.Errorf("old ListAndWatch stream still open after the restart")
	}
	if _, err := client.Allocate(ctx, &pluginapi.AllocateRequest{ContainerRequests: []*pluginapi.ContainerAllocateRequest{
		{DevicesIds: []string{"gpu1"}},
	}}); err != nil {
		t.Errorf("Allocate on the restarted server: %v", err)
	}
	if !strings.Contains(logs.String(), "re-registering") {
		t.Errorf("no re-register line in the log")
	}

	// shutdown (what SIGTERM does): Run returns nil and removes its socket
	cancel()
	select {
	case err := <-runErr:
		if err != nil {
			t.Errorf("Run: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Run did not return after cancel")
	}
	if _, err := os.Lstat(p.socketPath); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("socket still there after shutdown: %v", err)
	}
	// the GPUs' device files stay, like a driver's (node.sh down removes them with the node)
	for k := 0; k < count; k++ {
		checkDeviceNode(t, filepath.Join(ddir, "nvidia"+strconv.Itoa(k)), k)
	}
	select {
	case r := <-kubelet.reqs:
		t.Errorf("unexpected extra RegisterRequest %v", r)
	default:
	}
}
