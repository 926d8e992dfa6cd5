// Command vhostmq-kubevirt-register adds vhostmq's network binding plugin
// to the KubeVirt CR, or with --remove takes it out: the Helm chart runs
// it as its post-install/post-upgrade and pre-delete hooks
// (kubevirt.registerBinding). Exit status 0 done, 1 failed, 2 bad flags.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"time"

	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/vhostmq/vhostmq/cni/kubevirt/register"
)

func main() {
	var b register.Binding
	flag.StringVar(&b.Name, "binding", "vhostmq", "the binding name VMI interfaces use")
	flag.StringVar(&b.SidecarImage, "sidecar-image", "", "the binding sidecar's image (required without --remove)")
	flag.StringVar(&b.MemoryOverhead, "memory-overhead", "20Mi", "memory added to virt-launcher pods for the sidecar (\"\" for none)")
	namespace := flag.String("kubevirt-namespace", "kubevirt", "the KubeVirt CR's namespace")
	name := flag.String("kubevirt-name", "kubevirt", "the KubeVirt CR's name")
	kubeconfig := flag.String("kubeconfig", "", "kubeconfig (default: in-cluster)")
	remove := flag.Bool("remove", false, "take the binding out of the CR instead")
	timeout := flag.Duration("timeout", time.Minute, "give up after this long")
	flag.Parse()
	if flag.NArg() > 0 {
		fmt.Fprintf(os.Stderr, "unexpected argument %q\n", flag.Arg(0))
		os.Exit(2)
	}
	if !*remove {
		if err := b.Validate(); err != nil {
			fmt.Fprintf(os.Stderr, "--%s\n", err)
			os.Exit(2)
		}
	}
	var cfg *rest.Config
	var err error
	if *kubeconfig != "" {
		cfg, err = clientcmd.BuildConfigFromFlags("", *kubeconfig)
	} else {
		cfg, err = rest.InClusterConfig()
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "kubeconfig: %v\n", err)
		os.Exit(1)
	}
	c, err := dynamic.NewForConfig(cfg)
	if err != nil {
		fmt.Fprintf(os.Stderr, "client: %v\n", err)
		os.Exit(1)
	}
	ctx, cancel := context.WithTimeout(context.Background(), *timeout)
	defer cancel()
	if *remove {
		err = register.Remove(ctx, c, *namespace, *name, b.Name)
	} else {
		err = register.Add(ctx, c, *namespace, *name, b)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	what := "registered in"
	if *remove {
		what = "removed from"
	}
	fmt.Printf("binding %q %s KubeVirt %s/%s\n", b.Name, what, *namespace, *name)
}
