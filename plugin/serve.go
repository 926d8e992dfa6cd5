package plugin

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"
	podresourcesapi "k8s.io/kubelet/pkg/apis/podresources/v1"
)

// Run serves the plugin until ctx ends. It registers with the kubelet (by
// the plugin watcher when the kubelet has a plugins_registry directory,
// else with Register on kubelet.sock), and serves again and re-registers
// whenever the kubelet restarts (kubelet.sock is re-created; an inotify
// watch sees it at once) or the gRPC server dies. On the way out it
// reports no devices, so no stale capacity stays behind, and removes its
// device-info files, unless another instance of the plugin serves the
// resource by then (an upgrade: the new pod's plugin took over, and the
// devices, the allocations and their files are its).
func (p *Plugin) Run(ctx context.Context) error {
	go p.routineAgent(ctx)
	go p.routineReconcile(ctx)
	kubeletRestarted, err := watchCreate(ctx, filepath.Join(p.cfg.KubeletDir, "device-plugins"), "kubelet.sock")
	if err != nil {
		return fmt.Errorf("watching the kubelet socket: %w", err)
	}
	p.otherInstanceServing() // removes dead instances' sockets
	defer func() {
		if p.successor {
			p.log.Info("another instance serves the resource: its devices and allocations stay")
			return
		}
		// Stopping (an uninstall): reclaim what no pod holds now, grace or
		// not, then drop the device-info files.
		lctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if live, err := p.liveAllocations(lctx); err == nil {
			p.reclaim(live, time.Now().Add(reconcileGrace))
		}
		p.cleanupDevInfo()
	}()
	for {
		err := p.serveOnce(ctx, kubeletRestarted)
		if ctx.Err() != nil {
			return nil
		}
		p.log.Warn("device plugin server ended; serving again", "err", err)
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(200 * time.Millisecond):
		}
	}
}

func (p *Plugin) watcherMode() bool {
	fi, err := os.Stat(filepath.Join(p.cfg.KubeletDir, "plugins_registry"))
	return err == nil && fi.IsDir()
}

// serveOnce serves one gRPC server life: until the kubelet restarts, the
// server fails, or ctx ends.
func (p *Plugin) serveOnce(ctx context.Context, kubeletRestarted <-chan struct{}) error {
	watcher := p.watcherMode()
	dir := filepath.Join(p.cfg.KubeletDir, "device-plugins")
	if watcher {
		dir = filepath.Join(p.cfg.KubeletDir, "plugins_registry")
	}
	ln, path, err := listenSocket(dir, p.socketName())
	if err != nil {
		return err
	}
	srv := grpc.NewServer()
	pluginapi.RegisterDevicePluginServer(srv, p)
	p.registered = make(chan error, 1)
	if watcher {
		registerapi.RegisterRegistrationServer(srv, p)
	}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	defer func() {
		// Tell the kubelet the devices are gone before the stream closes,
		// unless a successor serves them.
		stopping := ctx.Err() != nil
		if stopping {
			p.successor = p.otherInstanceServing()
		}
		p.mu.Lock()
		p.gone = stopping && !p.successor
		p.notify()
		p.mu.Unlock()
		if p.gone {
			time.Sleep(200 * time.Millisecond)
		}
		srv.Stop()
		os.Remove(path)
	}()
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	gone := socketGone(sctx, path)
	if watcher {
		p.log.Info("serving for the kubelet's plugin watcher", "socket", path)
	} else {
		if err := p.register(ctx, path); err != nil {
			return err
		}
		p.log.Info("registered with the kubelet", "socket", path)
	}
	for {
		select {
		case <-ctx.Done():
			return nil
		case err := <-served:
			return fmt.Errorf("gRPC server: %w", err)
		case err := <-p.registered:
			if err != nil {
				return err
			}
			p.log.Info("the kubelet registered the plugin")
		case <-kubeletRestarted:
			p.log.Info("the kubelet restarted; registering again")
			return nil
		case <-gone:
			return errors.New("plugin socket removed")
		}
	}
}

// instanceSockets lists the sockets of every other instance of the
// resource, in both registration directories.
func (p *Plugin) instanceSockets() []string {
	var out []string
	for _, sub := range []string{"device-plugins", "plugins_registry"} {
		m, _ := filepath.Glob(filepath.Join(p.cfg.KubeletDir, sub, p.socketPrefix()+"*.sock"))
		for _, path := range m {
			if filepath.Base(path) != p.socketName() {
				out = append(out, path)
			}
		}
	}
	return out
}

