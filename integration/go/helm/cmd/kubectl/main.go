// Command kubectl is upstream kubectl: the same main as
// k8s.io/kubernetes/cmd/kubectl/kubectl.go, built against the k8s.io/kubectl
// staging module that helm requires (so it needs no k8s.io/kubernetes
// replace directives). integration/scripts/check-manifests.sh uses it for
// server-side dry-run applies against the test control plane.
package main

import (
	"k8s.io/component-base/cli"
	"k8s.io/kubectl/pkg/cmd"
	"k8s.io/kubectl/pkg/cmd/util"

	// Client auth plugins, as upstream kubectl.
	_ "k8s.io/client-go/plugin/pkg/client/auth"
)

func main() {
	command := cmd.NewDefaultKubectlCommand()
	if err := cli.RunNoErrOutput(command); err != nil {
		util.CheckErr(err)
	}
}
