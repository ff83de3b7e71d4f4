// Command csi-mock-driver serves Kubernetes' own e2e CSI mock driver
// (k8s.io/kubernetes/test/e2e/storage/drivers/csi-test/mock/service, the
// successor of the csi-test mock driver) on a unix socket, so that the
// csi-sidecar integration tests have a real CSI implementation to talk to.
//
// Flags:
//
//	--endpoint PATH|unix://PATH   socket to listen on (a stale socket is removed
//	                              first; the socket is removed on SIGTERM/SIGINT)
//	--name NAME                   driver name returned by GetPluginInfo
//	                              (default io.kubernetes.storage.mock)
//	--node-id ID                  node ID reported by NodeGetInfo and accepted by
//	                              ControllerPublish/ControllerUnpublishVolume
//	                              (default: the driver name, see below)
//	--disable-attach              no PUBLISH_UNPUBLISH_VOLUME capability;
//	                              ControllerPublish/Unpublish return Unimplemented
//	--enable-topology             VOLUME_ACCESSIBILITY_CONSTRAINTS plugin capability
//	--topology-value VALUE        with --enable-topology: the value of the mock's
//	                              topology segment in NodeGetInfo and in created
//	                              volumes (default: upstream's some-mock-node), so
//	                              that drivers on several nodes differ
//	--attach-limit N              NodeGetInfo.max_volumes_per_node and the number of
//	                              volumes ControllerPublish accepts (0 = no limit)
//	--verbose                     also log requests and responses as JSON
//	--adopt-volumes               calls on a volume another instance created adopt
//	                              it (see below)
//	--data-dir DIR                volumes keep data: directories under DIR,
//	                              copied for snapshots, restores and clones,
//	                              bind-mounted on publish (data.go; needs root)
//
// Every call is logged as one line on stderr:
//
//	csi-mock-driver: /csi.v1.Controller/CreateVolume -> OK (12µs)
//
// Behaviour of the upstream mock service that callers must know:
//
//   - Node ID: the mock service has no node-ID setting; internally its node ID is
//     always the driver name (service.New sets nodeID = Config.DriverName), so
//     upstream NodeGetInfo reports the driver name and ControllerPublish only
//     accepts the driver name. This program translates: NodeGetInfo reports
//     --node-id, ControllerPublish/Unpublish accept only --node-id (any other
//     node ID, the driver name included when it differs, gets NotFound "Not
//     matching Node ID ..."), and published_node_ids in ListVolumes and
//     ControllerGetVolume report --node-id. Without --node-id the node ID is the
//     driver name, exactly as upstream.
//   - ControllerUnpublishVolume with an empty node_id is treated as "this node"
//     (the CSI spec says an empty node ID means all nodes; upstream rejects it).
//   - published_node_ids: upstream lists every volume as published on its node
//     whenever attach is enabled; this program reports the node only for volumes
//     that are really ControllerPublished. The mock keeps its bookkeeping in the
//     volume context ("<driver name>/dev", "<driver name>/<path>", "readonly");
//     those keys are removed from CreateVolume, ListVolumes and
//     ControllerGetVolume responses, so volume_context is {"name": <volume name>}.
//   - MODIFY_VOLUME is advertised but ControllerModifyVolume is a no-op.
//   - With --disable-online-expansion, ControllerExpandVolume fails with
//     FailedPrecondition while the volume is ControllerPublished; upstream never
//     clears that mark, this program clears it on ControllerUnpublishVolume.
//   - The service starts with three volumes ("Mock Volume 1..3", IDs 1-3,
//     100 GiB) and three snapshots; created volumes get IDs 4, 5, ...
//     CreateVolume without a capacity range gives 100 GiB; >= 1 TiB is OutOfRange.
//   - With --enable-topology volumes and NodeGetInfo carry the segment
//     io.kubernetes.storage.mock/node=some-mock-node (the key is derived from the
//     constant name io.kubernetes.storage.mock, not from --name).
//   - Adopted volumes (--adopt-volumes): instances of the driver do not share
//     their in-memory volumes (one in a controller pod and one in a node pod as
//     a chart deploys them, or a controller pod and its replacement), so one
//     would answer NotFound for the volumes another created. With
//     --adopt-volumes an instance's volume IDs carry a random per-process prefix
//     ("<8 hex digits>-<n>", unique across restarts), and a call naming a volume
//     ID of another instance adopts it: the service gets a volume of its own
//     named "adopted-<ID>" (once; CreateVolume is idempotent by name) and the
//     call is served on it, while callers keep seeing the ID they gave.
//   - All state is in memory and lost on exit. Calls are served one at a time
//     (the upstream service shares maps between its state and its responses,
//     which would race under concurrent calls).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"os/signal"
	"path"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/protoadapt"

	"k8s.io/kubernetes/test/e2e/storage/drivers/csi-test/mock/service"
)

