package e2e

import (
	"reflect"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"
)

func TestTheMockDriversPodsGetTheHostNetworkAndTheApiserver(t *testing.T) {
	in := `apiVersion: v1
kind: ServiceAccount
metadata:
  name: csi-mock
---
kind: StatefulSet
apiVersion: apps/v1
metadata:
  name: csi-mockplugin
spec:
  template:
    spec:
      containers:
        - name: csi-provisioner
          image: registry.k8s.io/sig-storage/csi-provisioner:v6.1.1
          imagePullPolicy: Always
          securityContext:
            privileged: true
          env:
            - name: ADDRESS
              value: /csi/csi.sock
        - name: mock
          image: registry.k8s.io/sig-storage/hostpathplugin:v1.17.1
`
	out, err := patchDocuments([]byte(in), "127.0.0.1:6443")
	if err != nil {
		t.Fatal(err)
	}
	docs := strings.Split(string(out), "\n---\n")
	if len(docs) != 2 || !strings.Contains(docs[0], "kind: ServiceAccount") || strings.Contains(docs[0], "hostNetwork") {
		t.Fatalf("the ServiceAccount must pass unchanged:\n%s", out)
	}
	var set struct {
		Spec struct {
			Template struct {
				Spec struct {
					HostNetwork bool `json:"hostNetwork"`
					Containers  []struct {
						Name            string         `json:"name"`
						ImagePullPolicy string         `json:"imagePullPolicy"`
						SecurityContext map[string]any `json:"securityContext"`
						Env             []struct{ Name, Value string }
					} `json:"containers"`
				} `json:"spec"`
			} `json:"template"`
		} `json:"spec"`
	}
	if err := yaml.Unmarshal([]byte(docs[1]), &set); err != nil {
		t.Fatal(err)
	}
	spec := set.Spec.Template.Spec
	if !spec.HostNetwork || len(spec.Containers) != 2 {
		t.Fatalf("not on the host's network: %+v", spec)
	}
	for _, c := range spec.Containers {
		env := map[string]string{}
		for _, e := range c.Env {
			env[e.Name] = e.Value
		}
		if c.ImagePullPolicy != "IfNotPresent" || env["KUBERNETES_SERVICE_HOST"] != "127.0.0.1" || env["KUBERNETES_SERVICE_PORT"] != "6443" {
			t.Errorf("%s: pull policy %q, env %v", c.Name, c.ImagePullPolicy, env)
		}
		// The manifests' own security contexts, untouched.
		want := map[string]any(nil)
		if c.Name == "csi-provisioner" {
			want = map[string]any{"privileged": true}
		}
		if !reflect.DeepEqual(c.SecurityContext, want) {
			t.Errorf("%s: securityContext %v, the manifest says %v", c.Name, c.SecurityContext, want)
		}
	}
	if _, err := patchDocuments([]byte(in), "no-port"); err == nil {
		t.Error("an apiserver address without a port must be refused")
	}
}
