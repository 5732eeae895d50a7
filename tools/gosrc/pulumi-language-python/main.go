// Minimal Pulumi Python language host (pulumi-language-python).
//
// The upstream host lives in its own Go module
// (github.com/pulumi/pulumi/sdk/python/cmd/pulumi-language-python/v3) which the module proxy
// available to dualsched does not serve, so this small re-implementation is built instead,
// against github.com/pulumi/pulumi/sdk/v3 (python/toolchain does the venv/pip work).
// It runs programs through the upstream `pulumi-language-python-exec` script (shipped in the
// sdk/v3 module and installed next to this binary) exactly like the upstream host does, and
// implements: Handshake, GetRequiredPlugins/Packages, Run, RunPlugin, GetPluginInfo,
// InstallDependencies, About, GetProgramDependencies, RuntimeOptionsPrompts, Template.
// Code generation (GenerateProgram/Project/Package) and Pack are not implemented.
//
// RunPlugin matters for policy packs: since Pulumi v3.1xx the engine runs a Python policy pack
// through the language host's RunPlugin (kind "analyzer") whenever a python language host is
// installed, and the old `pulumi-analyzer-policy-python` script is no longer in sdk/v3 (its last
// copy under python/dist/ is in v3.215.0). RunPlugin does what that script did:
// `python -u -m pulumi.policy <engine address> <pack dir>` in the pack directory.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"

	"github.com/pulumi/pulumi/sdk/v3/go/common/util/rpcutil"
	pulumirpc "github.com/pulumi/pulumi/sdk/v3/proto/go"
	"github.com/pulumi/pulumi/sdk/v3/python/toolchain"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/types/known/emptypb"
	"google.golang.org/protobuf/types/known/structpb"
)

var version = "3.0.0-dev"

// exit code used by pulumi-language-python-exec after it already reported the error to the engine
const exitAfterUserActionableMessage = 32

type host struct {
	pulumirpc.UnimplementedLanguageRuntimeServer

	mu            sync.Mutex
	engineAddress string
	tracing       string
	execPath      string
}

func main() {
	tracing := flag.String("tracing", "", "Emit tracing to a Zipkin-compatible tracing endpoint")
	// accepted for compatibility with the upstream host; options normally come in ProgramInfo
	_ = flag.String("virtualenv", "", "Virtual environment path (deprecated, use runtime options)")
	_ = flag.String("root", "", "Project root path")
	_ = flag.String("typechecker", "", "Type checker (ignored)")
	_ = flag.String("toolchain", "", "Package manager (pip|uv|poetry)")
	// (-v, -logtostderr, ... are registered by glog via the sdk imports)
	if flag.Lookup("logflow") == nil {
		_ = flag.Bool("logflow", false, "ignored")
	}
	flag.Parse()

	h := &host{tracing: *tracing}
	if args := flag.Args(); len(args) > 0 {
		h.engineAddress = args[0]
	}
	self, err := os.Executable()
	if err == nil {
		if p, err := filepath.EvalSymlinks(self); err == nil {
			self = p
		}
		candidate := filepath.Join(filepath.Dir(self), "pulumi-language-python-exec")
		if _, err := os.Stat(candidate); err == nil {
			h.execPath = candidate
		}
	}
	if h.execPath == "" {
		if p, err := exec.LookPath("pulumi-language-python-exec"); err == nil {
			h.execPath = p
		}
	}
	if h.execPath == "" {
		fmt.Fprintln(os.Stderr, "pulumi-language-python: missing executor pulumi-language-python-exec (expected next to this binary)")
		os.Exit(1)
	}

	cancel := make(chan bool)
	handle, err := rpcutil.ServeWithOptions(rpcutil.ServeOptions{
		Cancel: cancel,
		Init: func(srv *grpc.Server) error {
			pulumirpc.RegisterLanguageRuntimeServer(srv, h)
			return nil
		},
	})
	if err != nil {
		fmt.Fprintf(os.Stderr, "could not start language host RPC server: %v\n", err)
		os.Exit(1)
	}
	fmt.Printf("%d\n", handle.Port)
	if err := <-handle.Done; err != nil {
		fmt.Fprintf(os.Stderr, "language host RPC stopped serving: %v\n", err)
		os.Exit(1)
	}
}

func optString(opts map[string]interface{}, key string) string {
	if v, ok := opts[key].(string); ok {
		return v
	}
	return ""
}

