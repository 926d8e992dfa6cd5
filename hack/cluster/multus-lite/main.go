// Command multus-lite is test tooling for hack/cluster/test-cni.sh, NOT
// Multus. Multus cannot be built here (the Go module proxy does not serve
// it), so this small meta CNI plugin calls the plugins of a pod the way
// Multus (thin or thick) does:
//
//   - the cluster default network (a conflist file, "clusterNetwork") first,
//     on the runtime's ifname; its result is the plugin's result;
//   - then every NetworkAttachmentDefinition named in the pod annotation
//     k8s.v1.cni.cncf.io/networks (comma form "name", "ns/name",
//     "name@ifname", or the JSON list form), on the requested interface or
//     net1, net2, ...; a NAD annotated k8s.v1.cni.cncf.io/resourceName gets
//     the next of the pod's sorted device IDs of that resource (kubelet
//     pod-resources List) as top-level "deviceID"/"pciBusID" and as the
//     capability args deviceID and CNIDeviceInfoFile, and the device
//     plugin's device-info file is copied to that CNIDeviceInfoFile first;
//   - the pod annotation k8s.v1.cni.cncf.io/network-status is patched in.
//
// DEL and CHECK use the delegate configs cached at ADD under stateDir (the
// pod may be gone by then). Left out: informers, readiness indicators,
// namespace isolation, DRA, default-network overrides, IP requests.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/containernetworking/cni/pkg/version"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	k8stypes "k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/tools/clientcmd"
	podresourcesapi "k8s.io/kubelet/pkg/apis/podresources/v1"

	"github.com/vhostmq/vhostmq/cni/kubevirt/podnet"
)

const (
	statusAnnot = "k8s.v1.cni.cncf.io/network-status"
	devInfoDir  = "/var/run/k8s.cni.cncf.io/devinfo"
)

var (
	podsGVR = schema.GroupVersionResource{Version: "v1", Resource: "pods"}
	nadGVR  = schema.GroupVersionResource{Group: "k8s.cni.cncf.io", Version: "v1", Resource: "network-attachment-definitions"}
)

// conf is multus-lite's own network configuration.
type conf struct {
	types.PluginConf
	Kubeconfig         string `json:"kubeconfig"`
	ClusterNetwork     string `json:"clusterNetwork"` // conflist file of the default network
	StateDir           string `json:"stateDir"`       // cached delegates, libcni's cache
	PodResourcesSocket string `json:"podResourcesSocket"`
	LogFile            string `json:"logFile"`
}

// delegate is one NAD attachment, as ADD ran it (cached for DEL and CHECK).
type delegate struct {
	Network  string          `json:"network"` // ns/name, Multus' delegate name
	IfName   string          `json:"ifname"`
	Config   json.RawMessage `json:"config"` // conflist, deviceID injected
	MAC      string          `json:"mac,omitempty"`
	Resource string          `json:"resource,omitempty"`
	DeviceID string          `json:"deviceID,omitempty"`
	DevInfo  string          `json:"devInfo,omitempty"` // CNIDeviceInfoFile
}

// netStatus is one entry of the network-status annotation.
type netStatus struct {
	Name       string          `json:"name"`
	Interface  string          `json:"interface,omitempty"`
	IPs        []string        `json:"ips,omitempty"`
	MAC        string          `json:"mac,omitempty"`
	MTU        int             `json:"mtu,omitempty"`
	Default    bool            `json:"default,omitempty"`
	DNS        types.DNS       `json:"dns"`
	DeviceInfo json.RawMessage `json:"device-info,omitempty"`
}

// ctx bounds the whole invocation (set in main).
var ctx context.Context

// run is the state of one invocation.
type run struct {
	c       conf
	args    *skel.CmdArgs
	ns, pod string
	cni     *libcni.CNIConfig
	def     *libcni.NetworkConfigList
}

func setup(args *skel.CmdArgs) (*run, error) {
	r := &run{args: args}
	if err := json.Unmarshal(args.StdinData, &r.c); err != nil {
		return nil, fmt.Errorf("multus-lite config: %w", err)
	}
	if r.c.PodResourcesSocket == "" {
		r.c.PodResourcesSocket = "/var/lib/kubelet/pod-resources/kubelet.sock"
	}
	var err error
	if r.def, err = libcni.ConfListFromFile(r.c.ClusterNetwork); err != nil {
		return nil, fmt.Errorf("clusterNetwork: %w", err)
	}
	for _, kv := range cniArgs(args.Args) {
		switch kv[0] {
		case "K8S_POD_NAMESPACE":
			r.ns = kv[1]
		case "K8S_POD_NAME":
			r.pod = kv[1]
		}
	}
	r.cni = libcni.NewCNIConfigWithCacheDir(filepath.SplitList(os.Getenv("CNI_PATH")), filepath.Join(r.c.StateDir, "libcni"), nil)
	return r, nil
}

