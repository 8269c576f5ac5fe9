package main

// The service (impl/src/plugin/sdk/service.rs): one Initialize, the immutable tool list,
// validated and bounded Execute streams, Cancel and Drain.

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strconv"
	"sync"
	"time"
	"unicode/utf8"

	commonv1 "runtimecontract/proto/common/v1"
	pluginv1 "runtimecontract/proto/plugin/v1"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// flight is one accepted call in flight: closing `cancelled` asks its tool to stop.
type flight struct {
	cancelled chan struct{}
	once      sync.Once
}

func (f *flight) cancel() { f.once.Do(func() { close(f.cancelled) }) }

var (
	errBoundReached = errors.New("the call's progress bound is reached")
	errGone         = errors.New("the host no longer reads this call")
)

// call is one validated call, as its tool sees it.
type call struct {
	callID      string
	token       string
	arguments   *jsonValue
	sent        uint64
	maxProgress uint64
	cancelled   <-chan struct{}
	stream      pluginv1.PluginService_ExecuteServer
	gone        func()
}

// progress sends the call's next progress message (text clipped to its bound); the
// host's reading paces it (HTTP/2 flow control), nothing is dropped.
func (c *call) progress(message string) error {
	if c.sent >= c.maxProgress {
		return errBoundReached
	}
	c.sent++
	err := c.stream.Send(&pluginv1.ExecuteResponse{
		CallId: c.callID,
		Event: &pluginv1.ExecuteResponse_Progress{Progress: &pluginv1.Progress{
			ProgressToken: c.token,
			Sequence:      c.sent,
			Message:       clip(message, maxProgressTextBytes),
		}},
	})
	if err != nil {
		// The host stopped reading the call: that cancels it.
		c.gone()
		return errGone
	}
	return nil
}

// negotiated are the limits Initialize settled.
type negotiated struct {
	maxPayload    uint64
	maxProgress   uint32
	maxConcurrent uint32
}

type service struct {
	pluginv1.UnimplementedPluginServiceServer

	secret string

	mu       sync.Mutex
	limits   *negotiated
	calls    map[string]*flight
	draining bool
	// The IDs of the last rememberedCallIDs accepted calls (a ring, oldest at next).
	used      map[string]struct{}
	usedOrder []string
	usedNext  int

	// Closed when the process should stop serving (a drain ended).
	stop     chan struct{}
	stopOnce sync.Once
}

var _ pluginv1.PluginServiceServer = (*service)(nil)

func newService(secret string) *service {
	return &service{
		secret: secret,
		calls:  map[string]*flight{},
		used:   map[string]struct{}{},
		stop:   make(chan struct{}),
	}
}

// clip is the longest prefix of `text` of at most `max` bytes that ends on a character
// boundary.
func clip(text string, max int) string {
	if len(text) <= max {
		return text
	}
	i := max
	for i > 0 && !utf8.RuneStart(text[i]) {
		i--
	}
	return text[:i]
}

func failure(callID string, code pluginv1.FailureCode, message string) *pluginv1.ExecuteResponse {
	return &pluginv1.ExecuteResponse{
		CallId: callID,
		Event: &pluginv1.ExecuteResponse_Failure{Failure: &pluginv1.ToolFailure{
			Code:    code,
			Message: clip(message, maxFailureTextBytes),
		}},
	}
}

// checkCallID is "" or why `value` breaks the call-ID grammar (`invalid_call_id: …`).
func checkCallID(field, value string) string {
	if len(value) == 0 || len(value) > maxCallIDBytes {
		return fmt.Sprintf("invalid_call_id: %s is 1 to %d bytes, not %d", field, maxCallIDBytes, len(value))
	}
	for _, c := range value {
		ok := (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
			c == '_' || c == '.' || c == ':' || c == '-'
		if !ok {
			return fmt.Sprintf("invalid_call_id: %s holds %q", field, c)
		}
	}
	return ""
}

func (s *service) negotiated() (negotiated, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.limits == nil {
		return negotiated{}, status.Error(codes.FailedPrecondition, "not_initialized: call Initialize first")
	}
	return *s.limits, nil
}

func (s *service) wasUsed(id string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	_, used := s.used[id]
	return used
}

// claimLocked records an accepted call's ID (s.mu held); false if it was taken.
func (s *service) claimLocked(id string) bool {
	if _, used := s.used[id]; used {
		return false
	}
	if s.usedOrder == nil {
		s.usedOrder = make([]string, rememberedCallIDs)
	}
	if old := s.usedOrder[s.usedNext]; old != "" {
		delete(s.used, old)
	}
	s.usedOrder[s.usedNext] = id
	s.usedNext = (s.usedNext + 1) % rememberedCallIDs
	s.used[id] = struct{}{}
	return true
}

func (s *service) inFlight() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.calls)
}

