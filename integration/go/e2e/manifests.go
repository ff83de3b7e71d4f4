package e2e

import (
	"bytes"
	"fmt"
	"net"
	"strings"

	"k8s.io/kubernetes/test/e2e/framework/testfiles"
	"sigs.k8s.io/yaml"
)

// worldManifests hands out the manifests of `inner`, with the mock driver's
// (storage-csi/mock/) changed for this test world: its pods use the host's
// network and find the apiserver at `apiserver` (a pod of its own network
// namespace has nothing but its own loopback here, and no Service reaches
// the apiserver), and their images are never pulled (they are imported
// into the node's containerd under the manifests' references).
type worldManifests struct {
	inner     testfiles.FileSource
	apiserver string // host:port
}

func (w worldManifests) ReadTestFile(path string) ([]byte, error) {
	data, err := w.inner.ReadTestFile(path)
	if err != nil || data == nil || !strings.Contains(path, "storage-csi/mock/") || !strings.HasSuffix(path, ".yaml") {
		return data, err
	}
	out, err := patchDocuments(data, w.apiserver)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return out, nil
}

func (w worldManifests) DescribeFiles() string {
	return w.inner.DescribeFiles() + " (the mock driver's pods on the host's network, images never pulled)"
}

// patchDocuments applies patchPodSpec to the pod template of every
// workload in a multi-document YAML file.
func patchDocuments(data []byte, apiserver string) ([]byte, error) {
	host, port, err := net.SplitHostPort(apiserver)
	if err != nil {
		return nil, fmt.Errorf("the apiserver address %q: %w", apiserver, err)
	}
	var out [][]byte
	for _, doc := range bytes.Split(data, []byte("\n---")) {
		var obj map[string]any
		if err := yaml.Unmarshal(doc, &obj); err != nil {
			return nil, err
		}
		spec, ok := podSpecOf(obj)
		if !ok {
			out = append(out, doc)
			continue
		}
		patchPodSpec(spec, host, port)
		patched, err := yaml.Marshal(obj)
		if err != nil {
			return nil, err
		}
		out = append(out, patched)
	}
	return bytes.Join(out, []byte("\n---\n")), nil
}

// podSpecOf is the pod spec of a StatefulSet, DaemonSet, Deployment or Pod.
func podSpecOf(obj map[string]any) (map[string]any, bool) {
	switch obj["kind"] {
	case "StatefulSet", "DaemonSet", "Deployment":
		spec, _ := obj["spec"].(map[string]any)
		template, _ := spec["template"].(map[string]any)
		podSpec, ok := template["spec"].(map[string]any)
		return podSpec, ok
	case "Pod":
		podSpec, ok := obj["spec"].(map[string]any)
		return podSpec, ok
	}
	return nil, false
}

// patchPodSpec: the host's network, the apiserver's address for in-cluster
// clients (it wins over the Service variables the kubelet sets), images
// used as imported. Nothing else changes: the containers keep their users
// and security contexts (csi-sidecar's image runs as root, as upstream's).
func patchPodSpec(spec map[string]any, host, port string) {
	spec["hostNetwork"] = true
	containers, _ := spec["containers"].([]any)
	for _, c := range containers {
		container, ok := c.(map[string]any)
		if !ok {
			continue
		}
		env, _ := container["env"].([]any)
		env = append(env,
			map[string]any{"name": "KUBERNETES_SERVICE_HOST", "value": host},
			map[string]any{"name": "KUBERNETES_SERVICE_PORT", "value": port})
		container["env"] = env
		container["imagePullPolicy"] = "IfNotPresent"
	}
}
