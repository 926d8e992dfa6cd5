// Command vhostmq-install-cni puts the vhostmq CNI plugin on the node: it
// copies the plugin binary into the host's CNI bin directory and writes
// the kubeconfig the plugin reads pod annotations with: a short-lived
// token of the plugin's own service account (--service-account, see
// token.go), else the pod's own token. With --watch it keeps the token
// fresh, as Multus does for its own kubeconfig, and with --daemonset it
// removes what it and the node agent put on the node when the release is
// uninstalled (see uninstall.go).
package main

import (
	"bytes"
	"context"
	"crypto/sha256"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	"github.com/vhostmq/vhostmq/internal/atomicfile"
)

// saDir is the pod's service account mount (a variable for the tests).
var saDir = "/var/run/secrets/kubernetes.io/serviceaccount"

func main() {
	src := flag.String("plugin", "/usr/local/bin/vhostmq-cni", "the plugin binary to install")
	binDir := flag.String("cni-bin-dir", "/host/opt/cni/bin", "the host's CNI bin directory, as mounted")
	confDir := flag.String("kubeconfig-dir", "/host/etc/cni/net.d/vhostmq.d", "where the plugin's kubeconfig goes, as mounted")
	hostConfDir := flag.String("host-kubeconfig-dir", "/etc/cni/net.d/vhostmq.d", "the same directory as the host (the plugin) sees it")
	watch := flag.Bool("watch", false, "keep running and refresh the token every --interval")
	interval := flag.Duration("interval", time.Minute, "token refresh period with --watch")
	daemonSet := flag.String("daemonset", "", "with --watch: the DaemonSet running this pod; when it is gone at SIGTERM (helm uninstall), remove the plugin, its kubeconfig and the agent's empty state")
	stateDir := flag.String("state-dir", "", "the node agent's state directory, as mounted (with --daemonset)")
	agentSock := flag.String("agent-socket", "", "the node agent's API socket, as mounted (with --daemonset)")
	socketRoot := flag.String("socket-root", "", "the socket root directory, as mounted (with --daemonset; removed when empty)")
	agentWait := flag.Duration("agent-wait", 8*time.Second, "with --daemonset: how long to wait at uninstall for the node agent to stop")
	serviceAccount := flag.String("service-account", "", "the service account (in this pod's namespace) whose short-lived token the plugin gets, minted with the TokenRequest API; empty: this pod's own token, with this pod's rights")
	tokenTTL := flag.Duration("token-ttl", minTokenTTL, "with --service-account: the token's lifetime (at least 10m); renewed at half of it")
	flag.Parse()
	log := slog.New(slog.NewJSONHandler(os.Stderr, nil))
	if err := install(*src, *binDir); err != nil {
		log.Error("installing the CNI plugin", "err", err)
		os.Exit(1)
	}
	token := ownToken
	if *serviceAccount != "" {
		ns, err := ownNamespace()
		if err != nil {
			log.Error("reading this pod's namespace", "err", err)
			os.Exit(1)
		}
		m, err := newMinter(ns, *serviceAccount, *tokenTTL)
		if err != nil {
			log.Error("the CNI plugin's token", "err", err)
			os.Exit(1)
		}
		token = m.token
	}
	refresh := func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
		defer cancel()
		tok, err := token(ctx)
		if err != nil {
			return err
		}
		return writeKubeconfig(*confDir, *hostConfDir, tok)
	}
	if err := refresh(); err != nil {
		log.Error("writing the CNI kubeconfig", "err", err)
		os.Exit(1)
	}
	log.Info("CNI plugin installed", "binary", filepath.Join(*binDir, filepath.Base(*src)), "kubeconfig", filepath.Join(*hostConfDir, "vhostmq.kubeconfig"),
		"serviceAccount", *serviceAccount)
	if !*watch {
		return
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	t := time.NewTicker(*interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			if *daemonSet != "" {
				onTermination(*daemonSet, nodePaths{
					binDir: *binDir, plugin: filepath.Base(*src), confDir: *confDir,
					stateDir: *stateDir, agentSock: *agentSock, socketRoot: *socketRoot,
					agentWait: *agentWait, agentPoll: 100 * time.Millisecond,
				}, log)
			}
			return
		case <-t.C:
			if err := refresh(); err != nil {
				log.Error("refreshing the CNI kubeconfig", "err", err)
			}
		}
	}
}

// writeAtomic replaces path with data (temp file, fsync, rename) unless
// it already holds exactly data.
func writeAtomic(path string, data []byte, mode os.FileMode) error {
	if old, err := os.ReadFile(path); err == nil && bytes.Equal(old, data) {
		return nil
	}
	return atomicfile.WriteBytes(path, data, mode, true)
}

// install copies the binary: a running ADD keeps the old inode. It
// streams (the plugin is tens of MB and the container's memory limit is
// small) and leaves an identical file alone.
func install(src, binDir string) error {
	if err := os.MkdirAll(binDir, 0o755); err != nil {
		return err
	}
	dst := filepath.Join(binDir, filepath.Base(src))
	if same, err := sameContent(src, dst); err != nil {
		return err
	} else if same {
		return nil
	}
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	return atomicfile.Write(dst, in, 0o755, true)
}

// sameContent reports whether b exists with a's size and SHA-256.
func sameContent(a, b string) (bool, error) {
	fa, err := os.Stat(a)
	if err != nil {
		return false, err
	}
	fb, err := os.Stat(b)
	if err != nil || fb.Size() != fa.Size() || !fb.Mode().IsRegular() {
		return false, nil
	}
	ha, err := fileSHA256(a)
	if err != nil {
		return false, err
	}
	hb, err := fileSHA256(b)
	if err != nil {
		return false, nil
	}
	return bytes.Equal(ha, hb), nil
}

func fileSHA256(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return nil, err
	}
	return h.Sum(nil), nil
}

// writeKubeconfig writes the kubeconfig, its token and the API server's
// CA, each only if it changed.
func writeKubeconfig(dir, hostDir string, token []byte) error {
	host, port := os.Getenv("KUBERNETES_SERVICE_HOST"), os.Getenv("KUBERNETES_SERVICE_PORT")
	if host == "" || port == "" {
		return fmt.Errorf("KUBERNETES_SERVICE_HOST/PORT not set: not running in a pod")
	}
	ca, err := os.ReadFile(filepath.Join(saDir, "ca.crt"))
	if err != nil {
		return err
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	if err := writeAtomic(filepath.Join(dir, "ca.crt"), ca, 0o600); err != nil {
		return err
	}
	if err := writeAtomic(filepath.Join(dir, "token"), token, 0o600); err != nil {
		return err
	}
	kc := fmt.Sprintf(`# written by vhostmq-install-cni; the token is refreshed
apiVersion: v1
kind: Config
clusters:
- name: local
  cluster:
    server: https://%s
    certificate-authority: %s/ca.crt
users:
- name: vhostmq-cni
  user:
    tokenFile: %s/token
contexts:
- name: vhostmq-cni
  context: {cluster: local, user: vhostmq-cni}
current-context: vhostmq-cni
`, net.JoinHostPort(host, port), hostDir, hostDir)
	return writeAtomic(filepath.Join(dir, "vhostmq.kubeconfig"), []byte(kc), 0o600)
}
