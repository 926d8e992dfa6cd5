//go:build e2e

package libpod

import (
	"encoding/json"
	"strconv"

	corev1 "k8s.io/api/core/v1"
)

// QEMUUser is the user and group QEMU runs as in the pod (KubeVirt's qemu,
// 107): the serial-log folder must be writable by it.
const QEMUUser = 107

// QEMU is a test guest (hack/guest: its /init takes vmq.* keys from the
// kernel command line and prints VHOSTMQ-RESULT lines on its serial
// console) that the pod runs under the host's QEMU, the way KubeVirt's
// virt-launcher runs a VM: TCG, one vCPU, memfd memory shared with the
// backend, one virtio-net-pci NIC on a vhost-user socket that QEMU
// listens on (server=on,wait=off: the dataplane dials). The container (the
// busybox image, uid 107) mounts the host's /usr, /lib and /lib64
// read-only and runs /usr/bin/qemu-system-x86_64 from there. Usually made
// by framework.Framework.QEMU, which fills ImageDir and OutDir.
type QEMU struct {
	// Name is the guest's name: vmq.name, and its serial log
	// OutDir/serial-<Name>.log (framework.Guest reads it).
	Name string
	// Args are more kernel command line words: vmq.ip=..., vmq.role=...
	Args string
	// ImageDir is the host folder with vmlinux and initramfs.cpio.gz
	// (hack/guest/build.sh's output).
	ImageDir string
	// OutDir is the host folder the serial log goes to, writable by
	// QEMUUser (framework.Framework.GuestDir makes one).
	OutDir string
	// NIC says where QEMU finds its vhost-user socket and MAC.
	NIC NIC
	// Queues is the NIC's queue pairs (vmq.queues too); 0: as many as the
	// pod's VHOSTMQ_QUEUE_SLOTS lists.
	Queues int
	// MemoryMiB is the guest's memory; 0: 256.
	MemoryMiB int
}

// NIC is where the launcher finds the vhost-user socket and the MAC; make
// one with NICFromNetworkStatus, NICFromDRAMetadata or NICAt.
type NIC struct {
	from, iface, file, socket, mac string
}

// NICFromNetworkStatus: the socket (device-info vhost-user path) and MAC
// of iface in the pod's k8s.v1.cni.cncf.io/network-status annotation, read
// through the downward API (mounted at /etc/podinfo), as virt-launcher
// reads them from Multus. The launcher waits up to 60 s for the
// annotation.
func NICFromNetworkStatus(iface string) NIC { return NIC{from: "network-status", iface: iface} }

// NICFromDRAMetadata: the socket from a DRA device metadata file in the
// container (KEP-5304: the vhost-user-path attribute of the first device
// of the first request), read with the host's jq; the MAC is mac. The
// launcher waits up to 30 s for the file.
func NICFromDRAMetadata(file, mac string) NIC { return NIC{from: "dra-metadata", file: file, mac: mac} }

// NICAt: a socket path (in the container) and MAC known in advance.
func NICAt(socket, mac string) NIC { return NIC{from: "env", socket: socket, mac: mac} }

// launcher is the container's command: it finds the NIC's socket and MAC,
// prints one "launch:" line (framework.Framework.QEMULaunch parses it),
// starts QEMU with the serial console in /out and stops it on SIGTERM.
const launcher = `PATH=/bin:/usr/bin
i=0
case $VMQ_NIC_FROM in
network-status)
    ann=/etc/podinfo/annotations
    until grep -q '^k8s.v1.cni.cncf.io/network-status=' "$ann"; do
        i=$((i + 1))
        [ $i -le 600 ] || { echo "launch: no network-status in $ann after 60 s"; exit 1; }
        sleep 0.1
    done
    st=$(sed -n 's/^k8s.v1.cni.cncf.io\/network-status="\(.*\)"$/\1/p' "$ann" | sed 's/\\"/"/g')
    rest=${st#*"\"interface\":\"$VMQ_NIC_IFACE\""}
    [ "$rest" != "$st" ] || { echo "launch: no $VMQ_NIC_IFACE in network-status: $st"; exit 1; }
    m=${rest#*'"mac":"'}
    mac=${m%%\"*}
    p=${rest#*'"path":"'}
    sock=${p%%\"*}
    ;;
dra-metadata)
    until [ -s "$VMQ_NIC_FILE" ]; do
        i=$((i + 1))
        [ $i -le 300 ] || { echo "launch: no metadata file $VMQ_NIC_FILE after 30 s"; exit 1; }
        sleep 0.1
    done
    sock=$(jq -rn 'first(inputs) | .requests[0].devices[0].attributes["vhost-user-path"].string' <"$VMQ_NIC_FILE")
    mac=$VMQ_NIC_MAC
    ;;
*)
    sock=$VMQ_NIC_SOCKET mac=$VMQ_NIC_MAC
    ;;
esac
q=${VMQ_QUEUES:-0}
[ "$q" -gt 0 ] || q=$(echo "$VHOSTMQ_QUEUE_SLOTS" | tr ',' '\n' | grep -c .)
echo "launch: nic=$VMQ_NIC_FROM iface=$VMQ_NIC_IFACE mac=$mac socket=$sock queues=$q slots=$VHOSTMQ_QUEUE_SLOTS polls=$i"
mq=on
[ "$q" -gt 1 ] || mq=off
/usr/bin/qemu-system-x86_64 -accel tcg -machine q35 -m "$VMQ_MEM" -smp 1 \
    -nodefaults -display none -monitor none -no-reboot \
    -object "memory-backend-memfd,id=mem0,size=${VMQ_MEM}M,share=on" -numa node,memdev=mem0 \
    -kernel /guest/vmlinux -initrd /guest/initramfs.cpio.gz \
    -append "console=ttyS0 panic=-1 loglevel=4 vmq.name=$GUEST_NAME vmq.queues=$q $GUEST_ARGS" \
    -chardev "socket,id=c0,path=$sock,server=on,wait=off" \
    -netdev "vhost-user,id=n0,chardev=c0,queues=$q" \
    -device "virtio-net-pci,netdev=n0,mac=$mac,mq=$mq,vectors=0" \
    -serial "file:/out/serial-$GUEST_NAME.log" &
pid=$!
trap 'kill -TERM $pid; wait $pid; echo "launch: QEMU exited ($?) on SIGTERM"; exit 0' TERM
wait $pid
echo "launch: QEMU exited: $?"
`