func cniArgs(s string) [][2]string {
	var out [][2]string
	for _, kv := range strings.Split(s, ";") {
		if k, v, ok := strings.Cut(kv, "="); ok {
			out = append(out, [2]string{k, v})
		}
	}
	return out
}

func (r *run) logf(format string, a ...any) {
	if f, err := os.OpenFile(r.c.LogFile, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644); err == nil {
		fmt.Fprintf(f, "%s %s %s/%s %.12s %s\n", time.Now().UTC().Format("15:04:05.000"),
			os.Getenv("CNI_COMMAND"), r.ns, r.pod, r.args.ContainerID, fmt.Sprintf(format, a...))
		f.Close()
	}
}

// rt is the runtime config of one delegate call, with the capability
// args Multus passes (libcni forwards only those the plugin declares).
func (r *run) rt(d *delegate) *libcni.RuntimeConf {
	rt := &libcni.RuntimeConf{ContainerID: r.args.ContainerID, NetNS: r.args.Netns, IfName: r.args.IfName,
		Args: cniArgs(r.args.Args), CapabilityArgs: map[string]any{}}
	if d != nil {
		rt.IfName = d.IfName
		if d.MAC != "" {
			rt.Args = append(rt.Args, [2]string{"MAC", d.MAC})
			rt.CapabilityArgs["mac"] = d.MAC
		}
		if d.DeviceID != "" {
			rt.CapabilityArgs["deviceID"] = d.DeviceID
			rt.CapabilityArgs["CNIDeviceInfoFile"] = d.DevInfo
		}
	}
	return rt
}

// wrap keeps a delegate's CNI error code and names the network.
func wrap(err error, format string, a ...any) error {
	code := uint(types.ErrInternal)
	var te *types.Error
	if errors.As(err, &te) {
		code = te.Code
	}
	return types.NewError(code, "multus-lite: "+fmt.Sprintf(format, a...)+": "+err.Error(), "")
}

func (r *run) dynamic() (dynamic.Interface, error) {
	rc, err := clientcmd.BuildConfigFromFlags("", r.c.Kubeconfig)
	if err != nil {
		return nil, err
	}
	rc.Timeout, rc.UserAgent = 20*time.Second, "multus-lite"
	return dynamic.NewForConfig(rc)
}