// resolveToolchain maps the project's runtime options (virtualenv, toolchain) to a python toolchain.
func resolveToolchain(info *pulumirpc.ProgramInfo) (toolchain.Toolchain, error) {
	opts := map[string]interface{}{}
	if info != nil && info.GetOptions() != nil {
		opts = info.GetOptions().AsMap()
	}
	root := info.GetRootDirectory()
	programDir := info.GetProgramDirectory()
	if root == "" {
		root = programDir
	}
	if root == "" {
		root, _ = os.Getwd()
	}
	if programDir == "" {
		programDir = root
	}
	po := toolchain.PythonOptions{Root: root, ProgramDir: programDir, Toolchain: toolchain.Pip}
	venv := optString(opts, "virtualenv")
	if venv != "" {
		if !filepath.IsAbs(venv) {
			venv = filepath.Join(root, venv)
		}
		po.Virtualenv = venv
	}
	switch strings.ToLower(optString(opts, "toolchain")) {
	case "uv":
		po.Toolchain = toolchain.Uv
	case "poetry":
		po.Toolchain = toolchain.Poetry
	}
	return toolchain.ResolveToolchain(po)
}

func (h *host) Handshake(ctx context.Context, req *pulumirpc.LanguageHandshakeRequest) (*pulumirpc.LanguageHandshakeResponse, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if req.GetEngineAddress() != "" {
		h.engineAddress = req.GetEngineAddress()
	}
	return &pulumirpc.LanguageHandshakeResponse{}, nil
}

func (h *host) GetPluginInfo(ctx context.Context, _ *emptypb.Empty) (*pulumirpc.PluginInfo, error) {
	return &pulumirpc.PluginInfo{Version: version}, nil
}

type pluginJSON struct {
	Resource bool   `json:"resource"`
	Name     string `json:"name"`
	Version  string `json:"version"`
	Server   string `json:"server"`
	Package  string `json:"package"`
	DistVer  string `json:"dist_version"`
}

// Lists the pulumi-plugin.json files of the installed Python packages (what the upstream host does too).
const listPluginsPy = `
import json, importlib.metadata as md
out = []
for d in md.distributions():
    try:
        files = d.files or []
    except Exception:
        files = []
    for f in files:
        if f.name != "pulumi-plugin.json":
            continue
        try:
            j = json.load(open(d.locate_file(f)))
        except Exception:
            continue
        j["package"] = d.metadata["Name"]
        j["dist_version"] = d.version
        out.append(j)
print(json.dumps(out))
`

func (h *host) requiredPackages(ctx context.Context, info *pulumirpc.ProgramInfo) ([]*pulumirpc.PackageDependency, error) {
	tc, err := resolveToolchain(info)
	if err != nil {
		return nil, err
	}
	cmd, err := tc.Command(ctx, "-c", listPluginsPy)
	if err != nil {
		return nil, err
	}
	cmd.Stderr = os.Stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("listing installed python packages: %w", err)
	}
	var plugins []pluginJSON
	if err := json.Unmarshal(out, &plugins); err != nil {
		return nil, fmt.Errorf("parsing installed python packages: %w", err)
	}
	var deps []*pulumirpc.PackageDependency
	seen := map[string]bool{}
	for _, p := range plugins {
		if !p.Resource {
			continue
		}
		name := p.Name
		if name == "" {
			name = strings.TrimPrefix(strings.ReplaceAll(strings.ToLower(p.Package), "_", "-"), "pulumi-")
		}
		ver := p.Version
		if ver == "" {
			ver = p.DistVer
		}
		if ver != "" && !strings.HasPrefix(ver, "v") {
			ver = "v" + ver
		}
		if seen[name+ver] {
			continue
		}
		seen[name+ver] = true
		deps = append(deps, &pulumirpc.PackageDependency{Kind: "resource", Name: name, Version: ver, Server: p.Server})
	}
	return deps, nil
}

func (h *host) GetRequiredPackages(ctx context.Context, req *pulumirpc.GetRequiredPackagesRequest) (*pulumirpc.GetRequiredPackagesResponse, error) {
	deps, err := h.requiredPackages(ctx, req.GetInfo())
	if err != nil {
		return nil, err
	}
	return &pulumirpc.GetRequiredPackagesResponse{Packages: deps}, nil
}

func (h *host) GetRequiredPlugins(ctx context.Context, req *pulumirpc.GetRequiredPluginsRequest) (*pulumirpc.GetRequiredPluginsResponse, error) {
	deps, err := h.requiredPackages(ctx, req.GetInfo())
	if err != nil {
		return nil, err
	}
	resp := &pulumirpc.GetRequiredPluginsResponse{}
	for _, d := range deps {
		resp.Plugins = append(resp.Plugins, &pulumirpc.PluginDependency{Name: d.Name, Kind: d.Kind, Version: d.Version, Server: d.Server})
	}
	return resp, nil
}