// otherInstanceServing reports whether another instance of the plugin
// answers on its socket; sockets of instances that died without removing
// them are removed on the way (the kubelet's plugin watcher would try them).
func (p *Plugin) otherInstanceServing() bool {
	live := false
	for _, path := range p.instanceSockets() {
		if p.removeIfStale(path) {
			p.log.Info("another instance of the plugin serves the resource", "socket", path)
			live = true
		}
	}
	return live
}

// register calls Registration.Register on kubelet.sock.
func (p *Plugin) register(ctx context.Context, path string) error {
	conn, err := grpc.NewClient("unix://"+filepath.Join(p.cfg.KubeletDir, "device-plugins", "kubelet.sock"),
		grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return err
	}
	defer conn.Close()
	rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	_, err = pluginapi.NewRegistrationClient(conn).Register(rctx, &pluginapi.RegisterRequest{
		Version: pluginapi.Version, Endpoint: filepath.Base(path), ResourceName: p.cfg.ResourceName,
		Options: &pluginapi.DevicePluginOptions{GetPreferredAllocationAvailable: true},
	}, grpc.WaitForReady(true))
	if err != nil {
		return fmt.Errorf("registering with the kubelet: %w", err)
	}
	return nil
}

// GetInfo answers the kubelet's plugin watcher.
func (p *Plugin) GetInfo(context.Context, *registerapi.InfoRequest) (*registerapi.PluginInfo, error) {
	return &registerapi.PluginInfo{Type: registerapi.DevicePlugin, Name: p.cfg.ResourceName,
		Endpoint: filepath.Join(p.cfg.KubeletDir, "plugins_registry", p.socketName()), SupportedVersions: []string{pluginapi.Version}}, nil
}

// NotifyRegistrationStatus receives the plugin watcher's verdict.
func (p *Plugin) NotifyRegistrationStatus(_ context.Context, s *registerapi.RegistrationStatus) (*registerapi.RegistrationStatusResponse, error) {
	var err error
	if !s.GetPluginRegistered() {
		err = fmt.Errorf("the kubelet refused the plugin: %s", s.GetError())
	}
	select {
	case p.registered <- err:
	default:
	}
	return &registerapi.RegistrationStatusResponse{}, nil
}

// watchCreate reports every creation of name in dir, through inotify, so
// a kubelet restart is seen within milliseconds.
func watchCreate(ctx context.Context, dir, name string) (<-chan struct{}, error) {
	if err := os.MkdirAll(dir, 0o750); err != nil {
		return nil, err
	}
	fd, err := unix.InotifyInit1(unix.IN_CLOEXEC)
	if err != nil {
		return nil, err
	}
	if _, err := unix.InotifyAddWatch(fd, dir, unix.IN_CREATE|unix.IN_MOVED_TO); err != nil {
		unix.Close(fd)
		return nil, err
	}
	out := make(chan struct{}, 1)
	go func() { <-ctx.Done(); unix.Close(fd) }()
	go func() {
		buf := make([]byte, 4096)
		for {
			n, err := unix.Read(fd, buf)
			if err != nil || n <= 0 {
				return
			}
			for off := 0; off+unix.SizeofInotifyEvent <= n; {
				ev := (*unix.InotifyEvent)(unsafe.Pointer(&buf[off]))
				nameBytes := buf[off+unix.SizeofInotifyEvent : off+unix.SizeofInotifyEvent+int(ev.Len)]
				if strings.TrimRight(string(nameBytes), "\x00") == name {
					select {
					case out <- struct{}{}:
					default:
					}
				}
				off += unix.SizeofInotifyEvent + int(ev.Len)
			}
		}
	}()
	return out, nil
}

// socketGone fires when path disappears (the kubelet cleaning its folder).
func socketGone(ctx context.Context, path string) <-chan struct{} {
	out := make(chan struct{})
	go func() {
		t := time.NewTicker(time.Second)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
				if _, err := os.Lstat(path); os.IsNotExist(err) {
					close(out)
					return
				}
			}
		}
	}()
	return out
}

// reconcileEvery is how often freed allocations are looked for; allocations
// younger than reconcileGrace are left alone (Allocate runs a moment before
// the kubelet lists the pod's devices).
const (
	reconcileEvery = 5 * time.Second
	reconcileGrace = 30 * time.Second
)

// routineReconcile removes the socket directories and device-info files of
// allocations no container holds any more, as the kubelet's pod-resources
// API reports them.
func (p *Plugin) routineReconcile(ctx context.Context) {
	t := time.NewTicker(reconcileEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		live, err := p.liveAllocations(ctx)
		if err != nil {
			p.log.Debug("pod-resources unavailable; nothing reclaimed", "err", err)
			continue
		}
		p.reclaim(live, time.Now())
	}
}

