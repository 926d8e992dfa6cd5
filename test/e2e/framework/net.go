//go:build e2e

package framework

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"syscall"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
)

// HTTPGetIn GETs url from the network namespace at nsPath (a file under
// /run/netns; "" = this one) and returns the status code.
func HTTPGetIn(ctx context.Context, nsPath, url string) (int, error) {
	tr := &http.Transport{DisableKeepAlives: true}
	if nsPath != "" {
		tr.DialContext = dialInNetNS(nsPath)
	}
	c := &http.Client{Transport: tr, Timeout: 5 * time.Second}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return 0, err
	}
	resp, err := c.Do(req)
	if err != nil {
		return 0, err
	}
	resp.Body.Close()
	return resp.StatusCode, nil
}

// TCPConnectIn tries a TCP connection to addr from the network namespace
// at nsPath and says how it went: "connected", "refused", "timeout" (no
// answer within timeout), or "error: ..." for anything else (the namespace
// missing, no route), so a check that wants nobody listening can tell
// "refused" from a broken test set-up.
func TCPConnectIn(ctx context.Context, nsPath, addr string, timeout time.Duration) string {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	dial := (&net.Dialer{}).DialContext
	if nsPath != "" {
		dial = dialInNetNS(nsPath)
	}
	conn, err := dial(ctx, "tcp", addr)
	switch {
	case err == nil:
		conn.Close()
		return "connected"
	case errors.Is(err, syscall.ECONNREFUSED):
		return "refused"
	case errors.Is(err, context.DeadlineExceeded) || errors.Is(err, os.ErrDeadlineExceeded):
		return "timeout"
	}
	return "error: " + err.Error()
}

// ClientFor is a client of the cluster with another kubeconfig (a
// component's own credentials), connecting from the API server's network
// namespace as Client does.
func (f *Framework) ClientFor(kubeconfig string) (kubernetes.Interface, error) {
	rc, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return nil, fmt.Errorf("kubeconfig %s: %w", kubeconfig, err)
	}
	rc.Timeout = 20 * time.Second
	if f.NetNS != "" {
		rc.Dial = dialInNetNS(f.NetNS)
	}
	return kubernetes.NewForConfig(rc)
}

// handleIn is a netlink handle in the network namespace at nsPath.
func handleIn(nsPath string) (*netlink.Handle, error) {
	ns, err := netns.GetFromPath(nsPath)
	if err != nil {
		return nil, fmt.Errorf("netns %s: %w", nsPath, err)
	}
	defer ns.Close()
	return netlink.NewHandleAt(ns)
}

// LinkMaster is the name of the bridge (master) link is a port of, in the
// network namespace at nsPath ("none" when it has no master).
func LinkMaster(nsPath, link string) (string, error) {
	h, err := handleIn(nsPath)
	if err != nil {
		return "", err
	}
	defer h.Close()
	l, err := h.LinkByName(link)
	if err != nil {
		return "", fmt.Errorf("%s in %s: %w", link, nsPath, err)
	}
	if l.Attrs().MasterIndex == 0 {
		return "none", nil
	}
	m, err := h.LinkByIndex(l.Attrs().MasterIndex)
	if err != nil {
		return "", err
	}
	return m.Attrs().Name, nil
}

// NeighborMAC is the link-layer address the neighbour table of dev (in the
// network namespace at nsPath) holds for ip ("" when none).
func NeighborMAC(nsPath, dev, ip string) (string, error) {
	h, err := handleIn(nsPath)
	if err != nil {
		return "", err
	}
	defer h.Close()
	l, err := h.LinkByName(dev)
	if err != nil {
		return "", fmt.Errorf("%s in %s: %w", dev, nsPath, err)
	}
	ns, err := h.NeighList(l.Attrs().Index, netlink.FAMILY_V4)
	if err != nil {
		return "", err
	}
	want := net.ParseIP(ip)
	for _, n := range ns {
		if n.IP.Equal(want) {
			return n.HardwareAddr.String(), nil
		}
	}
	return "", nil
}