func (h *host) Run(ctx context.Context, req *pulumirpc.RunRequest) (*pulumirpc.RunResponse, error) {
	info := req.GetInfo()
	tc, err := resolveToolchain(info)
	if err != nil {
		return nil, err
	}
	h.mu.Lock()
	engine := h.engineAddress
	h.mu.Unlock()

	args := []string{"-u", h.execPath}
	add := func(k, v string) {
		if v != "" {
			args = append(args, "--"+k, v)
		}
	}
	add("monitor", req.GetMonitorAddress())
	add("engine", engine)
	add("project", req.GetProject())
	add("root_directory", info.GetRootDirectory())
	add("stack", req.GetStack())
	add("pwd", req.GetPwd())
	add("dry_run", fmt.Sprintf("%v", req.GetDryRun()))
	add("parallel", fmt.Sprint(req.GetParallel()))
	add("tracing", h.tracing)
	add("organization", req.GetOrganization())
	program := info.GetEntryPoint()
	if program == "" {
		program = "."
	}
	if !filepath.IsAbs(program) && info.GetProgramDirectory() != "" {
		program = filepath.Join(info.GetProgramDirectory(), program)
	}
	args = append(args, program)
	args = append(args, req.GetArgs()...)

	cmd, err := tc.Command(ctx, args...)
	if err != nil {
		return &pulumirpc.RunResponse{Error: err.Error()}, nil
	}
	env := cmd.Env
	if env == nil {
		env = os.Environ()
	}
	if cfg := req.GetConfig(); cfg != nil {
		b, err := json.Marshal(cfg)
		if err != nil {
			return nil, err
		}
		env = append(env, "PULUMI_CONFIG="+string(b))
	}
	secretKeys := req.GetConfigSecretKeys()
	if secretKeys == nil {
		secretKeys = []string{}
	}
	b, _ := json.Marshal(secretKeys)
	env = append(env, "PULUMI_CONFIG_SECRET_KEYS="+string(b))
	cmd.Env = env
	if req.GetPwd() != "" {
		cmd.Dir = req.GetPwd()
	}
	cmd.Stdout = os.Stdout
	cmd.Stderr = os.Stderr

	if err := cmd.Run(); err != nil {
		var exitErr *exec.ExitError
		if errors.As(err, &exitErr) {
			if exitErr.ExitCode() == exitAfterUserActionableMessage {
				return &pulumirpc.RunResponse{Bail: true}, nil
			}
			return &pulumirpc.RunResponse{Error: fmt.Sprintf("Program exited with non-zero exit code: %d", exitErr.ExitCode())}, nil
		}
		return &pulumirpc.RunResponse{Error: fmt.Sprintf("problem executing program (could not run language executor): %v", err)}, nil
	}
	return &pulumirpc.RunResponse{}, nil
}

// pluginStream sends a plugin's stdout/stderr to the engine (one Send at a time: gRPC streams
// are not safe for concurrent sends, and exec copies stdout and stderr in two goroutines).
type pluginStream struct {
	mu  sync.Mutex
	srv grpc.ServerStreamingServer[pulumirpc.RunPluginResponse]
}

func (s *pluginStream) send(r *pulumirpc.RunPluginResponse) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.srv.Send(r)
}

type pluginWriter struct {
	s      *pluginStream
	stderr bool
}

func (w pluginWriter) Write(p []byte) (int, error) {
	b := append([]byte(nil), p...)
	r := &pulumirpc.RunPluginResponse{Output: &pulumirpc.RunPluginResponse_Stdout{Stdout: b}}
	if w.stderr {
		r.Output = &pulumirpc.RunPluginResponse_Stderr{Stderr: b}
	}
	if err := w.s.send(r); err != nil {
		return 0, err
	}
	return len(p), nil
}

