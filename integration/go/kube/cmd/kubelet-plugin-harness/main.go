// Command kubelet-plugin-harness runs the kubelet's own plugin manager
// (k8s.io/kubernetes/pkg/kubelet/pluginmanager: the plugin watcher plus the
// registration reconciler) on a directory, with a handler for plugin type
// "CSIPlugin" that only records what the kubelet would do. It stands in for the
// kubelet when testing a node-driver-registrar implementation.
//
// Flags:
//
//	--dir DIR                 plugin registration directory to watch (created if
//	                          missing; the kubelet's is /var/lib/kubelet/plugins_registry)
//	--reject-validation       ValidatePlugin returns an error, so the plugin
//	                          manager sends NotifyRegistrationStatus(false, ...)
//	--reject-registration     RegisterPlugin returns an error (validation passes),
//	                          so the plugin manager sends NotifyRegistrationStatus(false, ...)
//	-v N                      klog verbosity of the plugin manager's own logs (stderr)
//
// Output: one JSON object per line on stdout, flushed after every line:
//
//	{"event":"started","dir":"..."}    before the plugin manager starts; sockets
//	                                   created from now on (or already present)
//	                                   are picked up
//	{"event":"validate","name":"...","endpoint":"...","versions":["1.0.0"]}
//	{"event":"register","name":"...","endpoint":"...","versions":["1.0.0"]}
//	{"event":"deregister","name":"...","endpoint":"..."}
//	{"event":"stopped"}                on SIGTERM/SIGINT, before exiting 0
//
// "validate" and "register" carry "rejected":true and "error" when the
// corresponding --reject-* option is set. The plugin manager calls
// GetInfo on a new socket, then ValidatePlugin, RegisterPlugin and
// NotifyRegistrationStatus(true); it calls DeRegisterPlugin when a registered
// socket is removed. Its reconciler runs every second, so expect up to ~1 s of
// delay. Plugins of other types get NotifyRegistrationStatus(false) from the
// plugin manager itself and produce no line here.
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"sync"
	"syscall"
	"time"

	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/client-go/tools/record"
	"k8s.io/klog/v2"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"
	"k8s.io/kubernetes/pkg/kubelet/config"
	"k8s.io/kubernetes/pkg/kubelet/pluginmanager"
)

type event struct {
	Event    string   `json:"event"`
	Name     string   `json:"name,omitempty"`
	Endpoint string   `json:"endpoint,omitempty"`
	Versions []string `json:"versions,omitempty"`
	Dir      string   `json:"dir,omitempty"`
	Rejected bool     `json:"rejected,omitempty"`
	Error    string   `json:"error,omitempty"`
}

type emitter struct {
	mu sync.Mutex
	w  *bufio.Writer
}

func (e *emitter) emit(ev event) {
	if ev.Versions == nil && (ev.Event == "validate" || ev.Event == "register") {
		ev.Versions = []string{}
	}
	b, err := json.Marshal(ev)
	if err != nil {
		klog.ErrorS(err, "marshal event")
		return
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	_, _ = e.w.Write(append(b, '\n'))
	_ = e.w.Flush()
}

// csiHandler implements cache.PluginHandler for plugin type CSIPlugin.
type csiHandler struct {
	out                *emitter
	rejectValidation   bool
	rejectRegistration bool
}

func (h *csiHandler) ValidatePlugin(pluginName string, endpoint string, versions []string) error {
	ev := event{Event: "validate", Name: pluginName, Endpoint: endpoint, Versions: versions}
	var err error
	if h.rejectValidation {
		err = errors.New("validation rejected by kubelet-plugin-harness (--reject-validation)")
		ev.Rejected, ev.Error = true, err.Error()
	}
	h.out.emit(ev)
	return err
}

func (h *csiHandler) RegisterPlugin(pluginName, endpoint string, versions []string, _ *time.Duration) error {
	ev := event{Event: "register", Name: pluginName, Endpoint: endpoint, Versions: versions}
	var err error
	if h.rejectRegistration {
		err = errors.New("registration rejected by kubelet-plugin-harness (--reject-registration)")
		ev.Rejected, ev.Error = true, err.Error()
	}
	h.out.emit(ev)
	return err
}

func (h *csiHandler) DeRegisterPlugin(pluginName, endpoint string) {
	h.out.emit(event{Event: "deregister", Name: pluginName, Endpoint: endpoint})
}

func main() {
	klog.InitFlags(nil)
	dir := flag.String("dir", "", "plugin registration directory to watch (required)")
	rejectValidation := flag.Bool("reject-validation", false, "make ValidatePlugin fail")
	rejectRegistration := flag.Bool("reject-registration", false, "make RegisterPlugin fail")
	flag.Parse()
	if *dir == "" || flag.NArg() > 0 {
		fmt.Fprintln(os.Stderr, "usage: kubelet-plugin-harness --dir DIR [--reject-validation] [--reject-registration]")
		os.Exit(2)
	}
	if err := os.MkdirAll(*dir, 0o755); err != nil {
		fmt.Fprintf(os.Stderr, "kubelet-plugin-harness: %v\n", err)
		os.Exit(1)
	}

	out := &emitter{w: bufio.NewWriter(os.Stdout)}
	pm := pluginmanager.NewPluginManager(*dir, &record.FakeRecorder{})
	pm.AddHandler(registerapi.CSIPlugin, &csiHandler{
		out:                out,
		rejectValidation:   *rejectValidation,
		rejectRegistration: *rejectRegistration,
	})

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	stopCh := make(chan struct{})
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT)

	finished := make(chan struct{})
	sourcesReady := config.NewSourcesReady(func(_ sets.Set[string]) bool { return true })
	out.emit(event{Event: "started", Dir: *dir})
	go func() {
		defer close(finished)
		pm.Run(ctx, sourcesReady, stopCh)
	}()

	select {
	case s := <-sigs:
		klog.InfoS("Received signal, stopping", "signal", s.String())
	case <-finished:
		// Run only returns early when the plugin watcher fails to start.
		fmt.Fprintln(os.Stderr, "kubelet-plugin-harness: plugin manager stopped unexpectedly")
		os.Exit(1)
	}
	close(stopCh)
	cancel()
	select {
	case <-finished:
	case <-time.After(2 * time.Second):
	}
	out.emit(event{Event: "stopped"})
	klog.Flush()
}
