// Package grpcecho is a gRPC service that echoes raw bytes, with no
// generated code: a codec that passes a Frame's bytes through, and a
// hand-written service description. rsock's tests and `goverbs sock
// bench` run it over rsock and over TCP.
package grpcecho

import (
	"context"
	"fmt"

	"google.golang.org/grpc"
)

// Frame is a request or reply: raw bytes.
type Frame struct{ B []byte }

// Codec marshals a *Frame as its bytes.
type Codec struct{}

// Name names the codec in the content type.
func (Codec) Name() string { return "goverbs-raw" }

// Marshal returns the frame's bytes.
func (Codec) Marshal(v any) ([]byte, error) {
	f, ok := v.(*Frame)
	if !ok {
		return nil, fmt.Errorf("grpcecho: cannot marshal %T, only *Frame", v)
	}
	return f.B, nil
}

// Unmarshal copies data into the frame, reusing its buffer.
func (Codec) Unmarshal(data []byte, v any) error {
	f, ok := v.(*Frame)
	if !ok {
		return fmt.Errorf("grpcecho: cannot unmarshal into %T, only *Frame", v)
	}
	f.B = append(f.B[:0], data...)
	return nil
}

// Method is the full name of the echo method.
const Method = "/goverbs.Echo/Echo"

var desc = grpc.ServiceDesc{
	ServiceName: "goverbs.Echo",
	HandlerType: (*any)(nil),
	Methods: []grpc.MethodDesc{{
		MethodName: "Echo",
		Handler: func(_ any, ctx context.Context, dec func(any) error, icp grpc.UnaryServerInterceptor) (any, error) {
			in := new(Frame)
			if err := dec(in); err != nil {
				return nil, err
			}
			return in, nil
		},
	}},
}

// NewServer returns a gRPC server with the echo service and the codec.
func NewServer(opts ...grpc.ServerOption) *grpc.Server {
	s := grpc.NewServer(append([]grpc.ServerOption{grpc.ForceServerCodec(Codec{})}, opts...)...)
	var impl any = struct{}{}
	s.RegisterService(&desc, impl)
	return s
}

// Call sends req and puts the echo in resp.
func Call(ctx context.Context, cc grpc.ClientConnInterface, req, resp *Frame) error {
	return cc.Invoke(ctx, Method, req, resp, grpc.ForceCodec(Codec{}))
}
