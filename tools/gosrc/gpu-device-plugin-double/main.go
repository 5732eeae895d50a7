// gpu-device-plugin-double: a DOUBLE of the NVIDIA device plugin, for the real-node test tier
// (a real kubelet on a machine without GPUs). It is not a device plugin for real hardware.
//
// What it proves, when a real kubelet and container runtime use it:
//   - the kubelet's device manager really registers, allocates and checkpoints the extended
//     resource nvidia.com/gpu through the official device plugin API (v1beta1, gRPC over the
//     unix sockets in /var/lib/kubelet/device-plugins), and re-registration after a kubelet
//     restart works;
//   - the node advertises nvidia.com/gpu capacity, so the scheduler really counts it (a pod
//     asking for more GPUs than are free stays Pending);
//   - the container runtime really injects distinct device files and environment per
//     container: container X that got fake GPUs 0 and 2 sees them as /dev/nvidia0 and
//     /dev/nvidia1 (devices 195:0 and 195:2, and no other /dev/nvidia*) with
//     NVIDIA_VISIBLE_DEVICES=0,2. Who got which GPU is visible from inside the container;
//   - like a real GPU node, the host has every GPU's device file /dev/nvidiaK (char 195:K, made
//     at start, kept when the plugin stops: tools/node.sh down removes them), and they are the host
//     side of the DeviceSpecs, as with the real plugin. So a privileged container sees all of them
//     (the runtime gives it the host's devices) and the device cgroup is what isolates the others:
//     isolation tests can fail here the way they would on real hardware.
//
// What it does NOT do or prove:
//   - there is no GPU: gpuK is the character device 195:K (NVIDIA's numbers) that no driver here
//     serves, so opening it fails (ENXIO); only its numbers and NVIDIA_VISIBLE_DEVICES identify it.
//     Unlike the real plugin, a container's GPUs are renumbered from /dev/nvidia0 (the real
//     toolkit keeps the host's numbers and NVML names them), so a gres.conf File= list fits all;
//   - no NVML, no CUDA, no driver or library mounts, no nvidia-container-toolkit / CDI, no
//     /dev/nvidiactl, /dev/nvidia-uvm or /proc/driver/nvidia;
//   - no health monitoring: the devices are advertised Healthy once and never change;
//   - no MIG, no time-slicing / MPS sharing, no topology (NUMA) hints, no GPU memory limits.
//
// Usage: gpu-device-plugin-double [--count N] [--device-dir DIR] [--kubelet-dir DIR]
// It creates DIR/nvidia0..nvidiaN-1 (device-dir, default /dev; a char device with other numbers in
// the way is an error, never replaced) and leaves them when it stops, serves the DevicePlugin service on
// KUBELET_DIR/dualsched-gpu-double.sock and registers with KUBELET_DIR/kubelet.sock. When the
// kubelet restarts it deletes every socket in its directory; the plugin notices that its own
// socket is gone (polled every second), restarts its gRPC server and registers again. SIGTERM
// or SIGINT stops it cleanly (its socket is removed). Events are logged to stderr, one line each.
package main

import (
	"context"
	"flag"
	"fmt"
	"log"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	cfg := config{}
	flag.IntVar(&cfg.count, "count", 4, "number of fake GPUs (device IDs gpu0..gpuN-1)")
	flag.StringVar(&cfg.deviceDir, "device-dir", "/dev",
		"directory for the fake GPUs' device nodes nvidia0..nvidiaN-1 (char 195:K, as NVIDIA's driver makes them)")
	flag.StringVar(&cfg.kubeletDir, "kubelet-dir", "/var/lib/kubelet/device-plugins",
		"the kubelet's device plugin directory (kubelet.sock, and where our socket is served)")
	flag.Parse()
	if flag.NArg() > 0 {
		fmt.Fprintf(os.Stderr, "unexpected arguments: %v\n", flag.Args())
		flag.Usage()
		os.Exit(2)
	}
	if cfg.count < 1 {
		fmt.Fprintln(os.Stderr, "--count must be at least 1")
		os.Exit(2)
	}

	logger := log.New(os.Stderr, "gpu-device-plugin-double: ", log.LstdFlags|log.Lmicroseconds)
	p := newPlugin(cfg, logger)

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	if err := p.Run(ctx); err != nil {
		logger.Printf("fatal: %v", err)
		os.Exit(1)
	}
	logger.Printf("stopped")
}