// podDevices returns the pod's device IDs per resource, sorted, from the
// kubelet's pod-resources List (as Multus builds its resource map).
func (r *run) podDevices() (map[string][]string, error) {
	conn, err := grpc.NewClient("unix://"+r.c.PodResourcesSocket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	list, err := podresourcesapi.NewPodResourcesListerClient(conn).List(ctx, &podresourcesapi.ListPodResourcesRequest{})
	if err != nil {
		return nil, fmt.Errorf("pod-resources List: %w", err)
	}
	out := map[string][]string{}
	for _, p := range list.GetPodResources() {
		if p.GetNamespace() == r.ns && p.GetName() == r.pod {
			for _, c := range p.GetContainers() {
				for _, d := range c.GetDevices() {
					out[d.GetResourceName()] = append(out[d.GetResourceName()], d.GetDeviceIds()...)
				}
			}
		}
	}
	for _, ids := range out {
		sort.Strings(ids)
	}
	return out, nil
}

// delegates resolves the pod's networks annotation into delegates.
func (r *run) delegates(dyn dynamic.Interface, pod *unstructured.Unstructured) ([]delegate, error) {
	sel, err := podnet.ParseNetworks(pod.GetAnnotations()[podnet.AnnotationNetworks], r.ns)
	if err != nil {
		return nil, err
	}
	var devices map[string][]string
	index := map[string]int{}
	out := make([]delegate, 0, len(sel))
	for i, s := range sel {
		d := delegate{Network: s.Namespace + "/" + s.Name, IfName: s.Interface, MAC: s.MAC}
		if d.IfName == "" {
			d.IfName = fmt.Sprintf("net%d", i+1)
		}
		nad, err := dyn.Resource(nadGVR).Namespace(s.Namespace).Get(ctx, s.Name, metav1.GetOptions{})
		if err != nil {
			return nil, fmt.Errorf("network-attachment-definition %s: %w", d.Network, err)
		}
		config, _, _ := unstructured.NestedString(nad.Object, "spec", "config")
		if res := nad.GetAnnotations()[podnet.AnnotationResourceName]; res != "" {
			if devices == nil {
				if devices, err = r.podDevices(); err != nil {
					return nil, err
				}
			}
			if ids := devices[res]; index[res] < len(ids) {
				d.Resource, d.DeviceID = res, ids[index[res]]
				d.DevInfo = filepath.Join(devInfoDir, "cni", strings.ReplaceAll(fmt.Sprintf("%s-%s_%s", d.Network, r.args.ContainerID, d.IfName), "/", "-"))
				index[res]++
			}
		}
		if d.Config, err = asConfList(config, d.DeviceID); err != nil {
			return nil, fmt.Errorf("network-attachment-definition %s: spec.config: %w", d.Network, err)
		}
		out = append(out, d)
	}
	return out, nil
}

// asConfList turns a single plugin config or a conflist into a conflist,
// with "deviceID" and "pciBusID" in every plugin as Multus injects them.
func asConfList(config, deviceID string) ([]byte, error) {
	var raw map[string]any
	if err := json.Unmarshal([]byte(config), &raw); err != nil {
		return nil, err
	}
	plugins, ok := raw["plugins"].([]any)
	if !ok {
		plugins = []any{raw}
		raw = map[string]any{"cniVersion": raw["cniVersion"], "name": raw["name"], "plugins": plugins}
	}
	for _, p := range plugins {
		if m, ok := p.(map[string]any); ok && deviceID != "" {
			m["deviceID"], m["pciBusID"] = deviceID, deviceID
		}
	}
	return json.Marshal(raw)
}

// status is the network-status entry of a result: Multus takes only an
// interface inside the sandbox.
func status(name, ifname string, res *current.Result, def bool) *netStatus {
	idx := -1
	for i, in := range res.Interfaces {
		if in.Sandbox != "" && (idx < 0 || in.Name == ifname) {
			idx = i
		}
	}
	if idx < 0 {
		return nil
	}
	in := res.Interfaces[idx]
	s := &netStatus{Name: name, Interface: in.Name, MAC: in.Mac, MTU: in.Mtu, Default: def, DNS: res.DNS}
	for _, ip := range res.IPs {
		if ip.Interface == nil || *ip.Interface == idx {
			s.IPs = append(s.IPs, ip.Address.IP.String())
		}
	}
	return s
}

func (r *run) cacheFile() string { return filepath.Join(r.c.StateDir, r.args.ContainerID+".json") }

func cmdAdd(args *skel.CmdArgs) error {
	r, err := setup(args)
	if err != nil {
		return err
	}
	t0 := time.Now()
	res, err := r.cni.AddNetworkList(ctx, r.def, r.rt(nil))
	if err != nil {
		return wrap(err, "[%s/%s]: error adding container to network %q", r.ns, r.pod, r.def.Name)
	}
	result, err := current.NewResultFromResult(res)
	if err != nil {
		return err
	}
	r.logf("%s %s ok (%.3fs)", r.def.Name, args.IfName, time.Since(t0).Seconds())
	statuses := []*netStatus{status(r.def.Name, args.IfName, result, true)}
	var dels []delegate
	var dyn dynamic.Interface
	if r.pod != "" { // the pod's networks (no pod named: the default network only)
		var pod *unstructured.Unstructured
		if dyn, err = r.dynamic(); err == nil {
			if pod, err = dyn.Resource(podsGVR).Namespace(r.ns).Get(ctx, r.pod, metav1.GetOptions{}); err == nil {
				dels, err = r.delegates(dyn, pod)
			}
		}
	}
	if err == nil && len(dels) > 0 { // cached before any delegate runs, for DEL
		var b []byte
		b, _ = json.Marshal(dels)
		if err = os.MkdirAll(r.c.StateDir, 0o700); err == nil {
			err = os.WriteFile(r.cacheFile(), b, 0o600)
		}
	}
	for i := 0; err == nil && i < len(dels); i++ {
		d, t1 := &dels[i], time.Now()
		if d.DeviceID != "" { // as Multus: the device plugin's file first
			src := filepath.Join(devInfoDir, "dp", fmt.Sprintf("%s-%s-device.json", strings.ReplaceAll(d.Resource, "/", "-"), d.DeviceID))
			if e := copyFile(src, d.DevInfo); e != nil {
				r.logf("device-info copy %s: %v", src, e)
			}
		}
		var list *libcni.NetworkConfigList
		if list, err = libcni.ConfListFromBytes(d.Config); err != nil {
			break
		}
		if res, err = r.cni.AddNetworkList(ctx, list, r.rt(d)); err != nil {
			err = wrap(err, "[%s/%s]: error adding container to network %q (%s)", r.ns, r.pod, d.Network, d.IfName)
			break
		}
		var dres *current.Result
		if dres, err = current.NewResultFromResult(res); err != nil {
			break
		}
		s := status(d.Network, d.IfName, dres, false)
		if b, e := os.ReadFile(d.DevInfo); s != nil && e == nil && json.Valid(b) {
			s.DeviceInfo = b
		}
		statuses = append(statuses, s)
		r.logf("%s %s deviceID=%s ok (%.3fs)", d.Network, d.IfName, d.DeviceID, time.Since(t1).Seconds())
	}
	if err == nil && r.pod != "" {
		var st, patch []byte
		st, _ = json.Marshal(slices.DeleteFunc(statuses, func(s *netStatus) bool { return s == nil }))
		patch, _ = json.Marshal(map[string]any{"metadata": map[string]any{"annotations": map[string]string{statusAnnot: string(st)}}})
		_, err = dyn.Resource(podsGVR).Namespace(r.ns).Patch(ctx, r.pod, k8stypes.MergePatchType, patch, metav1.PatchOptions{})
	}
	if err != nil { // undo everything, as the runtime expects of a failed ADD
		r.logf("failed (%.3fs): %v", time.Since(t0).Seconds(), err)
		r.del(dels)
		os.Remove(r.cacheFile())
		return err
	}
	r.logf("done: %d networks, total %.3fs", len(statuses), time.Since(t0).Seconds())
	return types.PrintResult(result, r.c.CNIVersion)
}

// copyFile writes dst (mode 0444) unless it exists, as Multus' helpers do.
func copyFile(src, dst string) error {
	b, err := os.ReadFile(src)
	if err == nil {
		err = os.MkdirAll(filepath.Dir(dst), 0o755)
	}
	if _, e := os.Stat(dst); err == nil && e == nil {
		return fmt.Errorf("%s exists", dst)
	}
	if err == nil {
		err = os.WriteFile(dst, b, 0o444)
	}
	return err
}

// del runs the delegates' DEL in reverse order, then the default network's.
func (r *run) del(dels []delegate) error {
	var errs []error
	for i := len(dels) - 1; i >= 0; i-- {
		d := &dels[i]
		list, err := libcni.ConfListFromBytes(d.Config)
		if err == nil {
			err = r.cni.DelNetworkList(ctx, list, r.rt(d))
		}
		if err != nil {
			errs = append(errs, wrap(err, "error deleting network %q (%s)", d.Network, d.IfName))
		}
		if d.DevInfo != "" {
			os.Remove(d.DevInfo)
		}
		r.logf("deleted %s %s deviceID=%s: err=%v", d.Network, d.IfName, d.DeviceID, err)
	}
	err := r.cni.DelNetworkList(ctx, r.def, r.rt(nil))
	if err != nil {
		errs = append(errs, wrap(err, "error deleting the default network %q", r.def.Name))
	}
	r.logf("deleted %s %s: err=%v", r.def.Name, r.args.IfName, err)
	return errors.Join(errs...)
}

// cached returns the delegates ADD saved before it ran the first of them
// (so the pod may be gone by now). No cache: ADD never ran a delegate.
func (r *run) cached() ([]delegate, error) {
	var dels []delegate
	b, err := os.ReadFile(r.cacheFile())
	if os.IsNotExist(err) {
		return nil, nil
	} else if err == nil {
		err = json.Unmarshal(b, &dels)
	}
	return dels, err
}

func cmdDel(args *skel.CmdArgs) error {
	r, err := setup(args)
	if err != nil {
		return err
	}
	dels, err := r.cached()
	if err != nil {
		r.logf("delegates: %v", err)
	}
	if err := r.del(dels); err != nil {
		return err
	}
	os.Remove(r.cacheFile())
	return nil
}

func cmdCheck(args *skel.CmdArgs) error {
	r, err := setup(args)
	if err != nil {
		return err
	}
	if err := r.cni.CheckNetworkList(ctx, r.def, r.rt(nil)); err != nil {
		return wrap(err, "checking the default network")
	}
	dels, err := r.cached()
	for i := 0; err == nil && i < len(dels); i++ {
		var list *libcni.NetworkConfigList
		if list, err = libcni.ConfListFromBytes(dels[i].Config); err == nil {
			if err = r.cni.CheckNetworkList(ctx, list, r.rt(&dels[i])); err != nil {
				err = wrap(err, "checking network %q (%s)", dels[i].Network, dels[i].IfName)
			}
		}
	}
	return err
}

func main() {
	var cancel context.CancelFunc
	ctx, cancel = context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	skel.PluginMainFuncs(skel.CNIFuncs{Add: cmdAdd, Del: cmdDel, Check: cmdCheck},
		version.PluginSupports("0.3.1", "0.4.0", "1.0.0"), "multus-lite: Multus-style delegation for the vhostmq cluster tests")
}