const prog = "csi-mock-driver"

func logf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, prog+": "+format+"\n", args...)
}

// socketPath turns "unix:///a/b", "unix:/a/b", "unix://a/b" or "/a/b" into a path.
func socketPath(endpoint string) (string, error) {
	p := endpoint
	switch {
	case strings.HasPrefix(p, "unix://"):
		p = strings.TrimPrefix(p, "unix://")
	case strings.HasPrefix(p, "unix:"):
		p = strings.TrimPrefix(p, "unix:")
	case strings.Contains(p, "://"):
		return "", fmt.Errorf("unsupported endpoint %q: only unix sockets are supported", endpoint)
	}
	if p == "" {
		return "", errors.New("empty --endpoint")
	}
	return p, nil
}

// translator maps between the node ID the mock service uses internally (its
// driver name) and the node ID given with --node-id, and serializes calls.
type translator struct {
	mu       sync.Mutex
	internal string // what the mock service uses: the driver name
	external string // what callers see: --node-id
	verbose  bool
	topology string // --topology-value: replaces service.TopologyValue in responses
	// --adopt-volumes: volume IDs are "<instance>-<n>"; IDs of other
	// instances are adopted (adopted: theirs -> ours, adoptedBy: the reverse).
	adopter   service.Service
	instance  string
	adopted   map[string]string
	adoptedBy map[string]string
	ephemeral map[string]bool // inline ephemeral volume IDs published here
	// --data-dir: volumes and snapshots as directories (data.go).
	data *dataDir
}

// importID turns a caller's volume ID into the service's (--adopt-volumes):
// this instance's own IDs lose their prefix; any other ID is adopted: the
// service gets a volume named "adopted-<ID>" (idempotent by name) once.
func (t *translator) importID(ctx context.Context, id *string) error {
	if t.adopter == nil || *id == "" {
		return nil
	}
	if own, ok := strings.CutPrefix(*id, t.instance+"-"); ok {
		*id = own
		return nil
	}
	if local, ok := t.adopted[*id]; ok {
		*id = local
		return nil
	}
	mount := &csi.VolumeCapability{
		AccessType: &csi.VolumeCapability_Mount{Mount: &csi.VolumeCapability_MountVolume{}},
		AccessMode: &csi.VolumeCapability_AccessMode{Mode: csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER},
	}
	resp, err := t.adopter.CreateVolume(ctx, &csi.CreateVolumeRequest{
		Name:               "adopted-" + *id,
		VolumeCapabilities: []*csi.VolumeCapability{mount},
	})
	if err != nil {
		return status.Errorf(codes.Internal, "adopting volume %s: %v", *id, err)
	}
	local := resp.GetVolume().GetVolumeId()
	logf("adopted volume %s as %s", *id, local)
	t.adopted[*id] = local
	t.adoptedBy[local] = *id
	*id = local
	return nil
}

// exportID turns the service's volume ID into the callers' (--adopt-volumes).
func (t *translator) exportID(id *string) {
	if t.adopter == nil || *id == "" {
		return
	}
	if theirs, ok := t.adoptedBy[*id]; ok {
		*id = theirs
		return
	}
	*id = t.instance + "-" + *id
}

