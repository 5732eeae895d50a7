package main

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

const (
	resourceName = "nvidia.com/gpu"
	socketName   = "dualsched-gpu-double.sock"
	// NVIDIA's character major: /dev/nvidiaK is 195:K. No driver here answers to it (opening fails
	// with ENXIO), but cgroup device rules and Slurm's gres File= tell the GPUs apart by number.
	devMajor = 195
)

// pollInterval is how often Run checks that its socket still exists and retries Register.
var pollInterval = time.Second

type config struct {
	count      int
	deviceDir  string // where nvidia0..nvidiaN-1 are created (host side of the DeviceSpecs): /dev on a node
	kubeletDir string // the kubelet's device-plugins directory
}

// plugin is the device plugin double. Its state is fixed at creation: the kubelet, not the
// plugin, keeps track of which device is allocated to which container.
type plugin struct {
	cfg         config
	log         *log.Logger
	socketPath  string // our DevicePlugin server
	kubeletSock string // the kubelet's Registration server
}

func newPlugin(cfg config, logger *log.Logger) *plugin {
	// The runtime needs absolute host paths in DeviceSpecs; grpc wants an absolute unix path.
	if abs, err := filepath.Abs(cfg.deviceDir); err == nil {
		cfg.deviceDir = abs
	}
	if abs, err := filepath.Abs(cfg.kubeletDir); err == nil {
		cfg.kubeletDir = abs
	}
	return &plugin{
		cfg:         cfg,
		log:         logger,
		socketPath:  filepath.Join(cfg.kubeletDir, socketName),
		kubeletSock: filepath.Join(cfg.kubeletDir, "kubelet.sock"),
	}
}

func deviceID(k int) string { return "gpu" + strconv.Itoa(k) }

// nodeName is GPU K's device file on the host, as NVIDIA's driver names it: nvidiaK (char 195:K).
func nodeName(k int) string { return "nvidia" + strconv.Itoa(k) }

func (p *plugin) hostPath(k int) string { return filepath.Join(p.cfg.deviceDir, nodeName(k)) }

// containerPath is the i-th GPU of a container's allocation: /dev/nvidia0..n-1 whichever GPUs it
// got, so one gres.conf (File=/dev/nvidia[0-n-1]) fits every slurmd pod; the device numbers and
// NVIDIA_VISIBLE_DEVICES still say which GPUs they are.
func containerPath(i int) string { return "/dev/nvidia" + strconv.Itoa(i) }

// index parses a device ID "gpuK" (canonical spelling only) into K.
func (p *plugin) index(id string) (int, error) {
	if s, ok := strings.CutPrefix(id, "gpu"); ok {
		if k, err := strconv.Atoi(s); err == nil && k >= 0 && k < p.cfg.count && deviceID(k) == id {
			return k, nil
		}
	}
	return 0, fmt.Errorf("unknown device id %q (this plugin has gpu0..gpu%d)", id, p.cfg.count-1)
}

// ensureDeviceNodes creates deviceDir/nvidia0..nvidiaN-1 as char devices 195:K, mode 0666, the
// host's GPU device files on a real GPU node, keeping the ones that already are 195:K. A file of
// another kind in the way (left by hand, a socket...) is replaced; a device with other numbers is
// someone else's and an error. It returns how many it created. The nodes are never removed by the
// plugin: like a driver's they outlive it (a container restarting while the plugin restarts still
// finds its GPUs); `tools/node.sh down` removes them with the node.
func (p *plugin) ensureDeviceNodes() (int, error) {
	if err := os.MkdirAll(p.cfg.deviceDir, 0o755); err != nil {
		return 0, err
	}
	created := 0
	for k := 0; k < p.cfg.count; k++ {
		path := p.hostPath(k)
		var st unix.Stat_t
		err := unix.Lstat(path, &st)
		kind := st.Mode & unix.S_IFMT
		switch {
		case err == nil && kind == unix.S_IFCHR && st.Rdev == unix.Mkdev(devMajor, uint32(k)):
			if st.Mode&0o777 != 0o666 {
				if err := os.Chmod(path, 0o666); err != nil {
					return created, err
				}
			}
			continue
		case err == nil && (kind == unix.S_IFCHR || kind == unix.S_IFBLK):
			return created, fmt.Errorf("%s is device %d:%d, not %d:%d: refusing to replace a device this plugin did not make",
				path, unix.Major(uint64(st.Rdev)), unix.Minor(uint64(st.Rdev)), devMajor, k)
		case err == nil: // something else is in the way (a file left by hand, a socket...)
			if err := os.Remove(path); err != nil {
				return created, fmt.Errorf("replace %s (not char device %d:%d): %w", path, devMajor, k, err)
			}
		case !errors.Is(err, fs.ErrNotExist):
			return created, err
		}
		if err := unix.Mknod(path, unix.S_IFCHR|0o666, int(unix.Mkdev(devMajor, uint32(k)))); err != nil {
			return created, fmt.Errorf("mknod %s c %d %d: %w", path, devMajor, k, err)
		}
		if err := os.Chmod(path, 0o666); err != nil { // mknod's mode is subject to the umask
			return created, err
		}
		created++
	}
	return created, nil
}

