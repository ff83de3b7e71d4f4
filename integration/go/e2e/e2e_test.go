// Package e2e is Kubernetes' storage e2e suite (k8s.io/kubernetes/test/e2e:
// the "CSI Mock" specs and the external testsuites) built as one test
// binary to run against csi-sidecar on this project's test world. Its
// differences from Kubernetes' own e2e.test: the files under --repo-root
// are read before the manifests built into the binary (e2e.test reads them
// after), and the mock driver's manifests are changed as this world needs
// (manifests.go, with --csi-sidecar.apiserver).
package e2e

import (
	"flag"
	"fmt"
	"os"
	"testing"

	"k8s.io/kubernetes/test/e2e"
	"k8s.io/kubernetes/test/e2e/framework"
	"k8s.io/kubernetes/test/e2e/framework/config"
	"k8s.io/kubernetes/test/e2e/framework/testfiles"
	testingmanifests "k8s.io/kubernetes/test/e2e/testing-manifests"

	_ "k8s.io/kubernetes/test/e2e/framework/debug/init"
	_ "k8s.io/kubernetes/test/e2e/framework/node/init"
	_ "k8s.io/kubernetes/test/e2e/storage"
	_ "k8s.io/kubernetes/test/e2e/storage/csimock"
	_ "k8s.io/kubernetes/test/e2e/storage/external"
)

var apiserver = flag.String("csi-sidecar.apiserver", "", "host:port of the apiserver, for the mock driver's pods (their in-cluster configuration)")

func TestMain(m *testing.M) {
	config.CopyFlags(config.Flags, flag.CommandLine)
	framework.RegisterCommonFlags(flag.CommandLine)
	framework.RegisterClusterFlags(flag.CommandLine)
	flag.Parse()
	if flag.NArg() > 0 {
		fmt.Fprintf(os.Stderr, "unknown arguments: %q\n", flag.Args())
		os.Exit(2)
	}
	framework.AfterReadingAllFlags(&framework.TestContext)
	if root := framework.TestContext.RepoRoot; root != "" {
		testfiles.AddFileSource(testfiles.RootFileSource{Root: root})
	}
	var builtIn testfiles.FileSource = testingmanifests.GetE2ETestingManifestsFS()
	if *apiserver != "" {
		builtIn = worldManifests{inner: builtIn, apiserver: *apiserver}
	}
	testfiles.AddFileSource(builtIn)
	os.Exit(m.Run())
}

func TestE2E(t *testing.T) {
	e2e.RunE2ETests(t)
}
