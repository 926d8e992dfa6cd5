package binding

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/vhostmq/vhostmq/cni/kubevirt/hookapi/info"
	"github.com/vhostmq/vhostmq/cni/kubevirt/hookapi/v1alpha3"
	"github.com/vhostmq/vhostmq/cni/kubevirt/vmi"
)

// Defaults of the sidecar.
const (
	DefaultHookName    = "vhostmq-binding"
	DefaultPluginName  = "vhostmq"
	DefaultNetworkInfo = "/etc/podinfo/network-info"
	DefaultHooksDir    = "/var/run/kubevirt-hooks"
	// DefaultDeviceInfoWait is half of virt-launcher's one minute per call.
	DefaultDeviceInfoWait = 30 * time.Second
)

// Config is the sidecar's configuration.
type Config struct {
	// HookName is what Info reports and the socket's base name.
	HookName string
	// PluginName is the binding name VMI interfaces use
	// (spec.domain.devices.interfaces[].binding.name). KubeVirt (v1.7.0)
	// does not tell the sidecar the name it was registered under (it sets
	// only CONTAINER_NAME and passes no arguments), so it must match the
	// registration: DefaultPluginName unless the image says otherwise.
	PluginName string
	// NetworkInfo is KubeVirt's downward-API file.
	NetworkInfo string
	// DeviceInfoWait bounds how long OnDefineDomain waits for network-info
	// to carry the device-info of every vhostmq interface. On a migration
	// target KubeVirt writes the annotation behind the file only once the
	// pod is Ready, and the kubelet refreshes the file some seconds later,
	// while virt-launcher may already call the hook (its call has a minute).
	// 0 = DefaultDeviceInfoWait; negative = no wait.
	DeviceInfoWait time.Duration
	// Socket is the hook socket, DefaultHooksDir/<HookName>.sock.
	Socket string
	Logger *slog.Logger
}

// Server serves KubeVirt's hook API v1alpha3.
type Server struct {
	info.UnimplementedInfoServer
	v1alpha3.UnimplementedCallbacksServer
	cfg      Config
	log      *slog.Logger
	shutdown chan struct{}
	once     sync.Once
}