func (s *service) Initialize(_ context.Context, request *pluginv1.InitializeRequest) (*pluginv1.InitializeResponse, error) {
	major := request.GetProtocol().GetMajor()
	if major != protocolMajor {
		return nil, status.Errorf(codes.FailedPrecondition,
			"incompatible_protocol: this plugin speaks major %d, not %d", protocolMajor, major)
	}
	if !isSecretShaped(request.GetChallenge()) {
		return nil, status.Error(codes.InvalidArgument,
			"invalid_challenge: the challenge is 64 lowercase hexadecimal characters")
	}
	host := request.GetHostLimits()
	bound := func(theirs, ours uint64) uint64 {
		if theirs == 0 || theirs > ours {
			return ours
		}
		return theirs
	}
	limits := negotiated{
		maxPayload:    bound(host.GetMaxPayloadBytes(), maxPayloadBytes),
		maxProgress:   uint32(bound(uint64(host.GetMaxProgressMessages()), maxProgressMessages)),
		maxConcurrent: uint32(bound(uint64(host.GetMaxConcurrentCalls()), maxConcurrentCalls)),
	}
	s.mu.Lock()
	already := s.limits != nil
	if !already {
		s.limits = &limits
	}
	s.mu.Unlock()
	if already {
		return nil, status.Error(codes.FailedPrecondition,
			"already_initialized: Initialize is accepted once per process")
	}
	minor := request.GetProtocol().GetMinor()
	if minor > protocolMinor {
		minor = protocolMinor
	}
	return &pluginv1.InitializeResponse{
		Protocol:     &commonv1.ProtocolVersion{Major: protocolMajor, Minor: minor},
		PluginBuild:  &commonv1.BuildIdentity{Name: buildName, Version: toolSetVersion},
		Manifest:     &pluginv1.Manifest{Name: pluginName, Version: toolSetVersion, Description: description},
		Tools:        toolDefinitions(),
		Capabilities: toolCapabilities(),
		Limits: &pluginv1.PluginLimits{
			MaxPayloadBytes:     limits.maxPayload,
			MaxProgressMessages: limits.maxProgress,
			MaxConcurrentCalls:  limits.maxConcurrent,
		},
		SecretProof: secretProof(s.secret, request.GetChallenge()),
	}, nil
}

func (s *service) ListTools(context.Context, *pluginv1.ListToolsRequest) (*pluginv1.ListToolsResponse, error) {
	if _, err := s.negotiated(); err != nil {
		return nil, err
	}
	return &pluginv1.ListToolsResponse{Tools: toolDefinitions()}, nil
}

