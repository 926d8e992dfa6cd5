// Command hookcall calls a KubeVirt hook sidecar the way virt-launcher
// does: it dials the sidecar's unix socket, asks Info for the hook points
// and versions, and calls v1alpha3 OnDefineDomain with a domain XML and a
// VMI JSON. The domain XML the sidecar returns goes to stdout; a summary of
// Info goes to stderr. A failed call exits 1 with the gRPC status (code and
// message) on stderr; a bad command line exits 2.
//
//	hookcall --socket /run/hooks/vhostmq-binding.sock --domain domain.xml --vmi vmi.json >out.xml
//
// Used by hack/e2e-kubevirt-libvirt.sh.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/vhostmq/vhostmq/cni/kubevirt/hookapi/info"
	"github.com/vhostmq/vhostmq/cni/kubevirt/hookapi/v1alpha3"
)

func main() {
	sock := flag.String("socket", "", "the sidecar's hook socket")
	domainFile := flag.String("domain", "", "file with the domain XML virt-launcher built")
	vmiFile := flag.String("vmi", "", "file with the VirtualMachineInstance JSON")
	timeout := flag.Duration("timeout", 30*time.Second, "bound on the two calls")
	flag.Parse()
	if *sock == "" || *domainFile == "" || *vmiFile == "" || flag.NArg() > 0 {
		fmt.Fprintln(os.Stderr, "usage: hookcall --socket SOCK --domain DOMAIN.xml --vmi VMI.json [--timeout 30s]")
		os.Exit(2)
	}
	domain, err := os.ReadFile(*domainFile)
	if err != nil {
		fail("reading --domain: %v", err)
	}
	vmi, err := os.ReadFile(*vmiFile)
	if err != nil {
		fail("reading --vmi: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), *timeout)
	defer cancel()
	abs, err := filepath.Abs(*sock) // unix://relative would be read as an authority
	if err != nil {
		fail("--socket: %v", err)
	}
	conn, err := grpc.NewClient("unix://"+abs, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		fail("dialing %s: %v", *sock, err)
	}
	defer conn.Close()

	// virt-launcher only calls hook points and versions that Info lists.
	in, err := info.NewInfoClient(conn).Info(ctx, &info.InfoParams{})
	if err != nil {
		failRPC("Info", err)
	}
	var points []string
	for _, p := range in.GetHookPoints() {
		points = append(points, p.GetName())
	}
	fmt.Fprintf(os.Stderr, "hookcall: Info: name=%s versions=%v hookPoints=%v\n", in.GetName(), in.GetVersions(), points)
	if !slices.Contains(in.GetVersions(), "v1alpha3") || !slices.Contains(points, "OnDefineDomain") {
		fail("the sidecar does not offer v1alpha3 OnDefineDomain (versions %v, hook points %v)", in.GetVersions(), points)
	}

	res, err := v1alpha3.NewCallbacksClient(conn).OnDefineDomain(ctx, &v1alpha3.OnDefineDomainParams{DomainXML: domain, Vmi: vmi})
	if err != nil {
		failRPC("OnDefineDomain", err)
	}
	if len(res.GetDomainXML()) == 0 {
		fail("OnDefineDomain returned an empty domain XML")
	}
	os.Stdout.Write(res.GetDomainXML())
}

func failRPC(call string, err error) {
	s := status.Convert(err)
	fail("%s: rpc error: code = %s desc = %s", call, s.Code(), s.Message())
}

func fail(format string, a ...any) {
	fmt.Fprintf(os.Stderr, "hookcall: "+format+"\n", a...)
	os.Exit(1)
}