// liveAllocations returns the allocation directory names of every
// container that holds our devices.
func (p *Plugin) liveAllocations(ctx context.Context) (map[string]bool, error) {
	conn, err := grpc.NewClient("unix://"+filepath.Join(p.cfg.KubeletDir, "pod-resources", "kubelet.sock"),
		grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	lctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	resp, err := podresourcesapi.NewPodResourcesListerClient(conn).List(lctx, &podresourcesapi.ListPodResourcesRequest{})
	if err != nil {
		return nil, err
	}
	live := map[string]bool{}
	for _, pod := range resp.GetPodResources() {
		for _, c := range pod.GetContainers() {
			if ids := ContainerDevices(c, p.cfg.ResourceName); len(ids) > 0 {
				live[AllocationDir(ids)] = true
			}
		}
	}
	return live, nil
}

// reclaim removes allocations that are not live and older than the grace
// period: the socket directory (only if empty: a port socket still in it
// belongs to a pod the CNI has not torn down), its slots file, and the
// device-info files of its devices unless another live allocation has them.
func (p *Plugin) reclaim(live map[string]bool, now time.Time) {
	files, _ := filepath.Glob(filepath.Join(p.cfg.SocketRoot, ".qp-*.slots"))
	liveIDs := map[string]bool{}
	for _, f := range files {
		dir := strings.TrimSuffix(strings.TrimPrefix(filepath.Base(f), "."), ".slots")
		if live[dir] {
			for _, id := range readSlots(f) {
				liveIDs[id] = true
			}
		}
	}
	for _, f := range files {
		dir := strings.TrimSuffix(strings.TrimPrefix(filepath.Base(f), "."), ".slots")
		fi, err := os.Stat(f)
		if err != nil || live[dir] || now.Sub(fi.ModTime()) < reconcileGrace {
			continue
		}
		host := filepath.Join(p.cfg.SocketRoot, dir)
		p.removeStaleSockets(host)
		if err := os.Remove(host); err != nil && !os.IsNotExist(err) {
			continue // not empty yet
		}
		// Best effort: the agent drops the reservation of a removed
		// directory itself, so an agent that is down now is no leak.
		if err := p.release(dir); err != nil {
			p.log.Info("freed allocation: the node agent did not take the release; it drops the reservation itself", "dir", host, "err", err)
		}
		for _, id := range readSlots(f) {
			if !liveIDs[id] {
				os.Remove(p.devInfoPath(id))
			}
		}
		os.Remove(f)
		p.log.Info("freed allocation removed", "dir", host)
	}
}

// removeStaleSockets removes the unix sockets in a freed allocation that
// nobody listens on: QEMU killed with SIGKILL leaves its server socket
// behind, and the directory could never be reclaimed. A socket something
// still listens on (a port whose deletion is pending) stays.
func (p *Plugin) removeStaleSockets(dir string) {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return
	}
	for _, e := range ents {
		if e.Type()&os.ModeSocket == 0 {
			continue
		}
		p.removeIfStale(filepath.Join(dir, e.Name()))
	}
}

// removeIfStale removes the unix socket at path if nobody listens on it
// (connection refused); it reports whether something answered.
func (p *Plugin) removeIfStale(path string) (live bool) {
	c, err := net.DialTimeout("unix", path, time.Second)
	if err == nil {
		c.Close()
		return true
	}
	if errors.Is(err, syscall.ECONNREFUSED) && os.Remove(path) == nil {
		p.log.Info("stale socket removed", "socket", path)
	}
	return false
}

func readSlots(f string) []string {
	b, err := os.ReadFile(f)
	if err != nil {
		return nil
	}
	return strings.Split(strings.TrimSpace(string(b)), ",")
}

// cleanupDevInfo removes every device-info file of this resource (the
// plugin is stopping).
func (p *Plugin) cleanupDevInfo() {
	files, _ := filepath.Glob(filepath.Join(p.cfg.DevInfoDir, strings.ReplaceAll(p.cfg.ResourceName, "/", "-")+"-*-device.json"))
	for _, f := range files {
		os.Remove(f)
	}
}

// ContainerDevices is a container's device IDs of resource as the
// kubelet's pod-resources API lists them: with NUMA topology there is one
// entry per device, so the allocation is the union over the entries.
func ContainerDevices(c *podresourcesapi.ContainerResources, resource string) []string {
	var ids []string
	for _, d := range c.GetDevices() {
		if d.GetResourceName() == resource {
			ids = append(ids, d.GetDeviceIds()...)
		}
	}
	return ids
}
