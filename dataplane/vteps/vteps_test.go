package vteps

import (
	"context"
	"fmt"
	"log/slog"
	"net/netip"
	"slices"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
)

func node(name string, addrs ...corev1.NodeAddress) *corev1.Node {
	return &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}, Status: corev1.NodeStatus{Addresses: addrs}}
}

func internal(a string) corev1.NodeAddress {
	return corev1.NodeAddress{Type: corev1.NodeInternalIP, Address: a}
}

func TestOf(t *testing.T) {
	got := Of([]*corev1.Node{
		node("b", internal("10.0.0.2")),
		node("a", corev1.NodeAddress{Type: corev1.NodeExternalIP, Address: "192.0.2.1"}, internal("fd00::1"), internal("10.0.0.1")),
		node("dup", internal("10.0.0.2")),
		node("none", corev1.NodeAddress{Type: corev1.NodeHostName, Address: "none"}),
	})
	want := []netip.Addr{netip.MustParseAddr("10.0.0.1"), netip.MustParseAddr("10.0.0.2")}
	if !slices.Equal(got, want) {
		t.Errorf("Of = %v, want %v (first IPv4 InternalIP, sorted, no duplicates)", got, want)
	}
}

// TestWatchFollowsNodes: the VTEPs follow Nodes added, readdressed and
// deleted; a status update that changes no address sets nothing.
func TestWatchFollowsNodes(t *testing.T) {
	cs := fake.NewClientset(node("n1", internal("10.0.0.1")))
	var mu sync.Mutex
	var calls [][]netip.Addr
	set := func(a []netip.Addr) error {
		mu.Lock()
		defer mu.Unlock()
		calls = append(calls, a)
		return nil
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- Watch(ctx, cs, set, slog.New(slog.DiscardHandler)) }()
	defer func() { cancel(); <-done }()
	waitFor := func(want string) {
		t.Helper()
		var last string
		for end := time.Now().Add(5 * time.Second); time.Now().Before(end); time.Sleep(10 * time.Millisecond) {
			mu.Lock()
			if len(calls) > 0 {
				last = fmt.Sprint(calls[len(calls)-1])
			}
			mu.Unlock()
			if last == want {
				return
			}
		}
		t.Fatalf("VTEPs %s, want %s", last, want)
	}
	nodes := cs.CoreV1().Nodes()
	waitFor("[10.0.0.1]")
	if _, err := nodes.Create(ctx, node("n2", internal("10.0.0.2")), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor("[10.0.0.1 10.0.0.2]")
	if _, err := nodes.Update(ctx, node("n2", internal("10.0.0.3")), metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor("[10.0.0.1 10.0.0.3]")
	mu.Lock()
	n := len(calls)
	mu.Unlock()
	up := node("n1", internal("10.0.0.1"))
	up.Labels = map[string]string{"heartbeat": "1"}
	if _, err := nodes.Update(ctx, up, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := nodes.Delete(ctx, "n2", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor("[10.0.0.1]")
	mu.Lock()
	defer mu.Unlock()
	if len(calls) != n+1 {
		t.Errorf("%d sets after an update that changed no address and a delete, want 1: %v", len(calls)-n, calls[n:])
	}
}