// Run creates the device nodes, serves the DevicePlugin service and keeps it registered with
// the kubelet until ctx is done. Every pollInterval it checks that its socket is still the one
// it created (the kubelet deletes all sockets in its directory when it starts); if not, it
// restarts the gRPC server and registers again. Register is retried until it succeeds.
func (p *plugin) Run(ctx context.Context) error {
	created, err := p.ensureDeviceNodes()
	if err != nil {
		return err
	}
	p.log.Printf("device nodes %s/nvidia0..nvidia%d ready (char %d:K, mode 0666; %d created, %d kept; they stay when the plugin stops)",
		p.cfg.deviceDir, p.cfg.count-1, devMajor, created, p.cfg.count-created)

	var (
		srv        *grpc.Server
		ident      os.FileInfo // our socket file, to tell it from a removed or replaced one
		registered bool
		lastErr    string
	)
	stopServer := func() {
		if srv != nil {
			srv.Stop() // also closes the listener and ends the ListAndWatch streams
			srv = nil
		}
	}
	defer func() {
		stopServer()
		if ident != nil && p.socketIsOurs(ident) {
			_ = os.Remove(p.socketPath)
		}
	}()

	ticker := time.NewTicker(pollInterval)
	defer ticker.Stop()
	for {
		if srv == nil || !p.socketIsOurs(ident) {
			if srv != nil {
				p.log.Printf("plugin socket %s is gone (kubelet restarted?): restarting gRPC server and re-registering", p.socketPath)
				stopServer()
			}
			if srv, ident, err = p.serve(); err != nil {
				return err
			}
			registered, lastErr = false, ""
		}
		if !registered {
			if err := p.register(ctx); err != nil {
				if ctx.Err() != nil {
					return nil
				}
				if msg := err.Error(); msg != lastErr { // one line per distinct failure, not per retry
					p.log.Printf("register with %s failed (retrying every %s): %v", p.kubeletSock, pollInterval, err)
					lastErr = msg
				}
			} else {
				registered = true
				p.log.Printf("registered %s (%d devices, endpoint %s, API %s) with the kubelet at %s",
					resourceName, p.cfg.count, socketName, pluginapi.Version, p.kubeletSock)
			}
		}
		select {
		case <-ctx.Done():
			return nil
		case <-ticker.C:
		}
	}
}

// serve removes a stale socket, listens on socketPath and serves the DevicePlugin service.
func (p *plugin) serve() (*grpc.Server, os.FileInfo, error) {
	if err := os.MkdirAll(p.cfg.kubeletDir, 0o750); err != nil {
		return nil, nil, err
	}
	if err := os.Remove(p.socketPath); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return nil, nil, fmt.Errorf("remove stale socket: %w", err)
	}
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: p.socketPath, Net: "unix"})
	if err != nil {
		return nil, nil, err
	}
	// Closing must not unlink the path: by then it may be someone else's file. Run removes
	// the socket itself, and only if it is still ours.
	ln.SetUnlinkOnClose(false)
	ident, err := os.Stat(p.socketPath)
	if err != nil {
		ln.Close()
		return nil, nil, err
	}
	srv := grpc.NewServer()
	pluginapi.RegisterDevicePluginServer(srv, &service{p: p})
	go func() {
		if err := srv.Serve(ln); err != nil {
			p.log.Printf("gRPC server on %s ended: %v", p.socketPath, err)
		}
	}()
	p.log.Printf("serving the DevicePlugin service on %s", p.socketPath)
	return srv, ident, nil
}

func (p *plugin) socketIsOurs(ident os.FileInfo) bool {
	if ident == nil {
		return false
	}
	fi, err := os.Stat(p.socketPath)
	return err == nil && os.SameFile(fi, ident)
}

