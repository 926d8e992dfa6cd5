package ctl

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"syscall"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	agentv1 "github.com/vhostmq/vhostmq/dataplane/api/v1"
)

// conn is the client side of the agent's API socket. It remembers the
// last dial error so that a request failing with Unavailable can be told
// apart: no agent at the socket (exit 3) or the agent saying Unavailable
// (exit 1).
type conn struct {
	socket string
	cc     *grpc.ClientConn
	agent  agentv1.AgentClient

	mu      sync.Mutex
	dialErr error // of the last dial; nil after a successful one
}

func dial(socket string) (*conn, error) {
	c := &conn{socket: socket}
	cc, err := grpc.NewClient("unix://"+socket,
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithContextDialer(c.dialUnix))
	if err != nil {
		return nil, fmt.Errorf("agent API socket %s: %w", socket, err)
	}
	c.cc, c.agent = cc, agentv1.NewAgentClient(cc)
	return c, nil
}

// dialUnix dials the socket. (gRPC passes custom dialers the target,
// "unix:///path", not the path.)
func (c *conn) dialUnix(ctx context.Context, _ string) (net.Conn, error) {
	var d net.Dialer
	nc, err := d.DialContext(ctx, "unix", c.socket)
	c.mu.Lock()
	c.dialErr = err
	c.mu.Unlock()
	return nc, err
}

func (c *conn) close() { c.cc.Close() }

// agent returns the API client, connecting on first use.
func (c *cli) agent() (agentv1.AgentClient, error) {
	if c.conn == nil {
		cn, err := dial(c.socket)
		if err != nil {
			return nil, err
		}
		c.conn = cn
	}
	return c.conn.agent, nil
}

// call runs one request under --timeout and turns its error into one
// vhostmqctl reports.
// rpc is a method expression such as agentv1.AgentClient.ListPorts.
func call[Req, Resp any](ctx context.Context, c *cli, rpc func(agentv1.AgentClient, context.Context, Req, ...grpc.CallOption) (Resp, error), req Req) (Resp, error) {
	var zero Resp
	agent, err := c.agent()
	if err != nil {
		return zero, err
	}
	rctx, cancel := c.requestContext(ctx)
	defer cancel()
	resp, err := rpc(agent, rctx, req)
	if err != nil {
		// The agent gets the deadline too, and may report it first.
		if ctx.Err() == nil && c.timeout > 0 && (errors.Is(rctx.Err(), context.DeadlineExceeded) || status.Code(err) == codes.DeadlineExceeded) {
			return zero, c.timeoutError()
		}
		return zero, c.rpcError(ctx, err)
	}
	return resp, nil
}

func (c *cli) requestContext(ctx context.Context) (context.Context, context.CancelFunc) {
	if c.timeout <= 0 {
		return context.WithCancel(ctx)
	}
	return context.WithTimeout(ctx, c.timeout)
}

// rpcError converts a gRPC error; ctx is the command's (not the request's)
// context.
func (c *cli) rpcError(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return ctx.Err()
	}
	st, ok := status.FromError(err)
	if !ok {
		return err
	}
	switch st.Code() {
	case codes.Unavailable:
		c.conn.mu.Lock()
		dialErr := c.conn.dialErr
		c.conn.mu.Unlock()
		if dialErr != nil {
			return &unreachableError{socket: c.socket, err: dialErr}
		}
	}
	return &statusError{st}
}

// timeoutError: --timeout passed before the agent answered.
func (c *cli) timeoutError() error {
	return fmt.Errorf("DeadlineExceeded: no answer from the agent at %s within %s (--timeout)", c.socket, c.timeout)
}

// statusError prints a gRPC status as "Code: message".
type statusError struct{ st *status.Status }

func (e *statusError) Error() string { return e.st.Code().String() + ": " + e.st.Message() }

// GRPCStatus lets status.FromError see through.
func (e *statusError) GRPCStatus() *status.Status { return e.st }

// unreachableError: nothing answers at the API socket (exit 3).
type unreachableError struct {
	socket string
	err    error
}

func (e *unreachableError) Error() string {
	why := e.err.Error()
	switch {
	case errors.Is(e.err, syscall.ENOENT):
		why = "the socket does not exist"
	case errors.Is(e.err, syscall.ECONNREFUSED):
		why = "connection refused (nothing listens: is the socket stale?)"
	case errors.Is(e.err, syscall.EACCES), errors.Is(e.err, syscall.EPERM):
		why = "permission denied"
	case errors.Is(e.err, syscall.ENOTDIR):
		why = "a component of the path is not a directory"
	}
	return fmt.Sprintf("cannot reach the agent at %s: %s", e.socket, why)
}

func (e *unreachableError) Unwrap() error { return e.err }

func (e *unreachableError) hint() string {
	if errors.Is(e.err, syscall.EACCES) || errors.Is(e.err, syscall.EPERM) {
		return "The API socket is for root: run " + prog + " as root (sudo), or point at another socket with --socket PATH."
	}
	return "Is the vhostmq agent running on this node? If its API socket is elsewhere, use --socket PATH or " + EnvSocket + "."
}