// importIDs applies importID to every request that names a volume, but an
// inline ephemeral volume's: the kubelet names those, and the mock service
// keeps them apart from the volumes it created (adopting one would make the
// service refuse its publish with AlreadyExists).
func (t *translator) importIDs(ctx context.Context, req any) error {
	switch r := req.(type) {
	case *csi.NodePublishVolumeRequest:
		if r.GetVolumeContext()[ephemeralKey] == "true" {
			t.ephemeral[r.VolumeId] = true
			return nil
		}
	case *csi.NodeUnpublishVolumeRequest:
		if t.ephemeral[r.VolumeId] {
			delete(t.ephemeral, r.VolumeId)
			return nil
		}
	}
	var id *string
	switch r := req.(type) {
	case *csi.CreateVolumeRequest: // a clone's source
		if src := r.GetVolumeContentSource().GetVolume(); src != nil {
			id = &src.VolumeId
		}
	case *csi.CreateSnapshotRequest:
		id = &r.SourceVolumeId
	case *csi.DeleteVolumeRequest:
		id = &r.VolumeId
	case *csi.ControllerPublishVolumeRequest:
		id = &r.VolumeId
	case *csi.ControllerUnpublishVolumeRequest:
		id = &r.VolumeId
	case *csi.ControllerExpandVolumeRequest:
		id = &r.VolumeId
	case *csi.ControllerGetVolumeRequest:
		id = &r.VolumeId
	case *csi.ControllerModifyVolumeRequest:
		id = &r.VolumeId
	case *csi.ValidateVolumeCapabilitiesRequest:
		id = &r.VolumeId
	case *csi.NodeStageVolumeRequest:
		id = &r.VolumeId
	case *csi.NodeUnstageVolumeRequest:
		id = &r.VolumeId
	case *csi.NodePublishVolumeRequest:
		id = &r.VolumeId
	case *csi.NodeUnpublishVolumeRequest:
		id = &r.VolumeId
	case *csi.NodeGetVolumeStatsRequest:
		id = &r.VolumeId
	case *csi.NodeExpandVolumeRequest:
		id = &r.VolumeId
	}
	if id == nil {
		return nil
	}
	return t.importID(ctx, id)
}

// segment rewrites the mock's fixed topology value to --topology-value.
func (t *translator) segment(top *csi.Topology) {
	if top == nil || t.topology == "" {
		return
	}
	if top.Segments[service.TopologyKey] == service.TopologyValue {
		top.Segments[service.TopologyKey] = t.topology
	}
}

func (t *translator) volumeTopology(v *csi.Volume) {
	if v == nil {
		return
	}
	for _, top := range v.AccessibleTopology {
		t.segment(top)
	}
}

func (t *translator) translateRequest(req any) error {
	switch r := req.(type) {
	case *csi.ControllerPublishVolumeRequest:
		return t.mapNodeID(&r.NodeId, false)
	case *csi.ControllerUnpublishVolumeRequest:
		return t.mapNodeID(&r.NodeId, true)
	}
	return nil
}

func (t *translator) mapNodeID(id *string, emptyIsSelf bool) error {
	switch {
	case *id == "" && emptyIsSelf:
		*id = t.internal
	case *id == t.external:
		*id = t.internal
	case *id == "":
		return status.Error(codes.InvalidArgument, "Node ID cannot be empty")
	default:
		return status.Errorf(codes.NotFound, "Not matching Node ID %s to Mock Node ID %s", *id, t.external)
	}
	return nil
}

// cleanVolume removes the mock's bookkeeping keys ("<internal node ID>/...",
// "readonly") from a volume context in a response.
func (t *translator) cleanVolume(v *csi.Volume) {
	if v == nil {
		return
	}
	for k := range v.VolumeContext {
		if k == service.ReadOnlyKey || strings.HasPrefix(k, t.internal+"/") {
			delete(v.VolumeContext, k)
		}
	}
}

func (t *translator) published(v *csi.Volume) []string {
	if v != nil && v.GetVolumeContext()[path.Join(t.internal, "dev")] != "" {
		return []string{t.external}
	}
	return nil
}

func (t *translator) translateResponse(resp any) {
	switch r := resp.(type) {
	case *csi.NodeGetInfoResponse:
		if r.NodeId == t.internal {
			r.NodeId = t.external
		}
		t.segment(r.AccessibleTopology)
	case *csi.CreateVolumeResponse:
		t.cleanVolume(r.GetVolume())
		t.volumeTopology(r.GetVolume())
		if v := r.GetVolume(); v != nil {
			t.exportID(&v.VolumeId)
		}
	case *csi.ListVolumesResponse:
		for _, e := range r.GetEntries() {
			if e.Status != nil && e.Status.PublishedNodeIds != nil {
				e.Status.PublishedNodeIds = t.published(e.GetVolume())
			}
			t.cleanVolume(e.GetVolume())
			t.volumeTopology(e.GetVolume())
			if v := e.GetVolume(); v != nil {
				t.exportID(&v.VolumeId)
			}
		}
	case *csi.ControllerGetVolumeResponse:
		if r.Status != nil && r.Status.PublishedNodeIds != nil {
			r.Status.PublishedNodeIds = t.published(r.GetVolume())
		}
		t.cleanVolume(r.GetVolume())
		t.volumeTopology(r.GetVolume())
		if v := r.GetVolume(); v != nil {
			t.exportID(&v.VolumeId)
		}
	}
}