// WithQEMU makes the pod's container (renamed "qemu") run q: the launcher
// as its command, uid/gid QEMUUser, the host folders mounted, a 10 s grace
// period for QEMU to stop. vectors=0 on the NIC: QEMU + TCG + vhost-user +
// MSI-X can crash otherwise (see hack/lib.sh's vmq_guest_start).
func WithQEMU(q QEMU) Option {
	return func(p *corev1.Pod) {
		mem := q.MemoryMiB
		if mem == 0 {
			mem = 256
		}
		uid := int64(QEMUUser)
		grace := int64(10)
		p.Spec.TerminationGracePeriodSeconds = &grace
		if p.Spec.SecurityContext == nil {
			p.Spec.SecurityContext = &corev1.PodSecurityContext{}
		}
		p.Spec.SecurityContext.RunAsUser, p.Spec.SecurityContext.RunAsGroup = &uid, &uid
		c := &p.Spec.Containers[0]
		c.Name = "qemu"
		c.Command = []string{"/bin/sh", "-c", launcher}
		c.Env = append(c.Env,
			corev1.EnvVar{Name: "GUEST_NAME", Value: q.Name},
			corev1.EnvVar{Name: "GUEST_ARGS", Value: q.Args},
			corev1.EnvVar{Name: "VMQ_MEM", Value: strconv.Itoa(mem)},
			corev1.EnvVar{Name: "VMQ_QUEUES", Value: strconv.Itoa(q.Queues)},
			corev1.EnvVar{Name: "VMQ_NIC_FROM", Value: q.NIC.from},
			corev1.EnvVar{Name: "VMQ_NIC_IFACE", Value: q.NIC.iface},
			corev1.EnvVar{Name: "VMQ_NIC_FILE", Value: q.NIC.file},
			corev1.EnvVar{Name: "VMQ_NIC_SOCKET", Value: q.NIC.socket},
			corev1.EnvVar{Name: "VMQ_NIC_MAC", Value: q.NIC.mac},
		)
		dir := corev1.HostPathDirectory
		host := func(name, path, at string, ro bool, t *corev1.HostPathType) {
			p.Spec.Volumes = append(p.Spec.Volumes, corev1.Volume{Name: name,
				VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: path, Type: t}}})
			c.VolumeMounts = append(c.VolumeMounts, corev1.VolumeMount{Name: name, MountPath: at, ReadOnly: ro})
		}
		host("usr", "/usr", "/usr", true, &dir)
		host("lib", "/lib", "/lib", true, nil)
		host("lib64", "/lib64", "/lib64", true, nil)
		host("guest", q.ImageDir, "/guest", true, &dir)
		host("out", q.OutDir, "/out", false, &dir)
		if q.NIC.from == "network-status" {
			p.Spec.Volumes = append(p.Spec.Volumes, corev1.Volume{Name: "podinfo", VolumeSource: corev1.VolumeSource{
				DownwardAPI: &corev1.DownwardAPIVolumeSource{Items: []corev1.DownwardAPIVolumeFile{{
					Path: "annotations", FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.annotations"}}}}}})
			c.VolumeMounts = append(c.VolumeMounts, corev1.VolumeMount{Name: "podinfo", MountPath: "/etc/podinfo", ReadOnly: true})
		}
	}
}

// NetworkSelection is one entry of the JSON form of the
// k8s.v1.cni.cncf.io/networks annotation (Multus' NetworkSelectionElement:
// the fields the test cluster's multus-lite reads).
type NetworkSelection struct {
	Name      string `json:"name"`
	Namespace string `json:"namespace,omitempty"`
	Interface string `json:"interface,omitempty"`
	MAC       string `json:"mac,omitempty"`
}

// WithNetworkSelections sets the k8s.v1.cni.cncf.io/networks annotation to
// the JSON form of sel (replacing what WithNetwork added).
func WithNetworkSelections(sel ...NetworkSelection) Option {
	b, err := json.Marshal(sel)
	if err != nil {
		panic(err) // strings only: cannot happen
	}
	return WithAnnotation(networksAnnotation, string(b))
}