// NewServer fills in defaults.
func NewServer(cfg Config) *Server {
	if cfg.HookName == "" {
		cfg.HookName = DefaultHookName
	}
	if cfg.PluginName == "" {
		cfg.PluginName = DefaultPluginName
	}
	if cfg.NetworkInfo == "" {
		cfg.NetworkInfo = DefaultNetworkInfo
	}
	if cfg.Socket == "" {
		cfg.Socket = filepath.Join(DefaultHooksDir, cfg.HookName+".sock")
	}
	if cfg.DeviceInfoWait == 0 {
		cfg.DeviceInfoWait = DefaultDeviceInfoWait
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	return &Server{cfg: cfg, log: cfg.Logger, shutdown: make(chan struct{})}
}

// Info tells virt-launcher which hook points the sidecar serves.
func (s *Server) Info(context.Context, *info.InfoParams) (*info.InfoResult, error) {
	return &info.InfoResult{
		Name:     s.cfg.HookName,
		Versions: []string{"v1alpha3"},
		HookPoints: []*info.HookPoint{
			{Name: "OnDefineDomain", Priority: 0},
			{Name: "Shutdown", Priority: 0},
		},
	}, nil
}

// OnDefineDomain adds the vhost-user NICs. An error fails the VM's start
// with a message that says what is missing, rather than a VM without its
// network.
func (s *Server) OnDefineDomain(ctx context.Context, p *v1alpha3.OnDefineDomainParams) (*v1alpha3.OnDefineDomainResult, error) {
	v, err := vmi.Parse(p.GetVmi())
	if err != nil {
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}
	log := s.log.With("vmi", v.Metadata.Namespace+"/"+v.Metadata.Name)
	if len(v.BoundTo(s.cfg.PluginName)) == 0 {
		// KubeVirt started this sidecar for some binding; if none of the
		// VMI's is ours, the registration name differs from ours.
		var names []string
		for _, i := range v.Spec.Domain.Devices.Interfaces {
			if i.Binding != nil {
				names = append(names, i.Binding.Name)
			}
		}
		log.Warn("no interface uses this binding; is it registered under another name?", "binding", s.cfg.PluginName, "vmiBindings", names)
	}
	out, err := s.mutate(ctx, p.GetDomainXML(), v, log)
	if err != nil {
		log.Error("OnDefineDomain failed", "err", err)
		return nil, err
	}
	return &v1alpha3.OnDefineDomainResult{DomainXML: out}, nil
}

// mutate reads network-info and mutates the domain, reading the file again
// (every 250 ms, for at most DeviceInfoWait and never past ctx's deadline)
// while it is missing or lacks a vhostmq interface's device-info.
func (s *Server) mutate(ctx context.Context, domainXML []byte, v *vmi.VMI, log *slog.Logger) ([]byte, error) {
	deadline := time.Now().Add(s.cfg.DeviceInfoWait)
	if d, ok := ctx.Deadline(); ok && d.Add(-time.Second).Before(deadline) {
		deadline = d.Add(-time.Second)
	}
	start := time.Now()
	for n := 0; ; n++ {
		out, err := s.mutateOnce(domainXML, v, log)
		if status.Code(err) != codes.FailedPrecondition || !time.Now().Add(250*time.Millisecond).Before(deadline) {
			if err != nil && time.Since(start) > time.Second {
				err = status.Errorf(status.Code(err), "%s (after waiting %.0f s for it)", status.Convert(err).Message(), time.Since(start).Seconds())
			}
			return out, err
		}
		if n == 0 {
			log.Info("waiting for network-info to carry the device-info", "why", status.Convert(err).Message(), "for", time.Until(deadline).Round(time.Second))
		}
		select {
		case <-ctx.Done():
			return nil, status.FromContextError(ctx.Err()).Err()
		case <-time.After(250 * time.Millisecond):
		}
	}
}

// mutateOnce is one read of network-info and Mutate; what may still
// change (the file missing, a device-info not in it) is FailedPrecondition.
func (s *Server) mutateOnce(domainXML []byte, v *vmi.VMI, log *slog.Logger) ([]byte, error) {
	var ni *NetworkInfo
	if len(v.BoundTo(s.cfg.PluginName)) > 0 {
		b, err := os.ReadFile(s.cfg.NetworkInfo)
		if err != nil {
			return nil, status.Errorf(codes.FailedPrecondition, "reading network-info: %v (register the binding with downwardAPI: device-info)", err)
		}
		if ni, err = ParseNetworkInfo(b); err != nil {
			return nil, status.Error(codes.InvalidArgument, err.Error())
		}
	}
	out, err := Mutate(domainXML, v, ni, s.cfg.PluginName, log)
	if err != nil {
		code := codes.InvalidArgument
		if errors.Is(err, ErrNoDeviceInfo) {
			code = codes.FailedPrecondition
		}
		return nil, status.Error(code, err.Error())
	}
	return out, nil
}

// PreCloudInitIso leaves cloud-init as it is.
func (s *Server) PreCloudInitIso(_ context.Context, p *v1alpha3.PreCloudInitIsoParams) (*v1alpha3.PreCloudInitIsoResult, error) {
	return &v1alpha3.PreCloudInitIsoResult{CloudInitNoCloudSource: p.GetCloudInitNoCloudSource(), CloudInitData: p.GetCloudInitData()}, nil
}

// Shutdown ends Serve: virt-launcher calls it when the VM is gone.
func (s *Server) Shutdown(context.Context, *v1alpha3.ShutdownParams) (*v1alpha3.ShutdownResult, error) {
	s.once.Do(func() { close(s.shutdown) })
	return &v1alpha3.ShutdownResult{}, nil
}

// Serve listens on the hook socket until ctx ends or Shutdown is called.
func (s *Server) Serve(ctx context.Context) error {
	if err := os.MkdirAll(filepath.Dir(s.cfg.Socket), 0o755); err != nil {
		return err
	}
	if err := os.Remove(s.cfg.Socket); err != nil && !os.IsNotExist(err) {
		return err
	}
	ln, err := net.Listen("unix", s.cfg.Socket)
	if err != nil {
		return fmt.Errorf("hook socket: %w", err)
	}
	g := grpc.NewServer()
	info.RegisterInfoServer(g, s)
	v1alpha3.RegisterCallbacksServer(g, s)
	done := make(chan error, 1)
	go func() { done <- g.Serve(ln) }()
	s.log.Info("hook sidecar listening", "socket", s.cfg.Socket, "binding", s.cfg.PluginName, "networkInfo", s.cfg.NetworkInfo)
	select {
	case <-ctx.Done():
	case <-s.shutdown:
		s.log.Info("shutdown requested by virt-launcher")
	case err := <-done:
		return err
	}
	g.GracefulStop()
	os.Remove(s.cfg.Socket)
	return nil
}
