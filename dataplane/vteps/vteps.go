// Package vteps keeps the vxlan uplink's VTEPs equal to the cluster's
// nodes: each Node's InternalIP (its first IPv4 one), watched with a
// client-go informer, so that a node that joins gets the overlay's
// floods and a node that goes away stops getting them (and what was
// learned behind it is forgotten). The node pod does this itself: no
// controller, nothing written to the API server.
package vteps

import (
	"context"
	"log/slog"
	"net/netip"
	"slices"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
)

// Of returns the nodes' underlay addresses: each node's first IPv4
// InternalIP, sorted, without duplicates. A node without one is left out.
func Of(nodes []*corev1.Node) []netip.Addr {
	var out []netip.Addr
	for _, n := range nodes {
		for _, a := range n.Status.Addresses {
			if a.Type != corev1.NodeInternalIP {
				continue
			}
			if ip, err := netip.ParseAddr(a.Address); err == nil && ip.Is4() {
				out = append(out, ip)
				break
			}
		}
	}
	slices.SortFunc(out, netip.Addr.Compare)
	return slices.Compact(out)
}

// Watch calls set with the nodes' addresses once the informer has synced
// and again whenever they change, until ctx ends. A set that fails is
// logged and tried again at the next change.
func Watch(ctx context.Context, cs kubernetes.Interface, set func([]netip.Addr) error, log *slog.Logger) error {
	f := informers.NewSharedInformerFactory(cs, 0)
	nodes := f.Core().V1().Nodes()
	lister := nodes.Lister()
	changed := make(chan struct{}, 1)
	poke := func(any) {
		select {
		case changed <- struct{}{}:
		default:
		}
	}
	if _, err := nodes.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: poke, UpdateFunc: func(_, n any) { poke(n) }, DeleteFunc: poke,
	}); err != nil {
		return err
	}
	f.Start(ctx.Done())
	defer f.Shutdown()
	if !cache.WaitForCacheSync(ctx.Done(), nodes.Informer().HasSynced) {
		return ctx.Err()
	}
	var last []netip.Addr
	applied := false
	for {
		all, err := lister.List(labels.Everything())
		if err == nil {
			if addrs := Of(all); !applied || !slices.Equal(addrs, last) {
				if err := set(addrs); err != nil {
					log.Error("cannot set the VTEPs from the nodes", "err", err)
				} else {
					log.Info("VTEPs from the nodes", "nodes", len(all), "vteps", len(addrs))
					last, applied = addrs, true
				}
			}
		}
		select {
		case <-ctx.Done():
			return nil
		case <-changed:
		}
	}
}
