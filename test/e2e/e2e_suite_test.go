//go:build e2e

// Package e2e holds the cluster end-to-end specs (Ginkgo v2, Gomega). The
// cluster is brought up by bash (hack/cluster/e2e.sh); everything asserted
// about it is here. See README.md.
package e2e

import (
	"context"
	"fmt"
	"testing"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/vhostmq/vhostmq/test/e2e/framework"
)

// f is the suite's framework: the clients and settings every spec uses.
var f *framework.Framework

func TestE2E(t *testing.T) {
	RegisterFailHandler(Fail)
	RunSpecs(t, "vhostmq cluster e2e")
}

var _ = BeforeSuite(func(ctx SpecContext) {
	var err error
	f, err = framework.New(framework.LoadConfig())
	Expect(err).NotTo(HaveOccurred())
	Eventually(func() (string, error) {
		v, err := f.Client.Discovery().ServerVersion()
		if err != nil {
			return "", err
		}
		return v.GitVersion, nil
	}).WithContext(ctx).WithTimeout(30*time.Second).Should(Not(BeEmpty()), "the API server of %s", f.Kubeconfig)
	GinkgoWriter.Printf("cluster: %s (netns %q); diagnostics of failed specs go to %s\n", f.Kubeconfig, f.NetNS, f.LogDir)
})

// A failed spec leaves the cluster's state in the run's log folder.
var _ = ReportAfterEach(func(r SpecReport) {
	if !r.Failed() || f == nil {
		return
	}
	if dir := f.SaveDiagnostics(r); dir != "" {
		fmt.Printf("diagnostics of %q: %s\n", r.LeafNodeText, dir)
	}
})

// bg is for clean-ups that must run even when a spec's context is done.
func bg() context.Context { return context.Background() }