// The CSI spec module used by k8s.io/kubernetes (v1.9.0) is generated with the
// old github.com/golang/protobuf API (proto "v1" messages); adapt both kinds.
func asV2(m any) (proto.Message, bool) {
	switch x := m.(type) {
	case proto.Message:
		return x, x != nil
	case protoadapt.MessageV1:
		if x == nil {
			return nil, false
		}
		return protoadapt.MessageV2Of(x), true
	}
	return nil, false
}

// deepCopy returns a deep copy of a protobuf message with the same Go type.
func deepCopy(m any) any {
	switch x := m.(type) {
	case proto.Message:
		return proto.Clone(x)
	case protoadapt.MessageV1:
		return protoadapt.MessageV1Of(proto.Clone(protoadapt.MessageV2Of(x)))
	}
	return m
}

func toJSON(m any) string {
	if pm, ok := asV2(m); ok {
		if b, err := protojson.Marshal(pm); err == nil {
			return string(b)
		}
	}
	return fmt.Sprintf("%v", m)
}

func (t *translator) intercept(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	start := time.Now()
	var reqJSON string
	if t.verbose {
		reqJSON = toJSON(req) // before the node ID translation
	}
	resp, err := t.call(ctx, req, handler)
	logf("%s -> %s (%s)", info.FullMethod, status.Code(err), time.Since(start).Round(time.Microsecond))
	if err != nil {
		logf("  error: %s", status.Convert(err).Message())
	}
	if t.verbose {
		logf("  request: %s", reqJSON)
		if err == nil {
			logf("  response: %s", toJSON(resp))
		}
	}
	return resp, err
}

func (t *translator) call(ctx context.Context, req any, handler grpc.UnaryHandler) (any, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	var asCalled any // the request with the callers' IDs, for the data
	if t.data != nil {
		if err := t.data.before(req); err != nil {
			return nil, err
		}
		asCalled = deepCopy(req)
	}
	if err := t.translateRequest(req); err != nil {
		return nil, err
	}
	// The caller's content source, as named (the mock answers with its own
	// slice index instead of the source's ID).
	var asked *csi.VolumeContentSource
	if r, ok := req.(*csi.CreateVolumeRequest); ok && r.VolumeContentSource != nil {
		asked = deepCopy(r.VolumeContentSource).(*csi.VolumeContentSource)
	}
	if err := t.importIDs(ctx, req); err != nil {
		return nil, err
	}
	resp, err := handler(ctx, req)
	if err != nil {
		return nil, err
	}
	// The mock service marks a volume published on ControllerPublish but
	// never unmarks it, so with --disable-online-expansion a volume once
	// attached could never be expanded again. Unmark it on unpublish.
	if r, ok := req.(*csi.ControllerUnpublishVolumeRequest); ok {
		if v, found := service.MockVolumes[r.VolumeId]; found {
			v.ISControllerPublished = false
			service.MockVolumes[r.VolumeId] = v
		}
	}
	// An instance that adopted a volume never published it, so the mock
	// service would leave the target path as it is; the instance that
	// published it would have removed it (--adopt-volumes).
	if r, ok := req.(*csi.NodeUnpublishVolumeRequest); ok && t.adopter != nil && r.TargetPath != "" {
		if err := os.RemoveAll(r.TargetPath); err != nil {
			return nil, status.Errorf(codes.Internal, "removing %s: %v", r.TargetPath, err)
		}
	}
	// Copy the response while holding the lock: the mock service returns
	// pointers into its own state (maps included).
	resp = deepCopy(resp)
	t.translateResponse(resp)
	if r, ok := resp.(*csi.CreateVolumeResponse); ok && asked != nil && r.GetVolume().GetContentSource() != nil {
		r.Volume.ContentSource = asked
	}
	if t.data != nil {
		if err := t.data.after(asCalled, resp); err != nil {
			return nil, err
		}
	}
	return resp, nil
}

