package main

// The gRPC plumbing: the codec, the host's proof checked before a payload is decoded,
// and the dispatch to the service.
//
// grpc-go decodes a unary request before any unary interceptor runs, and a stream's
// RecvMsg answers a decoding failure itself (INTERNAL) before the handler sees it. So the
// service is not registered with the generated descriptor: every call reaches one stream
// handler (grpc.UnknownServiceHandler), which checks the proof in the call's metadata
// first, only then reads the request message as raw bytes (the codec defers decoding)
// and decodes it, a payload that is not protobuf being the caller's error
// (INVALID_ARGUMENT), and calls the service through the generated PluginServiceServer
// interface.

import (
	"context"
	"crypto/subtle"
	"fmt"
	"io"
	"strings"

	pluginv1 "runtimecontract/proto/plugin/v1"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
)

const serviceName = "plugin.v1.PluginService"

// rawMessage is a request message as it arrived, decoded by the handler.
type rawMessage struct {
	data []byte
}

// codec is the "proto" codec on the protobuf API v2 (grpc-go 1.33's own is on API v1);
// a request read into a rawMessage is kept undecoded.
type codec struct{}

func (codec) Marshal(v interface{}) ([]byte, error) {
	m, ok := v.(proto.Message)
	if !ok {
		return nil, fmt.Errorf("not a protobuf message: %T", v)
	}
	return proto.Marshal(m)
}

func (codec) Unmarshal(data []byte, v interface{}) error {
	if raw, ok := v.(*rawMessage); ok {
		raw.data = append([]byte(nil), data...)
		return nil
	}
	m, ok := v.(proto.Message)
	if !ok {
		return fmt.Errorf("not a protobuf message: %T", v)
	}
	return proto.Unmarshal(data, m)
}

func (codec) Name() string { return "proto" }

func init() {
	// Replaces grpc-go's codec of the same name (registered by its own init, which runs
	// first).
	encoding.RegisterCodec(codec{})
}

// bearerCredential is the credential of a `Bearer` authorization value (the scheme in
// any letter case, then one or more spaces), as the Rust SDK reads it
// (impl/src/wire/bearer.rs).
func bearerCredential(value string) (string, bool) {
	const scheme = "bearer"
	if len(value) < len(scheme) || !strings.EqualFold(value[:len(scheme)], scheme) {
		return "", false
	}
	rest := value[len(scheme):]
	credential := strings.TrimLeft(rest, " ")
	if len(credential) == len(rest) || credential == "" {
		return "", false
	}
	return credential, true
}

// checkProof refuses a call without this launch's host proof.
func checkProof(ctx context.Context, proof string) error {
	md, _ := metadata.FromIncomingContext(ctx)
	var presented string
	ok := false
	if values := md.Get(authMetadata); len(values) > 0 {
		presented, ok = bearerCredential(values[0])
	}
	if !ok {
		return status.Error(codes.Unauthenticated,
			"proof_missing: the call carries no host proof (`authorization: Bearer <proof>`)")
	}
	if subtle.ConstantTimeCompare([]byte(presented), []byte(proof)) != 1 {
		return status.Error(codes.Unauthenticated,
			"proof_mismatch: the call's host proof is not this launch's")
	}
	return nil
}

// receive reads the call's request message and decodes it. A message over the bound is
// refused by grpc-go (RESOURCE_EXHAUSTED) as it arrives; one that is not protobuf is the
// caller's error (INVALID_ARGUMENT).
func receive(stream grpc.ServerStream, m proto.Message) error {
	var raw rawMessage
	if err := stream.RecvMsg(&raw); err != nil {
		if err == io.EOF {
			return status.Error(codes.InvalidArgument, "the call carries no request message")
		}
		return err
	}
	if err := proto.Unmarshal(raw.data, m); err != nil {
		return status.Error(codes.InvalidArgument, "failed to decode Protobuf message: "+err.Error())
	}
	return nil
}

// unary serves a unary method over the call's stream: one request, one response.
func unary(stream grpc.ServerStream, request proto.Message, serve func() (proto.Message, error)) error {
	if err := receive(stream, request); err != nil {
		return err
	}
	response, err := serve()
	if err != nil {
		return err
	}
	return stream.SendMsg(response)
}

// executeServer is the generated PluginService_ExecuteServer over the call's stream.
type executeServer struct {
	grpc.ServerStream
}

func (x executeServer) Send(m *pluginv1.ExecuteResponse) error {
	return x.ServerStream.SendMsg(m)
}

// handler is the server's one stream handler (grpc.UnknownServiceHandler).
func handler(srv pluginv1.PluginServiceServer, proof string) grpc.StreamHandler {
	prefix := "/" + serviceName + "/"
	return func(_ interface{}, stream grpc.ServerStream) error {
		method, _ := grpc.MethodFromServerStream(stream)
		if !strings.HasPrefix(method, prefix) {
			return status.Errorf(codes.Unimplemented, "unknown service %s", strings.TrimPrefix(method, "/"))
		}
		ctx := stream.Context()
		// Before anything of the call is read or decoded.
		if err := checkProof(ctx, proof); err != nil {
			return err
		}
		switch name := strings.TrimPrefix(method, prefix); name {
		case "Initialize":
			request := &pluginv1.InitializeRequest{}
			return unary(stream, request, func() (proto.Message, error) { return srv.Initialize(ctx, request) })
		case "ListTools":
			request := &pluginv1.ListToolsRequest{}
			return unary(stream, request, func() (proto.Message, error) { return srv.ListTools(ctx, request) })
		case "Cancel":
			request := &pluginv1.CancelRequest{}
			return unary(stream, request, func() (proto.Message, error) { return srv.Cancel(ctx, request) })
		case "Drain":
			request := &pluginv1.DrainRequest{}
			return unary(stream, request, func() (proto.Message, error) { return srv.Drain(ctx, request) })
		case "Execute":
			request := &pluginv1.ExecuteRequest{}
			if err := receive(stream, request); err != nil {
				return err
			}
			return srv.Execute(request, executeServer{stream})
		default:
			return status.Errorf(codes.Unimplemented, "unknown method %s for service %s", name, serviceName)
		}
	}
}
