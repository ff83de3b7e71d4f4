// Command hollow-node runs one real kubelet (Kubernetes' kubemark hollow
// node, k8s.io/kubernetes/pkg/kubemark) for the csi-sidecar test world: the
// kubelet's own main loop, volume manager, CSI volume plugin and plugin
// manager, with a fake container runtime (an in-process CRI server on a unix
// socket in the root directory), a fake image service and a fake mounter.
//
// Differences from kubemark's own main (cmd/kubemark), which picks a random
// root directory under /tmp and serves the kubelet API on all interfaces
// without authentication:
//
//   - --root-dir DIR is the kubelet's root directory (created if missing):
//     plugin registration in DIR/plugins_registry, CSI staging and publish
//     paths under DIR/plugins and DIR/pods, the CRI socket DIR/cri.sock,
//     static pods and pod logs inside it. kubemark's helper still creates a
//     temporary directory under /tmp; it is removed at once.
//   - the kubelet API server is off (nothing here needs exec or logs), so
//     no port is opened; kubemark's RunKubelet serves no healthz either: the
//     Node's Ready condition is the readiness check.
//   - attach/detach is controller-managed by default (the attach-detach
//     controller of kube-controller-manager creates the VolumeAttachments),
//     as on a normal node; --kubelet-attach gives kubemark's kubelet-side attach.
//
// Flags:
//
//	--kubeconfig FILE      the kubelet's credentials (required)
//	--name NAME            node name (default hollow-node)
//	--root-dir DIR         the kubelet's root directory (required)
//	--node-labels k=v,...  extra node labels
//	--max-pods N           default 110
//	--kubelet-attach       kubelet-side attach instead of the controller's
//	-v N                   klog verbosity
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"go.opentelemetry.io/otel/trace/noop"
	clientset "k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	remote "k8s.io/cri-client/pkg"
	fakeremote "k8s.io/cri-client/pkg/fake"
	"k8s.io/klog/v2"
	cadvisortest "k8s.io/kubernetes/pkg/kubelet/cadvisor/testing"
	"k8s.io/kubernetes/pkg/kubelet/cm"
	"k8s.io/kubernetes/pkg/kubemark"
)

func main() {
	klog.InitFlags(nil)
	var (
		kubeconfig    = flag.String("kubeconfig", "", "kubeconfig of the kubelet (required)")
		name          = flag.String("name", "hollow-node", "node name")
		rootDir       = flag.String("root-dir", "", "the kubelet's root directory (required)")
		nodeLabels    = flag.String("node-labels", "", "extra node labels k=v,k2=v2")
		maxPods       = flag.Int("max-pods", 110, "pods this node accepts")
		kubeletAttach = flag.Bool("kubelet-attach", false, "the kubelet attaches volumes itself (kubemark's default) instead of the attach-detach controller")
	)
	flag.Parse()
	if err := run(*kubeconfig, *name, *rootDir, *nodeLabels, *maxPods, *kubeletAttach); err != nil {
		fmt.Fprintf(os.Stderr, "hollow-node: %v\n", err)
		os.Exit(1)
	}
}

func parseLabels(s string) (map[string]string, error) {
	labels := map[string]string{}
	for _, kv := range strings.Split(s, ",") {
		if kv == "" {
			continue
		}
		k, v, ok := strings.Cut(kv, "=")
		if !ok || k == "" {
			return nil, fmt.Errorf("--node-labels: %q is not k=v", kv)
		}
		labels[k] = v
	}
	return labels, nil
}

func run(kubeconfig, name, rootDir string, nodeLabels string, maxPods int, kubeletAttach bool) error {
	if kubeconfig == "" || rootDir == "" {
		return fmt.Errorf("--kubeconfig and --root-dir are required")
	}
	labels, err := parseLabels(nodeLabels)
	if err != nil {
		return err
	}
	root, err := filepath.Abs(rootDir)
	if err != nil {
		return err
	}
	for _, d := range []string{root, filepath.Join(root, "static-pods"), filepath.Join(root, "pod-logs")} {
		if err := os.MkdirAll(d, 0o750); err != nil {
			return err
		}
	}
	criSocket := filepath.Join(root, "cri.sock")
	if len(criSocket) > 100 {
		return fmt.Errorf("--root-dir %s is too long for a unix socket path inside it", root)
	}
	_ = os.Remove(criSocket)

	loaded, err := clientcmd.LoadFromFile(kubeconfig)
	if err != nil {
		return fmt.Errorf("--kubeconfig: %w", err)
	}
	restConfig, err := clientcmd.NewDefaultClientConfig(*loaded, &clientcmd.ConfigOverrides{}).ClientConfig()
	if err != nil {
		return fmt.Errorf("--kubeconfig: %w", err)
	}
	restConfig.UserAgent = "hollow-kubelet"
	restConfig.ContentType = "application/vnd.kubernetes.protobuf"
	restConfig.QPS, restConfig.Burst = 50, 100
	client, err := clientset.NewForConfig(restConfig)
	if err != nil {
		return err
	}

	f, c := kubemark.GetHollowKubeletConfig(&kubemark.HollowKubeletOptions{
		NodeName: name, KubeletPort: 0, KubeletReadOnlyPort: 0, MaxPods: maxPods, NodeLabels: labels,
	})
	// kubemark's helper made a random directory under /tmp: not ours to keep.
	if strings.HasPrefix(f.RootDirectory, "/tmp/hollow-kubelet.") {
		_ = os.RemoveAll(f.RootDirectory)
	}
	f.RootDirectory = root
	c.StaticPodPath = filepath.Join(root, "static-pods")
	c.PodLogsDir = filepath.Join(root, "pod-logs")
	c.EnableServer = false
	c.Address = "127.0.0.1"
	c.HealthzBindAddress = "127.0.0.1"
	c.HealthzPort = 0
	c.EnableControllerAttachDetach = !kubeletAttach
	// Tests wait on the node's state: report it often.
	c.NodeStatusUpdateFrequency.Duration = 2 * time.Second
	c.SyncFrequency.Duration = 2 * time.Second
	c.FileCheckFrequency.Duration = time.Hour

	heartbeat := *restConfig
	heartbeat.Timeout = c.NodeStatusUpdateFrequency.Duration
	heartbeat.QPS = -1
	heartbeatClient, err := clientset.NewForConfig(&heartbeat)
	if err != nil {
		return err
	}

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	endpoint := "unix://" + criSocket
	runtime := fakeremote.NewFakeRemoteRuntime()
	if err := runtime.Start(endpoint); err != nil {
		return fmt.Errorf("fake CRI on %s: %w", criSocket, err)
	}
	defer runtime.Stop()
	runtimeService, err := remote.NewRemoteRuntimeService(ctx, endpoint, 15*time.Second, noop.NewTracerProvider(), false)
	if err != nil {
		return fmt.Errorf("runtime service: %w", err)
	}
	klog.InfoS("Starting hollow kubelet", "node", name, "rootDir", root,
		"controllerAttachDetach", c.EnableControllerAttachDetach)
	hollow := kubemark.NewHollowKubelet(f, c, client, heartbeatClient, &cadvisortest.Fake{NodeName: name},
		runtime.ImageService, runtimeService, cm.NewStubContainerManager())
	go hollow.Run(ctx)
	<-ctx.Done()
	klog.InfoS("Stopping hollow kubelet", "node", name)
	_ = os.Remove(criSocket)
	return nil
}