func main() {
	var (
		endpoint                = flag.String("endpoint", "unix:///tmp/csi-mock.sock", "CSI endpoint: a unix socket path or unix:// URL")
		name                    = flag.String("name", service.Name, "CSI driver name")
		nodeID                  = flag.String("node-id", "", "node ID reported by NodeGetInfo and accepted by ControllerPublish (default: the driver name)")
		disableAttach           = flag.Bool("disable-attach", false, "disable ControllerPublish/Unpublish (no PUBLISH_UNPUBLISH_VOLUME capability)")
		enableTopology          = flag.Bool("enable-topology", false, "advertise VOLUME_ACCESSIBILITY_CONSTRAINTS")
		topologyValue           = flag.String("topology-value", "", "with --enable-topology: the topology segment's value (default: "+service.TopologyValue+")")
		attachLimit             = flag.Int64("attach-limit", 0, "max volumes per node (0 = unlimited)")
		nodeExpansionRequired   = flag.Bool("node-expand-required", false, "advertise the node EXPAND_VOLUME capability")
		disableCtrlExpansion    = flag.Bool("disable-controller-expansion", false, "do not advertise the controller EXPAND_VOLUME capability")
		disableOnlineExpansion  = flag.Bool("disable-online-expansion", false, "advertise OFFLINE instead of ONLINE volume expansion")
		permissiveTargetPath    = flag.Bool("permissive-target-path", false, "NodePublishVolume: accept an existing target path")
		nodeVolumeConditionReqd = flag.Bool("node-volume-condition", false, "advertise the node VOLUME_CONDITION capability")
		verbose                 = flag.Bool("verbose", false, "log requests and responses as JSON")
		adoptVolumes            = flag.Bool("adopt-volumes", false, "calls on a volume another instance created adopt it (instances in a controller and a node pod)")
		dataDirPath             = flag.String("data-dir", "", "keep volume data: volumes and snapshots are directories here, published by bind mounts (data.go)")
	)
	flag.Parse()
	if flag.NArg() > 0 {
		logf("unexpected arguments: %v", flag.Args())
		os.Exit(2)
	}

	sock, err := socketPath(*endpoint)
	if err != nil {
		logf("%v", err)
		os.Exit(2)
	}
	if *nodeID == "" {
		*nodeID = *name
	}

	svc := service.New(service.Config{
		DriverName:                  *name,
		DisableAttach:               *disableAttach,
		EnableTopology:              *enableTopology,
		AttachLimit:                 *attachLimit,
		NodeExpansionRequired:       *nodeExpansionRequired,
		DisableControllerExpansion:  *disableCtrlExpansion,
		DisableOnlineExpansion:      *disableOnlineExpansion,
		PermissiveTargetPath:        *permissiveTargetPath,
		NodeVolumeConditionRequired: *nodeVolumeConditionReqd,
	})

	if err := os.MkdirAll(filepath.Dir(sock), 0o755); err != nil {
		logf("creating socket directory: %v", err)
		os.Exit(1)
	}
	if fi, err := os.Lstat(sock); err == nil {
		if fi.IsDir() {
			logf("endpoint %s is a directory", sock)
			os.Exit(1)
		}
		if err := os.Remove(sock); err != nil {
			logf("removing stale socket: %v", err)
			os.Exit(1)
		}
	}
	lis, err := net.Listen("unix", sock)
	if err != nil {
		logf("listen: %v", err)
		os.Exit(1)
	}
	// We remove the socket ourselves on shutdown.
	if ul, ok := lis.(*net.UnixListener); ok {
		ul.SetUnlinkOnClose(false)
	}

	tr := &translator{internal: *name, external: *nodeID, verbose: *verbose, topology: *topologyValue, ephemeral: map[string]bool{}}
	if *adoptVolumes {
		tr.adopter = svc
		tr.instance = fmt.Sprintf("%08x", rand.Uint32())
		tr.adopted = map[string]string{}
		tr.adoptedBy = map[string]string{}
	}
	if *dataDirPath != "" {
		if tr.data, err = newDataDir(*dataDirPath); err != nil {
			logf("--data-dir: %v", err)
			os.Exit(1)
		}
	}
	srv := grpc.NewServer(grpc.UnaryInterceptor(tr.intercept))
	csi.RegisterIdentityServer(srv, svc)
	csi.RegisterControllerServer(srv, svc)
	csi.RegisterNodeServer(srv, svc)

	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT)
	done := make(chan struct{})
	go func() {
		s := <-sigs
		logf("received %s, shutting down", s)
		_ = os.Remove(sock)
		stopped := make(chan struct{})
		go func() { srv.GracefulStop(); close(stopped) }()
		select {
		case <-stopped:
		case <-time.After(2 * time.Second):
			srv.Stop()
		}
		close(done)
	}()

	logf("serving driver %q (node ID %q, attach=%t, topology=%t, attach-limit=%d) on %s",
		*name, *nodeID, !*disableAttach, *enableTopology, *attachLimit, sock)
	if err := srv.Serve(lis); err != nil {
		_ = os.Remove(sock)
		logf("serve: %v", err)
		os.Exit(1)
	}
	<-done
}