// RunPlugin runs a plugin written in Python: a policy pack (kind "analyzer") as
// `python -u -m pulumi.policy <args...> <pack dir>`, anything else as `python -u <dir> <args...>`,
// with the python of the plugin's runtime options (virtualenv) or python3 from PATH.
func (h *host) RunPlugin(req *pulumirpc.RunPluginRequest, srv grpc.ServerStreamingServer[pulumirpc.RunPluginResponse]) error {
	info := req.GetInfo()
	if info == nil {
		info = &pulumirpc.ProgramInfo{RootDirectory: req.GetPwd(), ProgramDirectory: req.GetPwd(), EntryPoint: req.GetProgram()}
	}
	dir := info.GetProgramDirectory()
	if dir == "" {
		dir = req.GetPwd()
	}
	tc, err := resolveToolchain(info)
	if err != nil {
		return err
	}
	var args []string
	if req.GetKind() == "analyzer" {
		args = append([]string{"-u", "-m", "pulumi.policy"}, req.GetArgs()...)
		args = append(args, dir)
	} else {
		program := dir
		if ep := info.GetEntryPoint(); ep != "" && ep != "." {
			program = filepath.Join(dir, ep)
		}
		args = append([]string{"-u", program}, req.GetArgs()...)
	}
	cmd, err := tc.Command(srv.Context(), args...)
	if err != nil {
		return err
	}
	env := cmd.Env
	if env == nil {
		env = os.Environ()
	}
	cmd.Env = append(env, req.GetEnv()...)
	cmd.Dir = dir
	stream := &pluginStream{srv: srv}
	cmd.Stdout = pluginWriter{s: stream}
	cmd.Stderr = pluginWriter{s: stream, stderr: true}
	code := int32(0)
	if err := cmd.Run(); err != nil {
		var exitErr *exec.ExitError
		if !errors.As(err, &exitErr) {
			return fmt.Errorf("running python plugin in %s: %w", dir, err)
		}
		code = int32(exitErr.ExitCode())
	}
	return stream.send(&pulumirpc.RunPluginResponse{Output: &pulumirpc.RunPluginResponse_Exitcode{Exitcode: code}})
}

type streamWriter struct {
	send   func(*pulumirpc.InstallDependenciesResponse) error
	stderr bool
}

func (w streamWriter) Write(p []byte) (int, error) {
	b := append([]byte(nil), p...)
	r := &pulumirpc.InstallDependenciesResponse{}
	if w.stderr {
		r.Stderr = b
	} else {
		r.Stdout = b
	}
	if err := w.send(r); err != nil {
		return 0, err
	}
	return len(p), nil
}

func (h *host) InstallDependencies(req *pulumirpc.InstallDependenciesRequest, srv grpc.ServerStreamingServer[pulumirpc.InstallDependenciesResponse]) error {
	info := req.GetInfo()
	if info == nil {
		info = &pulumirpc.ProgramInfo{RootDirectory: req.GetDirectory(), ProgramDirectory: req.GetDirectory()}
	}
	tc, err := resolveToolchain(info)
	if err != nil {
		return err
	}
	var out, errw io.Writer = streamWriter{send: srv.Send}, streamWriter{send: srv.Send, stderr: true}
	dir := info.GetRootDirectory()
	if dir == "" {
		dir = req.GetDirectory()
	}
	return tc.InstallDependencies(srv.Context(), dir, req.GetUseLanguageVersionTools(), true, out, errw)
}

func (h *host) About(ctx context.Context, req *pulumirpc.AboutRequest) (*pulumirpc.AboutResponse, error) {
	tc, err := resolveToolchain(req.GetInfo())
	if err != nil {
		return nil, err
	}
	about, err := tc.About(ctx)
	if err != nil {
		return nil, err
	}
	return &pulumirpc.AboutResponse{Executable: about.PythonExecutable, Version: about.PythonVersion.String()}, nil
}

func (h *host) GetProgramDependencies(ctx context.Context, req *pulumirpc.GetProgramDependenciesRequest) (*pulumirpc.GetProgramDependenciesResponse, error) {
	tc, err := resolveToolchain(req.GetInfo())
	if err != nil {
		return nil, err
	}
	pkgs, err := tc.ListPackages(ctx, req.GetTransitiveDependencies())
	if err != nil {
		return nil, err
	}
	resp := &pulumirpc.GetProgramDependenciesResponse{}
	for _, p := range pkgs {
		resp.Dependencies = append(resp.Dependencies, &pulumirpc.DependencyInfo{Name: p.Name, Version: p.Version})
	}
	return resp, nil
}

func (h *host) RuntimeOptionsPrompts(ctx context.Context, req *pulumirpc.RuntimeOptionsRequest) (*pulumirpc.RuntimeOptionsResponse, error) {
	return &pulumirpc.RuntimeOptionsResponse{}, nil
}

func (h *host) Template(ctx context.Context, req *pulumirpc.TemplateRequest) (*pulumirpc.TemplateResponse, error) {
	return &pulumirpc.TemplateResponse{}, nil
}

var _ = structpb.NewStruct