// register calls Register on the kubelet. The kubelet dials our endpoint and calls
// GetDevicePluginOptions before answering, so the server must already be serving.
func (p *plugin) register(ctx context.Context) error {
	conn, err := grpc.NewClient("unix://"+p.kubeletSock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return err
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	_, err = pluginapi.NewRegistrationClient(conn).Register(ctx, &pluginapi.RegisterRequest{
		Version:      pluginapi.Version,
		Endpoint:     socketName, // relative to the kubelet's device-plugins directory
		ResourceName: resourceName,
		Options:      pluginOptions(),
	})
	return err
}

// pluginOptions is sent in RegisterRequest and answered by GetDevicePluginOptions. The kubelet
// (1.36) ignores the copy in RegisterRequest and uses what GetDevicePluginOptions returns.
func pluginOptions() *pluginapi.DevicePluginOptions {
	return &pluginapi.DevicePluginOptions{GetPreferredAllocationAvailable: true}
}

// service implements pluginapi.DevicePluginServer.
type service struct {
	pluginapi.UnimplementedDevicePluginServer
	p *plugin
}

func (s *service) GetDevicePluginOptions(context.Context, *pluginapi.Empty) (*pluginapi.DevicePluginOptions, error) {
	return pluginOptions(), nil
}

// ListAndWatch sends every device Healthy once, then holds the stream open until the server
// stops (restart or shutdown) or the kubelet goes away. There is no health monitoring.
func (s *service) ListAndWatch(_ *pluginapi.Empty, stream pluginapi.DevicePlugin_ListAndWatchServer) error {
	resp := &pluginapi.ListAndWatchResponse{}
	for k := 0; k < s.p.cfg.count; k++ {
		resp.Devices = append(resp.Devices, &pluginapi.Device{ID: deviceID(k), Health: pluginapi.Healthy})
	}
	if err := stream.Send(resp); err != nil {
		return err
	}
	s.p.log.Printf("ListAndWatch: advertised %d Healthy devices gpu0..gpu%d", s.p.cfg.count, s.p.cfg.count-1)
	<-stream.Context().Done()
	return nil
}

// indices parses device IDs into ascending, distinct indices; unknown IDs are an error.
func (s *service) indices(ids []string, allowDup bool) ([]int, error) {
	out := make([]int, 0, len(ids))
	for _, id := range ids {
		k, err := s.p.index(id)
		if err != nil {
			return nil, err
		}
		if slices.Contains(out, k) {
			if !allowDup {
				return nil, fmt.Errorf("device id %q requested twice", id)
			}
			continue
		}
		out = append(out, k)
	}
	slices.Sort(out)
	return out, nil
}

// Allocate maps each requested gpuK to the host's device node deviceDir/nvidiaK, seen in the container as
// /dev/nvidia0..n-1 in ascending K, and sets NVIDIA_VISIBLE_DEVICES to the K in ascending order.
func (s *service) Allocate(_ context.Context, req *pluginapi.AllocateRequest) (*pluginapi.AllocateResponse, error) {
	resp := &pluginapi.AllocateResponse{}
	for i, cr := range req.GetContainerRequests() {
		ks, err := s.indices(cr.GetDevicesIds(), false)
		if err != nil {
			s.p.log.Printf("Allocate: container request %d %v rejected: %v", i, cr.GetDevicesIds(), err)
			return nil, err
		}
		car := &pluginapi.ContainerAllocateResponse{}
		visible := make([]string, 0, len(ks))
		mapped := make([]string, 0, len(ks))
		for i, k := range ks {
			car.Devices = append(car.Devices, &pluginapi.DeviceSpec{
				HostPath:      s.p.hostPath(k),
				ContainerPath: containerPath(i),
				Permissions:   "rw",
			})
			visible = append(visible, strconv.Itoa(k))
			mapped = append(mapped, s.p.hostPath(k)+"->"+containerPath(i))
		}
		car.Envs = map[string]string{
			"NVIDIA_VISIBLE_DEVICES": strings.Join(visible, ","),
			"DUALSCHED_GPU_DOUBLE":   "1",
		}
		resp.ContainerResponses = append(resp.ContainerResponses, car)
		s.p.log.Printf("Allocate: container request %d: %s -> %s, NVIDIA_VISIBLE_DEVICES=%s",
			i, strings.Join(cr.GetDevicesIds(), ","), strings.Join(mapped, " "), car.Envs["NVIDIA_VISIBLE_DEVICES"])
	}
	return resp, nil
}

// GetPreferredAllocation prefers the must-include devices, then the lowest-numbered
// available ones, up to the allocation size.
func (s *service) GetPreferredAllocation(_ context.Context, req *pluginapi.PreferredAllocationRequest) (*pluginapi.PreferredAllocationResponse, error) {
	resp := &pluginapi.PreferredAllocationResponse{}
	for i, cr := range req.GetContainerRequests() {
		avail, err := s.indices(cr.GetAvailableDeviceIDs(), true)
		if err != nil {
			return nil, err
		}
		chosen, err := s.indices(cr.GetMustIncludeDeviceIDs(), true)
		if err != nil {
			return nil, err
		}
		for _, k := range avail {
			if len(chosen) >= int(cr.GetAllocationSize()) {
				break
			}
			if !slices.Contains(chosen, k) {
				chosen = append(chosen, k)
			}
		}
		slices.Sort(chosen)
		ids := make([]string, len(chosen))
		for j, k := range chosen {
			ids[j] = deviceID(k)
		}
		resp.ContainerResponses = append(resp.ContainerResponses, &pluginapi.ContainerPreferredAllocationResponse{DeviceIDs: ids})
		s.p.log.Printf("GetPreferredAllocation: container request %d: size %d from %v (must include %v) -> %v",
			i, cr.GetAllocationSize(), cr.GetAvailableDeviceIDs(), cr.GetMustIncludeDeviceIDs(), ids)
	}
	return resp, nil
}

func (s *service) PreStartContainer(context.Context, *pluginapi.PreStartContainerRequest) (*pluginapi.PreStartContainerResponse, error) {
	return &pluginapi.PreStartContainerResponse{}, nil
}
