// Command benchrlsbare is the gRPC baseline of scripts/bench-edge.sh: a
// grpc-go server of Envoy's rate limit service
// (envoy.service.ratelimit.v3.RateLimitService) that answers OVERALL_OK to
// every call without looking at it, so that a rate limit service's CPU per
// call can be read against what gRPC alone costs.
package main

import (
	"context"
	"flag"
	"fmt"
	"net"
	"os"

	rlspb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
)

type okServer struct {
	rlspb.UnimplementedRateLimitServiceServer
	ok *rlspb.RateLimitResponse
}

func (s *okServer) ShouldRateLimit(context.Context, *rlspb.RateLimitRequest) (*rlspb.RateLimitResponse, error) {
	return s.ok, nil
}

func main() {
	listen := flag.String("listen", "127.0.0.1:8091", "address to serve gRPC on")
	flag.Parse()
	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		fmt.Fprintln(os.Stderr, "benchrlsbare:", err)
		os.Exit(1)
	}
	srv := grpc.NewServer()
	rlspb.RegisterRateLimitServiceServer(srv, &okServer{ok: &rlspb.RateLimitResponse{OverallCode: rlspb.RateLimitResponse_OK}})
	if err := srv.Serve(ln); err != nil {
		fmt.Fprintln(os.Stderr, "benchrlsbare:", err)
		os.Exit(1)
	}
}