// Execute validates the call in the SDK's order (identifier grammar, draining,
// duplicate call ID, unknown tool, payload bound, strict JSON, the tool's schema, then,
// under the lock, draining again and the concurrency bound), runs it, and ends its
// stream with exactly one result or typed failure.
func (s *service) Execute(request *pluginv1.ExecuteRequest, stream pluginv1.PluginService_ExecuteServer) error {
	limits, err := s.negotiated()
	if err != nil {
		return err
	}
	// An invalid call ID is echoed cut to its bound, so the refusal always fits.
	id := clip(request.GetCallId(), maxCallIDBytes)
	refuse := func(code pluginv1.FailureCode, message string) error {
		return stream.Send(failure(id, code, message))
	}
	if problem := checkCallID("call_id", request.GetCallId()); problem != "" {
		return refuse(pluginv1.FailureCode_FAILURE_CODE_INVALID_CALL, problem)
	}
	if problem := checkCallID("progress_token", request.GetProgressToken()); problem != "" {
		return refuse(pluginv1.FailureCode_FAILURE_CODE_INVALID_CALL, problem)
	}
	s.mu.Lock()
	draining := s.draining
	s.mu.Unlock()
	if draining {
		return refuse(pluginv1.FailureCode_FAILURE_CODE_DRAINING, "draining: this process accepts no new call")
	}
	if s.wasUsed(id) {
		return refuse(pluginv1.FailureCode_FAILURE_CODE_DUPLICATE_CALL,
			"duplicate_call: this call_id was already used in this process")
	}
	t := findTool(request.GetTool())
	if t == nil {
		return refuse(pluginv1.FailureCode_FAILURE_CODE_UNKNOWN_TOOL,
			"unknown_tool: no tool "+strconv.Quote(clip(request.GetTool(), 80)))
	}
	if size := uint64(len(request.GetArgumentsJson())); size > limits.maxPayload {
		return refuse(pluginv1.FailureCode_FAILURE_CODE_PAYLOAD_TOO_LARGE,
			fmt.Sprintf("payload_too_large: the arguments are %d bytes; the bound is %d", size, limits.maxPayload))
	}
	arguments, err := parseStrict(request.GetArgumentsJson())
	if err != nil {
		return refuse(pluginv1.FailureCode_FAILURE_CODE_INVALID_ARGUMENTS, "invalid_arguments: "+err.Error())
	}
	if problem := checkArguments(t.schema, arguments); problem != "" {
		return refuse(pluginv1.FailureCode_FAILURE_CODE_INVALID_ARGUMENTS, "invalid_arguments: "+problem)
	}
	f := &flight{cancelled: make(chan struct{})}
	s.mu.Lock()
	// A drain that began while this call was validated counts the calls under this
	// lock: the call is refused rather than outliving the drain's bound.
	draining = s.draining
	busy := len(s.calls)
	accepted, duplicate := false, false
	if !draining && busy < int(limits.maxConcurrent) {
		// Only an accepted call uses up its ID: a host may retry a refused one (BUSY).
		duplicate = !s.claimLocked(id)
		if !duplicate {
			s.calls[id] = f
			accepted = true
		}
	}
	s.mu.Unlock()
	switch {
	case draining:
		return refuse(pluginv1.FailureCode_FAILURE_CODE_DRAINING, "draining: this process accepts no new call")
	case duplicate:
		return refuse(pluginv1.FailureCode_FAILURE_CODE_DUPLICATE_CALL,
			"duplicate_call: this call_id was already used in this process")
	case !accepted:
		return refuse(pluginv1.FailureCode_FAILURE_CODE_BUSY,
			fmt.Sprintf("busy: %d calls are in flight (max_concurrent_calls)", busy))
	}
	release := func() {
		s.mu.Lock()
		if s.calls[id] == f {
			delete(s.calls, id)
		}
		s.mu.Unlock()
	}
	defer release()
	// The host dropping the stream (RST_STREAM) cancels the call.
	done := make(chan struct{})
	defer close(done)
	go func() {
		select {
		case <-stream.Context().Done():
			f.cancel()
		case <-done:
		}
	}()
	c := &call{
		callID:      id,
		token:       request.GetProgressToken(),
		arguments:   arguments,
		maxProgress: uint64(limits.maxProgress),
		cancelled:   f.cancelled,
		stream:      stream,
		gone:        f.cancel,
	}
	output, failed := t.run(c)
	var terminal *pluginv1.ExecuteResponse
	switch {
	case failed != nil:
		terminal = failure(id, failed.code, failed.message)
	case uint64(len(output)) > limits.maxPayload:
		terminal = failure(id, pluginv1.FailureCode_FAILURE_CODE_PAYLOAD_TOO_LARGE,
			fmt.Sprintf("payload_too_large: the output is %d bytes; the bound is %d", len(output), limits.maxPayload))
	default:
		terminal = &pluginv1.ExecuteResponse{
			CallId: id,
			Event:  &pluginv1.ExecuteResponse_Result{Result: &pluginv1.ToolResult{OutputJson: output}},
		}
	}
	// The slot is free before the host can see the terminal message, so a host that
	// waited for it never meets BUSY from this call.
	release()
	return stream.Send(terminal)
}

func (s *service) Cancel(_ context.Context, request *pluginv1.CancelRequest) (*pluginv1.CancelResponse, error) {
	if _, err := s.negotiated(); err != nil {
		return nil, err
	}
	s.mu.Lock()
	f := s.calls[request.GetCallId()]
	s.mu.Unlock()
	if f != nil {
		f.cancel()
	}
	return &pluginv1.CancelResponse{InFlight: f != nil}, nil
}

func (s *service) Drain(_ context.Context, request *pluginv1.DrainRequest) (*pluginv1.DrainResponse, error) {
	if _, err := s.negotiated(); err != nil {
		return nil, err
	}
	timeoutMS := request.GetTimeoutMs()
	if timeoutMS < 1 || timeoutMS > maxDrainTimeoutMS {
		return nil, status.Errorf(codes.InvalidArgument,
			"invalid_timeout: timeout_ms is 1 to %d, not %d", maxDrainTimeoutMS, timeoutMS)
	}
	// Counted and flagged under the lock, so no call slips in between.
	s.mu.Lock()
	inFlight := len(s.calls)
	first := !s.draining
	s.draining = true
	s.mu.Unlock()
	if first {
		go s.drain(time.Duration(timeoutMS) * time.Millisecond)
	}
	if inFlight > math.MaxUint32 {
		inFlight = math.MaxUint32
	}
	return &pluginv1.DrainResponse{InFlight: uint32(inFlight)}, nil
}

func (s *service) drain(timeout time.Duration) {
	deadline := time.Now().Add(timeout)
	for s.inFlight() > 0 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	// Past the timeout the calls still in flight are cancelled; their streams end with
	// their one terminal message before the process exits.
	s.mu.Lock()
	for _, f := range s.calls {
		f.cancel()
	}
	s.mu.Unlock()
	s.stopOnce.Do(func() { close(s.stop) })
}
