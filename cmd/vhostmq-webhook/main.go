// Command vhostmq-webhook is vhostmq's mutating admission webhook for
// pods (see package webhook): pods that attach vhostmq networks get their
// vhostmq.io/queue-pairs request filled in.
package main

import (
	"context"
	"crypto/tls"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/vhostmq/vhostmq/cni/kubevirt/podnet"
	"github.com/vhostmq/vhostmq/cni/kubevirt/webhook"
)

func main() {
	listen := flag.String("listen", ":8443", "HTTPS address")
	certFile := flag.String("tls-cert-file", "/etc/vhostmq-webhook/tls.crt", "serving certificate (re-read when it changes)")
	keyFile := flag.String("tls-key-file", "/etc/vhostmq-webhook/tls.key", "its key")
	kubeconfig := flag.String("kubeconfig", "", "kubeconfig; empty = in-cluster")
	resourceName := flag.String("resource-name", "vhostmq.io/queue-pairs", "the device plugin's resource")
	level := flag.String("log-level", "info", "debug, info, warn or error")
	flag.Parse()
	var lv slog.Level
	if err := lv.UnmarshalText([]byte(*level)); err != nil {
		fmt.Fprintf(os.Stderr, "--log-level: %v\n", err)
		os.Exit(2)
	}
	log := slog.New(slog.NewJSONHandler(os.Stderr, &slog.HandlerOptions{Level: lv}))
	if err := run(log, *listen, *certFile, *keyFile, *kubeconfig, *resourceName); err != nil {
		log.Error("webhook failed", "err", err)
		os.Exit(1)
	}
}

func run(log *slog.Logger, listen, certFile, keyFile, kubeconfig, resourceName string) error {
	var rc *rest.Config
	var err error
	if kubeconfig != "" {
		rc, err = clientcmd.BuildConfigFromFlags("", kubeconfig)
	} else {
		rc, err = rest.InClusterConfig()
	}
	if err != nil {
		return fmt.Errorf("kubeconfig: %w", err)
	}
	rc.UserAgent = "vhostmq-webhook"
	dc, err := dynamic.NewForConfig(rc)
	if err != nil {
		return err
	}
	certs := &webhook.CertReloader{CertFile: certFile, KeyFile: keyFile}
	if _, err := certs.GetCertificate(nil); err != nil {
		return fmt.Errorf("--tls-cert-file/--tls-key-file: %w", err)
	}
	mux := http.NewServeMux()
	mux.Handle("/mutate", &webhook.Handler{Rule: &webhook.Rule{ResourceName: resourceName, Lookup: &podnet.ClusterLookup{Client: dc}}, Log: log})
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { fmt.Fprintln(w, "ok") })
	srv := &http.Server{Addr: listen, Handler: mux, ReadHeaderTimeout: 10 * time.Second,
		TLSConfig: &tls.Config{MinVersion: tls.VersionTLS12, GetCertificate: certs.GetCertificate}}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	go func() {
		<-ctx.Done()
		sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		srv.Shutdown(sctx)
	}()
	log.Info("webhook listening", "address", listen, "resource", resourceName)
	if err := srv.ListenAndServeTLS("", ""); !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}
