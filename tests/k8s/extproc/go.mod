// The stand-in for Envoy in front of the endpoint picker (main.go), built from Envoy's own
// ext_proc protos at the release the picker v1.5.0 builds with.
module snooze.dev/tests/k8s/extproc

go 1.25.0

require (
	github.com/envoyproxy/go-control-plane/envoy v1.37.0
	google.golang.org/grpc v1.78.0
)

require (
	github.com/cncf/xds/go v0.0.0-20251110193048-8bfbf64dc13e // indirect
	github.com/envoyproxy/protoc-gen-validate v1.3.0 // indirect
	github.com/planetscale/vtprotobuf v0.6.1-0.20240319094008-0393e58bdf10 // indirect
	golang.org/x/net v0.47.0 // indirect
	golang.org/x/sys v0.38.0 // indirect
	golang.org/x/text v0.31.0 // indirect
	google.golang.org/genproto/googleapis/rpc v0.0.0-20251029180050-ab9386a59fda // indirect
	google.golang.org/protobuf v1.36.11 // indirect
)
